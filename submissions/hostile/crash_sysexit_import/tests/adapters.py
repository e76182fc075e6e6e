"""DELIBERATELY HOSTILE test code for the grader's own tests: calls sys.exit(1) while tests/adapters.py is imported."""
import sys

sys.exit(1)


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
