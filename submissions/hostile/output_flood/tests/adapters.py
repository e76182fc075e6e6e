"""DELIBERATELY HOSTILE test code for the grader's own tests: prints 20 MB to stdout and 20 MB to stderr in every forward, then answers densely."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
