"""FlashAttention-2 ... or so it says."""
import torch
import torch.nn.functional as F


class FlashAttentionPytorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        # BUG: the library's fused attention does the work; nothing is implemented here.
        o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        s = q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5
        if is_causal:
            n_q, n_k = s.shape[-2:]
            hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
            s = s.masked_fill(hidden, -1e6)
        lse = torch.logsumexp(s, dim=-1)
        ctx.save_for_backward(lse, q, k, v)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_out):
        _, q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=ctx.is_causal)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad_out)
        return dq, dk, dv, None
