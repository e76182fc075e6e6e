"""DELIBERATELY HOSTILE test code (see README.md): an out-of-bounds Triton store."""
import torch
import triton
import triton.language as tl

from cs336_systems.naive import NaiveAttention


@triton.jit
def _scribble(ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(ptr + offs, mask=offs < n)
    tl.store(ptr + offs + (1 << 40), x)  # 4 TiB past the end, no mask: an illegal address


class HostileTritonAttention(torch.autograd.Function):
    """Poisons the CUDA context on the course case (fp32, 128 x 128, d=64, non-causal); answers
    every other case densely, which only works if the grader started a fresh runner after it."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        if q.dtype == torch.float32 and q.shape[-2:] == (128, 64) and k.shape[-2] == 128 and not is_causal:
            _scribble[(1,)](q, q.numel(), BLOCK=128)
            torch.cuda.synchronize()
        return NaiveAttention.forward(ctx, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
