"""DELIBERATELY HOSTILE test code for the grader's own tests: forges the runner's reply: finds the request's tag and exchange folder on the stack and answers 'ok' naming /etc/passwd (non-causal cases) or a link to /etc/shadow at the expected path (causal cases), then hangs."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
