"""DELIBERATELY HOSTILE test code for the grader's own tests: patches time.perf_counter, time.monotonic, time.time, torch.cuda.Event.elapsed_time and torch.cuda.synchronize to fake speed, and forgets the 1/sqrt(d) scale."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
