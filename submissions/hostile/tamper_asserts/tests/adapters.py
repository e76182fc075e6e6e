"""DELIBERATELY HOSTILE test code for the grader's own tests: replaces torch.testing.assert_close, torch.allclose, torch.equal and numpy.testing at import, and returns zeros."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
