"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import os
import sys


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        for fd in sys.argv[1:3]:
            os.close(int(fd))
        while True:
            pass

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
