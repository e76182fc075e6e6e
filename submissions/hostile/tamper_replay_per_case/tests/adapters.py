"""DELIBERATELY HOSTILE test code for the grader's own tests: caches the first outputs per case (shape, dtype and causal flag) and replays them for later inputs of that case."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
