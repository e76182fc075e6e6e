"""DELIBERATELY HOSTILE test code for the grader's own tests: the forward blocks inside a C call (libc sleep through ctypes), where no Python signal handler can run."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
