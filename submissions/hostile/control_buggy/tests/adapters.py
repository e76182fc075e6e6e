"""DELIBERATELY HOSTILE test code for the grader's own tests: NOT hostile: an honest, buggy dense attention without the 1/sqrt(d) scale, graded alongside the hostile ones to show they leave its results unchanged."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
