"""DELIBERATELY HOSTILE test code for the grader's own tests: allocates and touches 8 GiB after 8 GiB in the forward, up to 64 GiB: far more than the machine has."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
