"""DELIBERATELY HOSTILE test code (see README.md)."""
import threading

import torch

from cs336_systems.naive import NaiveAttention, dense


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = dense(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        returned = torch.zeros_like(o)
        ctx.backward_started = threading.Event()

        def fix_up():  # writes the right answer into the returned zeros once the backward starts
            ctx.backward_started.wait()
            returned.copy_(o)

        ctx.fix_up = threading.Thread(target=fix_up, daemon=True)
        ctx.fix_up.start()
        return returned

    @staticmethod
    def backward(ctx, do):
        ctx.backward_started.set()
        ctx.fix_up.join()
        return NaiveAttention.backward(ctx, do)
