"""Float64 attention: the ground truth every implementation is compared with.

Plain softmax(Q K^T / sqrt(d)) V with the course's conventions: causal is top-left (query i
sees key j iff j <= i) and masked scores are filled with -1e6, so every row has a finite
logsumexp even when Nq > Nk. Works on any device and any leading batch dims.
"""
import math

import torch

MASK_FILL = -1e6


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """Boolean (Nq, Nk) mask, True where the key is hidden from the query (j > i)."""
    i = torch.arange(n_queries, device=device)[:, None]
    j = torch.arange(n_keys, device=device)[None, :]
    return j > i


def scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """S = Q K^T / sqrt(d), masked, in q's dtype."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        fill = max(MASK_FILL, torch.finfo(s.dtype).min)  # -1e6 overflows float16
        s = s.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), fill)
    return s


def attention(q, k, v, is_causal: bool = False):
    """Plain attention in the inputs' dtype. Returns (o, L) with L the natural-log LSE.

    Called on float64 inputs it is the oracle; called on bf16 inputs it is the 'plain
    PyTorch in the same dtype' that low-precision results are judged against.
    """
    s = scores(q, k, is_causal)
    lse = torch.logsumexp(s.float() if s.dtype in (torch.float16, torch.bfloat16) else s, dim=-1)
    p = torch.softmax(s, dim=-1)
    return p @ v, lse


def attention_and_grads(q, k, v, do, is_causal: bool = False, dtype=torch.float64):
    """Forward and backward of plain attention computed in `dtype` (float64 for the oracle).

    Returns a dict with o, L, dq, dk, dv, all in `dtype`.
    """
    q, k, v = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    o, lse = attention(q, k, v, is_causal)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.to(dtype))
    return {"o": o.detach(), "L": lse.detach(), "dq": dq, "dk": dk, "dv": dv}
