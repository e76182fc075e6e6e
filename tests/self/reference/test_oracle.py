"""The float64 oracle is what everything is judged by, so it is checked against independent math."""
import math

import torch

from reference.oracle import MASK_FILL, attention, attention_and_grads


def test_oracle_matches_explicit_softmax():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 7, 16, generator=g, dtype=torch.float64) for _ in range(3))
    o, lse = attention(q, k, v)
    s = torch.einsum("bid,bjd->bij", q, k) / 4.0
    expected_lse = torch.log(torch.exp(s).sum(-1))
    assert torch.allclose(lse, expected_lse, atol=1e-12)
    assert torch.allclose(o, torch.einsum("bij,bjd->bid", torch.exp(s - expected_lse[..., None]), v), atol=1e-12)


def test_oracle_causal_is_top_left_and_finite_when_queries_outnumber_keys():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 9, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    o, lse = attention(q, k, v, is_causal=True)
    assert torch.isfinite(lse).all()
    # query 0 sees only key 0, so its output is v[0] exactly
    assert torch.allclose(o[:, 0], v[:, 0], atol=1e-12)
    # queries past the last key see every key: same as non-causal
    full, _ = attention(q, k, v, is_causal=False)
    assert torch.allclose(o[:, 3:], full[:, 3:], atol=1e-12)
    assert MASK_FILL == -1e6


def test_oracle_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, True)[0], (q, k, v))
    do = torch.randn(1, 5, 4, generator=g, dtype=torch.float64)
    grads = attention_and_grads(q, k, v, do, True)
    assert grads["dq"].dtype == torch.float64 and grads["L"].shape == (1, 5)
    assert math.isclose(grads["o"].sum().item(), attention(q, k, v, True)[0].sum().item())
