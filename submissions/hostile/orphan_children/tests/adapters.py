"""DELIBERATELY HOSTILE test code for the grader's own tests: spawns child processes that outlive the call in every forward: a subprocess.Popen, a forked child and a double-forked setsid daemon (which leaves the process group)."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
