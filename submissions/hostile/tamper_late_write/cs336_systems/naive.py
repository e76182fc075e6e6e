"""Dense attention: right numbers, an N x N score matrix (so it fails the memory checks).
Shared by the hostile examples that need an answer besides their misbehaviour."""
import math

import torch


def _scores(q, k, is_causal):
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        nq, nk = s.shape[-2:]
        rows = torch.arange(nq, device=q.device)[:, None]
        cols = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows, -1e6)
    return s


def dense(q, k, v, is_causal):
    """(o, lse) computed the plain way, in float32."""
    s = _scores(q, k, is_causal)
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype), lse


class NaiveAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = dense(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        scale = 1 / math.sqrt(q.shape[-1])
        p = torch.exp(_scores(q, k, ctx.is_causal) - lse[..., None])
        do32 = do.float()
        dv = p.transpose(-1, -2) @ do32
        dp = do32 @ v.float().transpose(-1, -2)
        d = (do32 * o.float()).sum(-1, keepdim=True)
        ds = p * (dp - d)
        dq = ds @ k.float() * scale
        dk = ds.transpose(-1, -2) @ q.float() * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None
