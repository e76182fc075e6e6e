"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

HOARD = []


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        HOARD.extend(torch.empty(1 << 30, dtype=torch.uint8, device=q.device) for _ in range(1 << 20))
        return NaiveAttention.forward(ctx, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
