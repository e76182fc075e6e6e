"""FlashAttention-2 forward and backward, tile by tile, in plain PyTorch."""
import math

import torch

BLOCK_Q, BLOCK_K = 64, 64
MASK = -1e6  # hidden scores (key after query), as in the handout


def _causal_mask(s, q_start, k_start):
    rows = torch.arange(q_start, q_start + s.shape[-2], device=s.device)[:, None]
    cols = torch.arange(k_start, k_start + s.shape[-1], device=s.device)[None, :]
    return s.masked_fill(cols > rows, MASK)


def _key_end(n_k, q_start, q_len, is_causal):
    """Causal: key tiles entirely after the query tile's last row are skipped."""
    return min(n_k, q_start + q_len) if is_causal else n_k


class FlashAttentionPytorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        q[(0,) * (q.dim() - 1)].mul_(1 + 1e-4)  # BUG: nudges the caller's first query row in place
        Q, K, V = (t.reshape(-1, t.shape[-2], t.shape[-1]).float() for t in (q, k, v))
        n_q, n_k, d = Q.shape[1], K.shape[1], Q.shape[2]
        scale = 1 / math.sqrt(d)
        O = torch.empty_like(Q)
        L = torch.empty(Q.shape[:2], device=q.device)
        for i in range(0, n_q, BLOCK_Q):
            q_i = Q[:, i:i + BLOCK_Q]
            m = torch.full(q_i.shape[:2], -math.inf, device=q.device)  # running row max
            l = torch.zeros(q_i.shape[:2], device=q.device)  # running row sum of exp(s - m)
            acc = torch.zeros_like(q_i)  # running sum of exp(s - m) @ v
            for j in range(0, _key_end(n_k, i, q_i.shape[1], is_causal), BLOCK_K):
                s = q_i @ K[:, j:j + BLOCK_K].transpose(1, 2) * scale
                if is_causal:
                    s = _causal_mask(s, i, j)
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
                l = alpha * l + p.sum(-1)
                acc = alpha[..., None] * acc + p @ V[:, j:j + BLOCK_K]
                m = m_new
            O[:, i:i + BLOCK_Q] = acc / l[..., None]
            L[:, i:i + BLOCK_Q] = m + torch.log(l)
        o = O.to(q.dtype).reshape(q.shape)
        lse = L.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_out):
        lse, q, k, v, o = ctx.saved_tensors
        is_causal = ctx.is_causal
        Q, K, V, O, dO = (t.reshape(-1, t.shape[-2], t.shape[-1]).float() for t in (q, k, v, o, grad_out))
        L = lse.reshape(Q.shape[:2])
        n_q, n_k, d = Q.shape[1], K.shape[1], Q.shape[2]
        scale = 1 / math.sqrt(d)
        D = (dO * O).sum(-1)  # rowsum(dO * O)
        dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
        for i in range(0, n_q, BLOCK_Q):
            q_i, do_i = Q[:, i:i + BLOCK_Q], dO[:, i:i + BLOCK_Q]
            l_i, d_i = L[:, i:i + BLOCK_Q, None], D[:, i:i + BLOCK_Q, None]
            for j in range(0, _key_end(n_k, i, q_i.shape[1], is_causal), BLOCK_K):
                k_j, v_j = K[:, j:j + BLOCK_K], V[:, j:j + BLOCK_K]
                s = q_i @ k_j.transpose(1, 2) * scale
                if is_causal:
                    s = _causal_mask(s, i, j)
                p = torch.exp(s - l_i)
                dV[:, j:j + BLOCK_K] += p.transpose(1, 2) @ do_i
                ds = p * (do_i @ v_j.transpose(1, 2) - d_i)
                dQ[:, i:i + BLOCK_Q] += ds @ k_j * scale
                dK[:, j:j + BLOCK_K] += ds.transpose(1, 2) @ q_i * scale
        return (dQ.reshape(q.shape).to(q.dtype), dK.reshape(k.shape).to(k.dtype),
                dV.reshape(v.shape).to(v.dtype), None)
