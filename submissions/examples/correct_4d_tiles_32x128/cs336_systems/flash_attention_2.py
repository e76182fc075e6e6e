"""FlashAttention-2 in PyTorch, written against the paper's Algorithms 1 and 2.

Works on any leading dims (..., N, d) without reshaping: every tile is a slice of the last two
dims and matmuls broadcast over the rest. Tiles are B_q x B_k = 32 x 128. The backward follows
Algorithm 2's loop order: outer loop over key/value tiles, inner loop over query tiles.
"""
import torch

B_Q, B_K = 32, 128
HIDDEN = -1e6


def _mask_future(S, q0, k0):
    """Hide keys after the query (causal, top-left) in the score tile S for rows q0.., cols k0.."""
    q_idx = torch.arange(q0, q0 + S.shape[-2], device=S.device).unsqueeze(-1)
    k_idx = torch.arange(k0, k0 + S.shape[-1], device=S.device)
    return torch.where(k_idx > q_idx, torch.full_like(S, HIDDEN), S)


class FlashAttention2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        *lead, Nq, d = Q.shape
        Nk = K.shape[-2]
        tau = d ** -0.5
        O = Q.new_empty(Q.shape)
        L = torch.empty((*lead, Nq), dtype=torch.float32, device=Q.device)
        for q0 in range(0, Nq, B_Q):
            q1 = min(q0 + B_Q, Nq)
            Qi = Q[..., q0:q1, :].float() * tau  # pre-scaled query tile
            m = torch.full((*lead, q1 - q0, 1), float("-inf"), device=Q.device)
            ell = torch.zeros((*lead, q1 - q0, 1), device=Q.device)
            Oi = torch.zeros((*lead, q1 - q0, d), device=Q.device)
            last_key = min(Nk, q1) if is_causal else Nk  # later keys are hidden from every row here
            for k0 in range(0, last_key, B_K):
                k1 = min(k0 + B_K, last_key)
                S = Qi @ K[..., k0:k1, :].float().transpose(-1, -2)
                if is_causal and k1 - 1 > q0:
                    S = _mask_future(S, q0, k0)
                m_next = torch.maximum(m, S.amax(dim=-1, keepdim=True))
                P = (S - m_next).exp()
                shrink = (m - m_next).exp()
                ell = shrink * ell + P.sum(dim=-1, keepdim=True)
                Oi = shrink * Oi + P @ V[..., k0:k1, :].float()
                m = m_next
            O[..., q0:q1, :] = (Oi / ell).to(Q.dtype)
            L[..., q0:q1] = (m + ell.log()).squeeze(-1)
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        *lead, Nq, d = Q.shape
        Nk = K.shape[-2]
        tau = d ** -0.5
        D = (dO.float() * O.float()).sum(dim=-1, keepdim=True)
        dQ = torch.zeros(Q.shape, dtype=torch.float32, device=Q.device)
        dK = torch.zeros(K.shape, dtype=torch.float32, device=Q.device)
        dV = torch.zeros(V.shape, dtype=torch.float32, device=Q.device)
        for k0 in range(0, Nk, B_K):
            k1 = min(k0 + B_K, Nk)
            Kj, Vj = K[..., k0:k1, :].float(), V[..., k0:k1, :].float()
            first_q = (k0 // B_Q) * B_Q if ctx.is_causal else 0  # earlier queries see none of these keys
            for q0 in range(first_q, Nq, B_Q):
                q1 = min(q0 + B_Q, Nq)
                Qi, dOi = Q[..., q0:q1, :].float(), dO[..., q0:q1, :].float()
                S = (Qi @ Kj.transpose(-1, -2)) * tau
                if ctx.is_causal and k1 - 1 > q0:
                    S = _mask_future(S, q0, k0)
                P = (S - L[..., q0:q1].unsqueeze(-1)).exp()
                dV[..., k0:k1, :] += P.transpose(-1, -2) @ dOi
                dS = P * (dOi @ Vj.transpose(-1, -2) - D[..., q0:q1, :])
                dQ[..., q0:q1, :] += tau * (dS @ Kj)
                dK[..., k0:k1, :] += tau * (dS.transpose(-1, -2) @ Qi)
        return dQ.to(Q.dtype), dK.to(K.dtype), dV.to(V.dtype), None
