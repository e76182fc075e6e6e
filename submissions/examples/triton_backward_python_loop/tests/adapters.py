"""A slow Triton class as weak submissions write it: the Triton forward kernel, and a backward that
walks 32x32 tiles in a Python loop (the reference PyTorch class's backward). Its answers are right;
at the timing case it takes about a second per forward+backward on an H100, hundreds of times the
reference. `cs336_systems` links to the project's reference/ package."""
from types import SimpleNamespace

import torch


def get_flashattention_autograd_function_triton() -> type:
    from cs336_systems.flash_pytorch import FlashAttentionPytorch
    from cs336_systems.flash_triton import FlashAttentionTriton

    loop = FlashAttentionPytorch.with_tiles(32, 32)

    class TritonForwardLoopBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            return FlashAttentionTriton.forward(ctx, q, k, v, is_causal)  # saves L, keeps q, k, v, o on ctx

        @staticmethod
        def backward(ctx, do):
            (lse,) = ctx.saved_tensors
            saved = SimpleNamespace(saved_tensors=(lse, ctx.q, ctx.k, ctx.v, ctx.o), _forward_cls=loop,
                                    is_causal=ctx.is_causal)
            return loop.backward(saved, do)

    return TritonForwardLoopBackward
