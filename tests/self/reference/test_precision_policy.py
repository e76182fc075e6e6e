"""The course tier's tolerance and the fp32 policy for Triton kernels (reference/tolerance.py).

A GPU's TF32 cannot run here, so its error profile is simulated: a tiled FlashAttention-2 whose
every matmul cuts its inputs to a 10-bit mantissa (`round_to_tf32`), as tl.dot does with fp32
inputs on tensor cores. It computes in a different order from the TF32 baseline (online
softmax, unnormalised P, recomputed backward), like a real kernel.

The same simulated kernel, written into throwaway submissions, is then graded end to end: in the
Triton slot it must pass every fp32 check and be reported as TF32, while a softmax scale 3% off
or a causal mask that hides the diagonal must still fail.
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fa2_sandbox.wire.cases import FlashCase, make_inputs
from grading.diagnoses.mistakes import backward_unmasked
from grading.results.gradescope import status_of
from reference.tolerance import (
    compare,
    course_close,
    expected_attention,
    judge_attention,
    round_to_tf32,
    tf32_attention_and_grads,
)

ROOT = Path(__file__).resolve().parents[3]

# A self-contained submission module: tiled FA2 with TF32-rounded matmuls. SCALE_ERROR and
# MASK_DIAGONAL plant the bugs. Written into each throwaway submission as cs336_systems/tf32.py.
TF32_KERNEL = '''
import math
import torch

SCALE_ERROR = {scale_error}
MASK_DIAGONAL = {mask_diagonal}
TILE = 32


def tf32(x):  # a tensor core reading float32 registers: the low 13 mantissa bits dropped
    return (x.float().contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def mm(a, b):
    return tf32(a) @ tf32(b)


def scores(q, k, i, j, causal):
    s = mm(q, k.transpose(-1, -2)) * SCALE_ERROR / math.sqrt(q.shape[-1])
    if causal:
        rows = torch.arange(i, i + q.shape[-2])[:, None]
        cols = torch.arange(j, j + k.shape[-2])[None, :]
        s = s.masked_fill(cols >= rows if MASK_DIAGONAL else cols > rows, -1e6)
    return s


class TF32Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        Q, K, V = (t.reshape(-1, t.shape[-2], t.shape[-1]).float() for t in (q, k, v))
        O, L = torch.empty_like(Q), torch.empty(Q.shape[:-1])
        for i in range(0, Q.shape[1], TILE):
            qt = Q[:, i:i + TILE]
            m = torch.full(qt.shape[:-1], -math.inf)
            l = torch.zeros(qt.shape[:-1])
            acc = torch.zeros(qt.shape)
            for j in range(0, K.shape[1], TILE):
                s = scores(qt, K[:, j:j + TILE], i, j, is_causal)
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                l = torch.exp(m - m_new) * l + p.sum(-1)
                acc = torch.exp(m - m_new)[..., None] * acc + mm(p, V[:, j:j + TILE])
                m = m_new
            O[:, i:i + TILE] = acc / l[..., None]
            L[:, i:i + TILE] = m + torch.log(l)
        o, lse = O.reshape(q.shape).to(q.dtype), L.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        lse, q, k, v, o = ctx.saved_tensors
        Q, K, V, dO, O = (t.reshape(-1, t.shape[-2], t.shape[-1]).float() for t in (q, k, v, do, o))
        L = lse.reshape(Q.shape[:-1])
        D = (dO * O).sum(-1)
        dQ, dK, dV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
        scale = SCALE_ERROR / math.sqrt(Q.shape[-1])
        for i in range(0, Q.shape[1], TILE):
            for j in range(0, K.shape[1], TILE):
                p = torch.exp(scores(Q[:, i:i + TILE], K[:, j:j + TILE], i, j, ctx.is_causal) - L[:, i:i + TILE, None])
                dV[:, j:j + TILE] += mm(p.transpose(-1, -2), dO[:, i:i + TILE])
                ds = p * (mm(dO[:, i:i + TILE], V[:, j:j + TILE].transpose(-1, -2)) - D[:, i:i + TILE, None])
                dQ[:, i:i + TILE] += mm(ds, K[:, j:j + TILE]) * scale
                dK[:, j:j + TILE] += mm(ds.transpose(-1, -2), Q[:, i:i + TILE]) * scale
        return dQ.reshape(q.shape), dK.reshape(k.shape), dV.reshape(v.shape), None
'''

ADAPTERS = '''
from cs336_systems.tf32 import TF32Flash


def get_flashattention_autograd_function_pytorch():
    return TF32Flash


def get_flashattention_autograd_function_triton():
    return TF32Flash
'''


def load_kernel(scale_error=1.0, mask_diagonal=False):
    namespace = {}
    exec(TF32_KERNEL.format(scale_error=scale_error, mask_diagonal=mask_diagonal), namespace)
    return namespace["TF32Flash"]


def run(cls, q, k, v, do, causal):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = cls.apply(q, k, v, causal)
    lse = next(t for t in o.grad_fn.saved_tensors if t.shape == q.shape[:-1])
    o.backward(do)
    return {"o": o.detach(), "L": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def inputs(nq, nk, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(2, nq, 64, generator=g) for _ in range(2))
    k, v = (torch.randn(2, nk, 64, generator=g) for _ in range(2))
    return q, k, v, do


def test_round_to_tf32_keeps_ten_mantissa_bits():
    x = torch.randn(10_000) * 100
    r = round_to_tf32(x)
    assert (r.view(torch.int32) & 0x1FFF).eq(0).all()
    assert ((r - x).abs() / x.abs()).max() <= 2 ** -10
    assert (r.abs() <= x.abs()).all()  # truncation, toward zero
    assert torch.equal(round_to_tf32(torch.tensor([float("inf"), -2.0])), torch.tensor([float("inf"), -2.0]))


@pytest.mark.parametrize("nq,nk,causal", [(256, 256, False), (113, 203, True)])
def test_tf32_kernel_passes_the_tf32_rule_and_only_it(nq, nk, causal):
    q, k, v, do = inputs(nq, nk)
    got = run(load_kernel(), q, k, v, do, causal)
    oracle, fp32_plain = expected_attention(q, k, v, do, causal)
    strict = judge_attention(got, q, k, v, do, causal, (oracle, fp32_plain))
    tf32 = judge_attention(got, q, k, v, do, causal, (oracle, tf32_attention_and_grads(q, k, v, do, causal)))
    assert all(v.ok for v in tf32.values()), {n: v.reason for n, v in tf32.items()}
    # Without the policy a correct TF32 kernel would fail: the reason the policy exists.
    assert not all(v.ok for v in strict.values())
    assert not any(course_close(n, got[n], oracle[n]) for n in got)


@pytest.mark.parametrize("bug", [{"scale_error": 1.03}, {"mask_diagonal": True}])
def test_real_fp32_bugs_still_fail_the_tf32_rule(bug):
    causal = bool(bug.get("mask_diagonal"))
    q, k, v, do = inputs(256, 256, seed=1)
    got = run(load_kernel(**bug), q, k, v, do, causal)
    oracle, _ = expected_attention(q, k, v, do, causal)
    verdicts = judge_attention(got, q, k, v, do, causal, (oracle, tf32_attention_and_grads(q, k, v, do, causal)))
    assert not all(v.ok for v in verdicts.values())


def test_course_tolerance_is_the_official_one():
    """|x - ref| <= 1e-2 + 1e-2 |ref| elementwise, as torch.testing.assert_close(atol=rtol=1e-2)."""
    ref = torch.tensor([0.0, 1.0, -2.0]).double()
    assert course_close("o", ref + torch.tensor([0.0099, 0.0199, -0.0299]), ref) == ""
    message = course_close("o", ref + torch.tensor([0.0, 0.0, 0.0301]), ref)
    assert message.startswith("o:") and "not close" in message
    # bf16 arithmetic returned as fp32 passes the official test but not the relative fp32 rule.
    q, k, v, do = inputs(128, 128)
    oracle, fp32_plain = expected_attention(q, k, v, do, False)
    bf16 = expected_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), do.bfloat16(), False)[1]
    assert course_close("o", bf16["o"].float(), oracle["o"]) == ""
    assert not compare("o", bf16["o"].float(), oracle["o"], fp32_plain["o"], 2.0, torch.float32).ok


def test_max_bound_never_below_the_rounding_of_the_answer_itself():
    """No bf16 answer can be closer to the oracle than the oracle rounded to bf16: the max bound's
    floor is twice that (FlashAttention's own tests add the same). Gradients reach magnitudes
    where a bf16 ulp is 4x ATOL; L, kept in float32, gets no such slack."""
    torch.manual_seed(0)
    oracle = (torch.randn(2, 64, 64, dtype=torch.float64) * 3)  # |dq| up to ~10: ulps of 2^-5
    exact_baseline = oracle.float()  # a baseline (almost) exact, so the bound is its floor
    rounded = oracle.to(torch.bfloat16)
    one_ulp_off = rounded.clone()
    one_ulp_off[0, 0, 0] = torch.nextafter(rounded[0, 0, 0].float(), torch.tensor(1e9)).bfloat16()
    assert compare("dq", one_ulp_off, oracle, exact_baseline, 3.0, torch.bfloat16).ok
    # but a systematic 2% error, a bug's size, is far outside it
    assert not compare("dq", (oracle * 1.02).bfloat16(), oracle, exact_baseline, 3.0, torch.bfloat16).ok
    # L is stored in float32: an L rounded to bf16 is judged against float32's (tiny) rounding
    L = torch.randn(2, 64, dtype=torch.float64) + 7
    assert not compare("L", L.bfloat16(), L, L.float(), 2.0, torch.bfloat16, torch.float32).ok
    assert compare("L", L.float(), L, L.float(), 2.0, torch.bfloat16, torch.float32).ok


def dense_backward_in(dtype, q, k, v, o, do, lse, is_causal):
    """A correct dense backward: S and P = exp(S - L) in float32, then D = rowsum(dO * O) apart
    from dP = dO V^T, each rounded in `dtype` (the rest of a bf16 backward without upcasts)."""
    q, k, v, o, do = (t.to(dtype) for t in (q, k, v, o, do))
    scale = q.shape[-1] ** -0.5
    s = q.float() @ k.float().transpose(-1, -2) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -1e6)
    p = torch.exp(s - lse.float()[..., None]).to(dtype)
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    return {"dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale, "dv": p.transpose(-1, -2) @ do}


@pytest.mark.parametrize("seed", [1, 2, 9])
def test_exactly_zero_gradients_get_the_rounding_of_their_terms(seed):
    """Causal with Nq = 1 (and query row 0 of any causal case): the oracle and plain bf16 attention are
    exactly 0, so the bound fell to ATOL and a correct bf16 backward failed on rounding alone. The
    slack there is one ulp of dS's terms; a backward without the causal mask still fails."""
    q, k, v, do = (t.bfloat16() for t in inputs(1, 239, seed=seed))
    oracle, baseline = expected_attention(q, k, v, do, True)
    plain_dq = baseline["dq"][0]  # autograd's; the handout's (baseline["dq"][1]) rounds D and dP apart
    assert (oracle["dq"] == 0).all() and (plain_dq == 0).all()
    got = dense_backward_in(torch.bfloat16, q, k, v, oracle["o"], do, oracle["L"], True)
    without_slack = compare("dq", got["dq"], oracle["dq"], plain_dq, 3.0, torch.bfloat16)
    assert not without_slack.ok, "the case no longer shows the problem: pick inputs where it does"
    verdicts = judge_attention(got, q, k, v, do, True, (oracle, baseline))
    assert all(verdict.ok for verdict in verdicts.values()), {n: v.reason for n, v in verdicts.items()}
    unmasked = backward_unmasked(q, k, v, do)
    wrong = {n: unmasked[n].to(torch.bfloat16) for n in ("dq", "dk", "dv")}
    assert not judge_attention(wrong, q, k, v, do, True, (oracle, baseline))["dq"].ok



def test_a_backward_written_the_handouts_way_is_judged_by_the_handouts_rounding():
    """A bf16 backward that forms D = rowsum(dO o O) and dP apart, in bf16, as the handout's
    Algorithm 2 does, erred by 1.36 times the dk bound that autograd's backward alone sets, on one
    seed of about 300 (a CI run of submissions/examples/dense_rowsum_backward): autograd takes
    the row sum in float32. The handout's backward in the same dtype is the second baseline, and
    it passes; a backward without the causal mask still fails."""
    case = FlashCase(batch=(2,), n_queries=515, n_keys=515, head_dim=80, dtype="bfloat16", is_causal=True)
    q, k, v, do = make_inputs(case, 547581258)
    oracle, baseline = expected_attention(q, k, v, do, True)
    got = dense_backward_in(torch.bfloat16, q, k, v, oracle["o"], do, oracle["L"], True)
    autograd_only = compare("dk", got["dk"], oracle["dk"], baseline["dk"][0], 3.0, torch.bfloat16)
    assert not autograd_only.ok, "the seed no longer shows the problem: pick one that does (bench/seed_sweep.py)"
    verdicts = judge_attention(got, q, k, v, do, True, (oracle, baseline))
    assert all(verdict.ok for verdict in verdicts.values()), {n: v.reason for n, v in verdicts.items()}
    unmasked = backward_unmasked(q, k, v, do)
    wrong = {n: unmasked[n].to(torch.bfloat16) for n in ("dq", "dk", "dv")}
    assert not all(verdict.ok for verdict in judge_attention(wrong, q, k, v, do, True, (oracle, baseline)).values())

def write_submission(folder: Path, **bug) -> Path:
    (folder / "cs336_systems").mkdir(parents=True)
    (folder / "cs336_systems" / "__init__.py").write_text("")
    (folder / "cs336_systems" / "tf32.py").write_text(TF32_KERNEL.format(scale_error=bug.get("scale_error", 1.0),
                                                                        mask_diagonal=bug.get("mask_diagonal", False)))
    (folder / "adapters.py").write_text(textwrap.dedent(ADAPTERS))
    return folder


def test_graded_end_to_end(tmp_path):
    """Through the real grader: the TF32 kernel in the Triton slot passes every fp32 check and is
    reported as TF32; planted scale and mask bugs fail; bf16-level errors pass the course tier."""
    class_dir = tmp_path / "class"
    write_submission(class_dir / "tf32_correct")
    write_submission(class_dir / "tf32_scale_off", scale_error=1.03)
    write_submission(class_dir / "tf32_mask_diagonal", mask_diagonal=True)
    reports = tmp_path / "reports"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--impl={class_dir}/*",
               f"--reports={reports}", "-k", "triton and fp32 and (forward or backward) and not 4d"]
    subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    tests = {name: {t["name"].split("::", 1)[1]: t for t in
                    json.loads((reports / name / "results.json").read_text())["tests"]}
             for name in ("tf32_correct", "tf32_scale_off", "tf32_mask_diagonal")}

    correct = tests["tf32_correct"]
    assert correct and all(status_of(t) == "passed" for t in correct.values()), \
        {n: t["output"] for n, t in correct.items() if status_of(t) != "passed"}
    tf32_noted = [n for n, t in correct.items() if t.get("precision") == "tf32"]
    assert tf32_noted and all("TF32" in correct[n]["output"] for n in tf32_noted)
    assert all(t.get("precision") is None for n, t in correct.items() if t["tier"] == "course")

    scale_off = [n for n, t in tests["tf32_scale_off"].items() if status_of(t) == "failed"]
    assert any(tests["tf32_scale_off"][n]["tier"] == "handout" for n in scale_off), scale_off
    mask = [n for n, t in tests["tf32_mask_diagonal"].items() if status_of(t) == "failed"]
    assert mask and all("causal" in n for n in mask), mask
    assert any("j >= i" in tests["tf32_mask_diagonal"][n].get("diagnosis", "") for n in mask)
