"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import sys


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        sys.exit(1)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
