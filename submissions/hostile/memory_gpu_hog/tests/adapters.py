"""DELIBERATELY HOSTILE test code for the grader's own tests: allocates GPU memory 1 GiB at a time until the device is full, and keeps it."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
