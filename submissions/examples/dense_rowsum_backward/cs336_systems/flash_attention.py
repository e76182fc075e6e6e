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
        # The whole N_q x N_k P at once (the handout allows a plain PyTorch backward), recomputed
        # from L in float32; the matmuls in the inputs' dtype, as plain PyTorch attention does them.
        lse, q, k, v, o = ctx.saved_tensors
        scale = 1 / math.sqrt(q.shape[-1])
        s = q.float() @ k.float().transpose(-1, -2) * scale
        if ctx.is_causal:
            s = _causal_mask(s, 0, 0)
        p = torch.exp(s - lse[..., None]).to(q.dtype)
        do = grad_out.to(q.dtype)
        dv = p.transpose(-1, -2) @ do
        dp = do @ v.transpose(-1, -2)
        D = (do * o).sum(-1, keepdim=True)  # rowsum(dO * O)
        ds = p * (dp - D)
        dq = ds @ k * scale
        dk = ds.transpose(-1, -2) @ q * scale
        return dq, dk, dv, None
