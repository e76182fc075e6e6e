"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import sys


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        line = 'x' * 1023 + '\n'
        sys.stdout.write(line * 20480)
        sys.stderr.write(line * 20480)
        print('HOSTILE-OUTPUT-FLOOD-END', flush=True)
        return NaiveAttention.forward(ctx, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
