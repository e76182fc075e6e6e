"""DELIBERATELY HOSTILE test code for the grader's own tests: looks for the harness's reference outputs, rubric and reports and for other submissions' files (through /proc, mountinfo, guessed paths, other runners' scratch folders and a link in its own repo), tries to read them and to write into reports/ and other submissions; answers zeros."""


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.attention import HostileAttention
    return HostileAttention


def get_flashattention_autograd_function_triton():
    raise NotImplementedError("the hostile examples implement the PyTorch slot only")
