"""DELIBERATELY HOSTILE test code for the grader's own tests: ships a conftest.py (root and tests/) that exits or skips the session, and a pytest.ini with options that would deselect every check; answers densely."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
