"""DELIBERATELY HOSTILE test code for the grader's own tests: returns zeros from the forward and keeps a thread that writes the right output into them once the backward starts (the backward waits for it)."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
