"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import time

import torch

_fake = iter(range(10**12))
time.perf_counter = lambda: next(_fake) * 1e-9
time.monotonic = lambda: next(_fake) * 1e-9
time.time = lambda: next(_fake) * 1e-9
time.perf_counter_ns = lambda: next(_fake)
torch.cuda.Event.elapsed_time = lambda self, other: 1e-3
torch.cuda.synchronize = lambda *args, **kwargs: None


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        return NaiveAttention.forward(ctx, q * q.shape[-1] ** 0.5, k, v, is_causal)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
