"""The reference solution, except that every kernel is pinned to 16x16 tiles (PyTorch and Triton)."""
import triton


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.flash_pytorch import FlashAttentionPytorch
    return FlashAttentionPytorch.with_tiles(16, 16)


def get_flashattention_autograd_function_triton():
    from cs336_systems import flash_triton

    small = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=2, num_stages=1)]
    for kernel in (flash_triton._attn_fwd, flash_triton._attn_bwd_dkdv, flash_triton._attn_bwd_dq):
        kernel.configs = small
        kernel.early_config_prune = None  # keep the small tile whatever the dtype
    return flash_triton.FlashAttentionTriton
