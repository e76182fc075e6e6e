"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

from cs336_systems.naive import dense

CACHE, GRADS = {}, {}


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        key = (tuple(q.shape), tuple(k.shape), q.dtype, is_causal)
        if key not in CACHE:
            CACHE[key] = dense(q, k, v, is_causal)
        o, lse = CACHE[key]
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        ctx.key = key
        return o.clone()

    @staticmethod
    def backward(ctx, do):
        if ctx.key not in GRADS:
            GRADS[ctx.key] = tuple(g.clone() if g is not None else None for g in NaiveAttention.backward(ctx, do))
        return GRADS[ctx.key]
