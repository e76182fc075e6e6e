"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention




class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        while True:
            pass

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
