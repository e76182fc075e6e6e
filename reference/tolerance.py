"""How close is close enough: the rule every numerical comparison in this project uses.

An implementation's error is measured against the float64 oracle and judged relative to the
error of plain PyTorch attention run in the same dtype (FlashAttention's own test rule):

    max|x - oracle|  <= factor * max|plain - oracle|  + atol(dtype)
    mean|x - oracle| <= factor * mean|plain - oracle| + atol(dtype) / 8

factor is 2 for outputs and L, 3 for gradients. NaN or Inf anywhere fails. The atol keeps the
rule sane when the baseline is (almost) exact: a few ulps of an attention output (|o| < 1), and
never less than twice the error of the oracle itself rounded to the dtype the result is stored
in (the inputs' for o and the gradients, float32 for L), in max and in mean, since no answer
stored in that dtype can be closer than that. FlashAttention's tests add the same floor
(`dq_atol = 2 * ((dq_ref + 0.3 - 0.3) - dq_ref).abs().max()`). It matters for bf16 gradients,
whose values reach 2 and more where a bf16 ulp is 2^-6: on a GPU the handout's own backward
(plain PyTorch under torch.compile) gave dq over the bound without it (bf16, N=1024, causal;
notes/corpus-class.md, "The tolerance floor"), with a mean error within its bound.

Where the oracle and the baseline are both exactly 0, the relative rule knows nothing: plain
attention gets 0 there by the structure of its softmax backward (query row 0 of a causal case
sees key 0 alone, P = 1 and dS = P (dP - D) = dP - dP; with Nq = 1 all of dq and dk is such
rows), not by accuracy. A FlashAttention backward forms D = rowsum(dO o O) and dP = dO V^T
apart, each rounded in its dtype, so dP - D there is a few roundings of terms of size
|dO_i| . |v_j| (sum over the head dim of |dO_ic| |v_jc|, which also bounds |D_i| since O_i
mixes the v_j), not 0. On those elements only the slack is one ulp (2 unit roundoffs) of those
terms carried to the gradient as the gradient carries dS:
    dq_ic:  scale * sum_j P_ij (|dO_i| . |v_j|) |k_jc|,   dk_jc: scale * sum_i P_ij (|dO_i| . |v_j|) |q_ic|.
In bf16 with unit-normal inputs (d = 64, Nq = 1) that slack is 0.03 on average, 0.14 at most,
where a correct bf16 backward erred by up to 0.02 and failed ATOL (4e-3); in float32 it is 2^16
times smaller. A wrong gradient still fails there: a backward that recomputes P without the
causal mask gave dq errors of 37 to 790 on the same inputs (tests/self/reference/test_precision_policy.py).

Two plain backwards: plain attention's autograd forms the softmax backward as
dS = P o (dP - rowsum(P o dP)), the row sum taken in float32; the handout's Algorithm 2 forms
D = rowsum(dO o O) from the stored O and subtracts it from dP, each rounded in the inputs' dtype.
Both are plain PyTorch in that dtype, and the handout's is what its own PyTorch backward does,
so a gradient's bounds follow the less accurate of the two (in max and in mean apart). The
handout's can be the worse by far: where |dO_i| . |v_j| is large, D's bf16 rounding (an ulp of
2^-4 at |D| = 9) lands in every dS of the row. A correct bf16 backward written the handout's
way (submissions/examples/dense_rowsum_backward) erred by 1.36 times the dk bound set by
autograd's backward alone on one seed of about 300 (bf16, 515x515, d = 80, causal), where the
handout's backward itself erred as much; by the handout's, it is within its bound on every seed.

Every seed: a new reports folder draws a new seed, so the rule must hold for correct code on any.
Where scores are large (the matrix's bf16 x8 case, a one-hot softmax) the error sits in the few
rows with near ties, and plain bf16's mean error swings 40-fold from seed to seed (dq at 32x32,
seeds 0..199: 0.0015 to 0.063); the reference Triton kernel's stayed below it on every seed (at
most 0.78 of it, where the rule allows 3 times it), the worst of all its errors 0.24 of a bound.
It failed there on the CPU (issue 36: 3 seeds of 200, up to 1.6 times the dq mean bound) only
because Triton's interpreter truncated float32 -> bf16 conversions, now rounded to nearest even
as on a GPU (fa2_sandbox/runner/triton_interpreter.py); tests/self/reference/test_every_seed.py.

The fp32 policy for Triton kernels (TF32)
-----------------------------------------
On tensor-core GPUs Triton's `tl.dot` multiplies float32 inputs in TF32 by default: each input
is rounded to a 10-bit mantissa (relative error 2^-11) and the products are accumulated in
float32. A kernel that follows the handout (which says "Perform matrix multiplications with
tl.dot" and never asks for input_precision="ieee") therefore lands near 1e-3 from the oracle,
while plain fp32 PyTorch (cuBLAS without TF32, torch's default) lands near 1e-6. Judged against
the plain fp32 baseline, every such correct kernel would fail.

So fp32 results of the Triton slot are judged against plain attention whose every matmul
cuts its inputs to TF32 (`tf32_attention_and_grads`: forward and backward, the cut done
explicitly, so the baseline is the same on any device and does not depend on cuBLAS flags),
with the same factors. The cut truncates, as the hardware does: on a GPU every real kernel
of the course corpus showed the same mean L error at N=1024 (truncation biases every score
toward zero), far above what a round-to-nearest model predicts, which failed them all
(notes/corpus-class.md, "Triton fp32 fails everywhere"); round-to-nearest TF32 (cuBLAS) is more
accurate and passes too.
Why this is defensible:
- it is the precision the course's own tools choose by default; the official tests accept it
  (atol = rtol = 1e-2, a hundred times looser);
- it is still tight: TF32 moves an attention output by ~1e-4..1e-3, while a softmax scale off
  by a few percent, a wrong mask, a missing rescale or a dropped tile moves o, L or the
  gradients by 1e-2 or more, and fails;
- a kernel that is exact in fp32 (input_precision="ieee") passes it trivially.
A kernel that passes only under this rule is told so in its report ("computes its fp32
matmuls in TF32"); nothing is deducted. The PyTorch slot keeps the plain fp32 baseline: it
runs on the CPU, where there is no TF32.

The course tier is judged by the official tests' own rule instead (`course_close`):
torch.testing.assert_close semantics, |x - ref| <= atol + rtol * |ref| with atol = rtol = 1e-2,
plus the same dtype, so a repo that passes the official tests gets the course tier.
"""
import math
from dataclasses import asdict, dataclass

import torch

# The factors of the rule above, and the one place their defaults live: the grader's rubric
# (grading/rubric.py) starts from these, and a rubric.yaml's `tolerances:` may override them.
OUTPUT_FACTOR = 2.0  # o and L
GRAD_FACTOR = 3.0  # dq, dk, dv

# A few ulps at the magnitude of attention outputs (|o| < 1): bf16 has 8 bits of mantissa, fp16 11.
ATOL = {torch.float32: 1e-5, torch.float16: 5e-4, torch.bfloat16: 4e-3, torch.float64: 1e-12}


@dataclass
class Verdict:
    ok: bool
    reason: str  # one plain sentence; empty when ok
    max_err: float
    max_bound: float
    mean_err: float
    mean_bound: float
    worst_index: tuple
    oracle_at_worst: float
    actual_at_worst: float

    def as_dict(self) -> dict:
        return asdict(self)


def compare(name: str, actual: torch.Tensor, oracle: torch.Tensor, baseline: torch.Tensor | tuple,
            factor: float, dtype: torch.dtype, stored: torch.dtype | None = None,
            exact_zero_slack: torch.Tensor | None = None) -> Verdict:
    """Judge `actual` against the float64 `oracle`, with `baseline` (plain PyTorch in `dtype`, or
    a tuple of plain results computed different ways: the bounds follow the least accurate one).
    `stored`: the dtype the result is kept in (default `dtype`; float32 for L), whose rounding of
    the oracle is the floor of the max bound. `exact_zero_slack`: per element, the error allowed
    where the oracle and the first baseline are both exactly 0 (see the module's docstring); an
    error within it counts as none."""
    atol = ATOL[dtype]
    oracle = oracle.double().cpu()
    actual = actual.detach().double().cpu()
    baselines = [b.detach().double().cpu() for b in (baseline if isinstance(baseline, tuple) else (baseline,))]
    baseline_errs = [(b - oracle).abs() for b in baselines]
    rounding = (oracle.to(stored or dtype).double() - oracle).abs() if oracle.numel() else torch.zeros(1)
    max_bound = factor * max(e.max().item() for e in baseline_errs) + max(atol, 2 * rounding.max().item())
    mean_bound = factor * max(e.mean().item() for e in baseline_errs) + max(atol / 8, 2 * rounding.mean().item())
    if actual.shape != oracle.shape:
        return Verdict(False, f"{name} has shape {tuple(actual.shape)}, expected {tuple(oracle.shape)}.",
                       float("inf"), max_bound, float("inf"), mean_bound, (), 0.0, 0.0)
    err = (actual - oracle).abs()
    if exact_zero_slack is not None:
        exact = (oracle == 0) & (baselines[0] == 0)
        err = torch.where(exact, (err - exact_zero_slack.double().cpu()).clamp(min=0), err)
    bad = ~torch.isfinite(actual)
    if bad.any():
        err = err.masked_fill(bad, float("inf"))
    worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape)) if err.numel() else ()
    max_err = err.max().item() if err.numel() else 0.0
    mean_err = err.mean().item() if err.numel() else 0.0
    at_worst = (oracle[worst].item(), actual[worst].item()) if worst else (0.0, 0.0)
    if bad.any():
        reason = f"{name} has {int(bad.sum())} NaN or Inf values (first at index {worst})."
    elif max_err > max_bound:
        reason = (f"{name} max error {max_err:.3g} at index {worst} is over the bound {max_bound:.3g}"
                  f"{_times(max_err, max_bound)} (oracle {at_worst[0]:.5g}, got {at_worst[1]:.5g}).")
    elif mean_err > mean_bound:
        reason = f"{name} mean error {mean_err:.3g} is over the bound {mean_bound:.3g}{_times(mean_err, mean_bound)}."
    else:
        reason = ""
    return Verdict(not reason, reason, max_err, max_bound, mean_err, mean_bound, worst, *at_worst)


def _times(err: float, bound: float) -> str:
    """How far over its bound an error is, as a multiple: ", 37 times it"."""
    return f", {err / bound:.3g} times it" if bound > 0 and math.isfinite(err / bound) else ""


COURSE_ATOL = COURSE_RTOL = 1e-2  # tests/test_attention.py in the course's repo


def course_close(name: str, actual: torch.Tensor, oracle: torch.Tensor) -> str:
    """The official tests' comparison (torch.testing.assert_close with atol = rtol = 1e-2 against
    a float32 reference, here the float64 oracle): '' when it passes, else its message."""
    try:
        torch.testing.assert_close(actual.detach().cpu().double(), oracle.detach().cpu().double(),
                                   atol=COURSE_ATOL, rtol=COURSE_RTOL)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"{name}: " + " ".join(lines[:4])
    return ""


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 cut to TF32's 10-bit mantissa the way a tensor core reads float32 registers in a
    TF32 MMA: the low 13 bits are dropped (rounded toward zero), kept in float32."""
    bits = x.float().contiguous().view(torch.int32)
    special = ~torch.isfinite(x)  # inf and nan keep their bits
    return torch.where(special, x.float(), (bits & ~0x1FFF).view(torch.float32))


class TF32Matmul(torch.autograd.Function):
    """a @ b as a tensor core does it in TF32, in the forward and in both backward products."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return round_to_tf32(a) @ round_to_tf32(b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = round_to_tf32(grad)
        return grad @ round_to_tf32(b).transpose(-1, -2), round_to_tf32(a).transpose(-1, -2) @ grad


def tf32_attention_and_grads(q, k, v, do, is_causal: bool) -> dict:
    """Plain float32 attention, forward and backward, with every matmul in TF32."""
    from .oracle import MASK_FILL, causal_mask

    q, k, v = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    s = TF32Matmul.apply(q, k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    if is_causal:
        s = s.masked_fill(causal_mask(q.shape[-2], k.shape[-2], q.device), MASK_FILL)
    o = TF32Matmul.apply(torch.softmax(s, dim=-1), v)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.float())
    return {"o": o.detach(), "L": torch.logsumexp(s, dim=-1).detach(), "dq": dq, "dk": dk, "dv": dv}


def handout_grads(q, k, v, do, o, lse, is_causal: bool) -> dict:
    """dq, dk, dv as the handout's Algorithm 2 computes them from the stored O and L, in plain
    PyTorch: every tensor in q's dtype but L (float32), the whole N_q x N_k matrices at once."""
    from .oracle import scores

    scale = q.shape[-1] ** -0.5
    p = torch.exp(scores(q, k, is_causal).float() - lse[..., None].float()).to(q.dtype)
    dp = do @ v.transpose(-1, -2)
    d_row = (do * o).sum(-1, keepdim=True)  # D = rowsum(dO o O)
    ds = p * (dp - d_row)
    return {"dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale, "dv": p.transpose(-1, -2) @ do}


def expected_attention(q, k, v, do, is_causal: bool) -> tuple[dict, dict]:
    """The float64 oracle, and the baseline: plain PyTorch attention in the inputs' dtype, on
    the inputs' device, each gradient a pair (autograd's, the handout's Algorithm 2's)."""
    from .oracle import attention_and_grads

    plain = attention_and_grads(q, k, v, do, is_causal, dtype=q.dtype)
    handout = handout_grads(q, k, v, do.to(q.dtype), plain["o"], plain["L"], is_causal)
    return (attention_and_grads(q, k, v, do, is_causal),
            {**plain, **{name: (plain[name], handout[name]) for name in handout}})


def exact_zero_slack(name: str, q, k, v, do, is_causal: bool, lse: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """One ulp, in q's dtype, of the terms of dS carried to dq or dk (`name`), in float64, on the
    rows of `name` where `exact` (oracle and baseline exactly 0) holds anywhere; 0 elsewhere (the
    module's docstring). `lse`: the oracle's L, so P = exp(S - L) is the oracle's P. Only those
    rows are computed: row 0 of each causal case, every row of few."""
    from .oracle import MASK_FILL

    u = torch.finfo(q.dtype).eps / 2  # unit roundoff
    q, k, v, do = (t.detach().double().cpu().reshape(-1, *t.shape[-2:]) for t in (q, k, v, do))
    lse = lse.detach().double().cpu().reshape(q.shape[:2])
    scale = q.shape[-1] ** -0.5
    slack = torch.zeros(exact.shape, dtype=torch.float64)
    b, row = exact.cpu().reshape(-1, *exact.shape[-2:]).any(-1).nonzero(as_tuple=True)
    if name == "dq":  # rows are queries i: P_ij over every key j
        s = (k[b] @ q[b, row][..., None]).squeeze(-1) * scale  # (rows, Nk)
        hidden = (torch.arange(k.shape[1])[None, :] > row[:, None]) & is_causal
        p = torch.exp(s.masked_fill(hidden, MASK_FILL) - lse[b, row][:, None])
        terms = p * (v[b].abs() @ do[b, row].abs()[..., None]).squeeze(-1)  # P_ij (|dO_i| . |v_j|)
        values = (terms[:, None, :] @ k[b].abs()).squeeze(1)
    else:  # dk: rows are keys j, P_ij over every query i
        s = (q[b] @ k[b, row][..., None]).squeeze(-1) * scale  # (rows, Nq)
        hidden = (row[:, None] > torch.arange(q.shape[1])[None, :]) & is_causal
        p = torch.exp(s.masked_fill(hidden, MASK_FILL) - lse[b])
        terms = p * (do[b].abs() @ v[b, row].abs()[..., None]).squeeze(-1)
        values = (terms[:, None, :] @ q[b].abs()).squeeze(1)
    slack.view(-1, *exact.shape[-2:])[b, row] = 2 * u * scale * values
    return slack


def judge_attention(got: dict, q, k, v, do, is_causal: bool, expected=None,
                    output_factor: float = OUTPUT_FACTOR, grad_factor: float = GRAD_FACTOR) -> dict:
    """Verdicts for o, L, dq, dk, dv in `got` (those present), against the float64 oracle.

    `expected` is expected_attention(...) when the caller already has it.
    """
    oracle, baseline = expected or expected_attention(q, k, v, do, is_causal)
    verdicts = {}
    for name in ("o", "L", "dq", "dk", "dv"):
        if got.get(name) is not None:
            factor = grad_factor if name.startswith("d") else output_factor
            # L is kept in float32 whatever the inputs' dtype (the handout's on-chip statistics)
            stored = torch.float32 if name == "L" else q.dtype
            slack = None
            plain = baseline[name][0] if isinstance(baseline[name], tuple) else baseline[name]
            exact = (oracle[name] == 0) & (plain == 0)
            if name in ("dq", "dk") and bool(exact.any()):
                slack = exact_zero_slack(name, q, k, v, do, is_causal, oracle["L"], exact)
            verdicts[name] = compare(name, got[name], oracle[name], baseline[name], factor, q.dtype, stored,
                                     slack)
    return verdicts
