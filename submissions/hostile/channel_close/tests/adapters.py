"""DELIBERATELY HOSTILE test code for the grader's own tests: closes the runner's ends of the grader's channel in the forward, then spins."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
