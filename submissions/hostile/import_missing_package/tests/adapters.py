"""DELIBERATELY HOSTILE test code for the grader's own tests: imports a package that is not installed."""
import flash_attn_hostile_missing_pkg  # noqa: F401


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
