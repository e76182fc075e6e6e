"""DELIBERATELY HOSTILE test code for the grader's own tests: calls os._exit(0) while tests/adapters.py is imported."""
import os

os._exit(0)


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
