"""The tiled PyTorch FlashAttention-2 against the float64 oracle, across an odd-shape matrix."""
import pytest
import torch

from fa2_sandbox.runner.flash_call import run_flash
from fa2_sandbox.wire.cases import FlashCase, make_inputs
from reference.flash_pytorch import FlashAttentionPytorch
from reference.tolerance import judge_attention

PAIRS = [(1, 1), (17, 17), (113, 203), (203, 113), (128, 217), (1023, 1024)]
CASES = [
    FlashCase(batch=batch, n_queries=nq, n_keys=nk, head_dim=d, dtype=dtype, is_causal=causal)
    for (nq, nk) in PAIRS
    for d in (16, 48, 64, 128)
    for dtype in ("float32", "bfloat16")
    for causal in (False, True)
    for batch in [(2,) if d in (16, 64) else (2, 2)]  # 3-D and 4-D both run for every pair
    if (nq, nk) != (1023, 1024) or d == 64  # the big pair once per dtype/causal is enough
]
CASES += [
    FlashCase(batch=(2, 3), n_queries=100, n_keys=77, head_dim=80, dtype="float16", is_causal=True),
    FlashCase(batch=(2, 3), n_queries=65, n_keys=130, head_dim=96, noncontiguous=True, is_causal=True),
    FlashCase(batch=(3,), n_queries=128, n_keys=128, head_dim=64, score_scale=8.0),
]


@pytest.mark.parametrize("tiles", [(64, 64), (16, 32)], ids=lambda t: f"tiles{t[0]}x{t[1]}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_oracle(case, tiles):
    q, k, v, do = make_inputs(case, seed=1234)
    got = run_flash(FlashAttentionPytorch.with_tiles(*tiles), q, k, v, do, case.is_causal)
    assert got["n_lse"] == 1, "exactly one saved tensor of shape q.shape[:-1] (the LSE)"
    assert got["L"].dtype == torch.float32
    assert got["o"].dtype == q.dtype and got["o"].shape == q.shape
    assert got["dq"].dtype == q.dtype and got["dk"].shape == k.shape
    failures = [v.reason for v in judge_attention(got, q, k, v, do, case.is_causal).values() if not v.ok]
    assert not failures, " ".join(failures)


def test_inputs_are_left_unchanged():
    case = FlashCase(n_queries=70, n_keys=90, is_causal=True)
    q, k, v, do = make_inputs(case, seed=5)
    before = [t.clone() for t in (q, k, v, do)]
    run_flash(FlashAttentionPytorch, q, k, v, do, True)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v, do)))


def test_causal_skips_tiles_above_the_diagonal(monkeypatch):
    """Count tile score computations: causal must visit about half the tiles."""
    import reference.flash_pytorch as fp

    calls = []
    original = fp._tile_scores
    monkeypatch.setattr(fp, "_tile_scores", lambda *a: calls.append(a[3:5]) or original(*a))
    q, k, v, do = make_inputs(FlashCase(batch=(1,), n_queries=256, n_keys=256, head_dim=16), seed=0)
    FlashAttentionPytorch.with_tiles(64, 64).apply(q, k, v, True)
    assert len(calls) == 10  # 4 query tiles: 1 + 2 + 3 + 4 key tiles
    assert all(j <= i for i, j in calls)
