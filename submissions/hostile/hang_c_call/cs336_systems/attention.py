"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import ctypes


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        ctypes.CDLL(None).sleep(100000)
        return NaiveAttention.forward(ctx, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
