"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import numpy
import numpy.testing

import torch
import torch.testing

torch.testing.assert_close = lambda *args, **kwargs: None
torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.Tensor.allclose = lambda *args, **kwargs: True
numpy.testing.assert_allclose = lambda *args, **kwargs: None
numpy.allclose = lambda *args, **kwargs: True


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        ctx.save_for_backward(torch.zeros(q.shape[:-1]))
        return torch.zeros_like(q)

    @staticmethod
    def backward(ctx, do):
        return torch.zeros_like(do), None, None, None
