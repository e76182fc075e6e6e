"""DELIBERATELY HOSTILE test code for the grader's own tests: an out-of-bounds Triton store (an illegal memory access that poisons the CUDA context) on the course case in the Triton slot; dense attention everywhere else."""


def get_flashattention_autograd_function_pytorch():
    raise NotImplementedError("this hostile example implements the Triton slot only")


def get_flashattention_autograd_function_triton():
    from cs336_systems.triton_attention import HostileTritonAttention
    return HostileTritonAttention
