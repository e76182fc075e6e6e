"""The bundled reference passes its bf16 cases whatever the seed (issue 36).

The grader draws a new seed for every new reports folder, so a bound the reference misses for one
seed in twenty fails one newcomer's first run in twenty, and a correct student the same way. Here
the reference Triton kernel is judged by the rule itself (reference/tolerance.py's
judge_attention, as grading/checks/test_flash.py calls it, without the grader around it) on this
machine's bf16 cases of grading/matrix.py, over many seeds: for the large-score cases (scores x8,
scores near -200), whose softmax is almost one-hot so that the error sits in a few rows and the
mean-error rule is at its noisiest, 200 on a GPU and 64 on a CPU, where every seed runs under the
slow interpreter (64 seeds find a bound missed one seed in twenty with probability 1 - 0.95^64 =
0.96), plus the seeds that failed before (below); the issue's seeds for the other bf16 cases
(bench/seed_sweep.py runs any of them over 200 and more).

On a CPU they run under the Triton interpreter, patched as the grader's runners patch it
(fa2_sandbox/runner/triton_interpreter.py). Before its float32 -> bf16 conversions were made to
round to nearest even, as a GPU's do, the x8 case failed seeds 116, 134 and 140 of these 200.
"""
import pytest
import torch
import triton
import triton.language as tl

from fa2_sandbox.runner.triton_interpreter import ensure_bf16
from fa2_sandbox.wire.cases import make_inputs
from grading.matrix import flash_cases
from reference.flash_triton import FlashAttentionTriton
from reference.tolerance import expected_attention, judge_attention

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
BF16_PROBLEM = ensure_bf16(interpreted=not ON_GPU)

LARGE_SCORES = 200 if ON_GPU else 64  # seeds per large-score case
FAILED_BEFORE = (116, 134, 140)  # the x8 case's failures under a truncating interpreter
OTHER_SEEDS = (0, 116, 134, 1861009893)  # for the other bf16 cases (the interpreter takes 0.1 to 3 s a call)
CASES = [c for _, c in flash_cases("triton", ON_GPU) if c.dtype == "bfloat16"]
LARGE = [c for c in CASES if c.score_scale != 1 or c.score_shift]
assert LARGE, "the matrix has no large-score bf16 case"


def reference_verdicts(case, seed) -> dict:
    q, k, v, do = make_inputs(case, seed, DEVICE)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = FlashAttentionTriton.apply(*leaves, case.is_causal)
    lse = o.grad_fn.saved_tensors[0]
    dq, dk, dv = torch.autograd.grad(o, leaves, do)
    got = {"o": o.detach(), "L": lse, "dq": dq, "dk": dk, "dv": dv}
    return judge_attention(got, q, k, v, do, case.is_causal, expected_attention(q, k, v, do, case.is_causal))


def failures(case, seeds) -> list:
    return [f"seed {seed}: {v.reason}" for seed in seeds for v in reference_verdicts(case, seed).values() if not v.ok]


@pytest.mark.skipif(bool(BF16_PROBLEM), reason=BF16_PROBLEM or "")
@pytest.mark.parametrize("case", LARGE, ids=[c.id for c in LARGE])
def test_large_score_cases_pass_every_seed(case):
    seeds = sorted({*range(LARGE_SCORES), *FAILED_BEFORE})
    bad = failures(case, seeds)
    assert not bad, f"{len(bad)} failures in {len(seeds)} seeds: " + " ".join(bad[:5])


@pytest.mark.skipif(bool(BF16_PROBLEM), reason=BF16_PROBLEM or "")
@pytest.mark.parametrize("case", [c for c in CASES if c not in LARGE], ids=[c.id for c in CASES if c not in LARGE])
def test_other_bf16_cases_pass_several_seeds(case):
    bad = failures(case, OTHER_SEEDS)
    assert not bad, " ".join(bad[:5])


@triton.jit
def _to_bf16(X, Y, Z, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(X + o)
    tl.store(Y + o, x.to(tl.bfloat16))
    tl.store(Z + o, x)  # a float32 value stored through a bf16 pointer


def test_float32_to_bf16_rounds_to_nearest_even():
    """What a GPU's cvt.rn.bf16.f32 and torch do, in a cast and in a store: the interpreter of
    Triton 3.9 truncated both (1 - 2^-10 became 0.99609375, not 1.0)."""
    assert not BF16_PROBLEM, BF16_PROBLEM
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(0x00800000, 0x7F800000, (4032,), generator=g, dtype=torch.int32)  # finite, normal
    bits[::3] = (bits[::3] & ~0xFFFF) | 0x8000  # exactly half way: ties go to the even neighbour
    x = bits.view(torch.float32) * torch.where(torch.arange(4032) % 2 == 0, 1.0, -1.0)
    special = [1 - 2 ** -10, 0.3, -0.1, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.3895e38, float("inf"), -float("inf"), 0.0,
               -0.0, 1e-40, -1e-40]
    x = torch.cat([x, torch.tensor(special + [0.5] * (64 - len(special)))]).to(DEVICE)
    y, z = (torch.empty(x.shape, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    _to_bf16[(1,)](x, y, z, N=x.numel())
    want = x.to(torch.bfloat16).view(torch.int16)
    assert torch.equal(y.view(torch.int16), want) and torch.equal(z.view(torch.int16), want)
