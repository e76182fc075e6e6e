"""How close is close enough: the rule every numerical comparison in this project uses.

An implementation's error is measured against the float64 oracle and judged relative to the
error of plain PyTorch attention run in the same dtype (FlashAttention's own test rule):

    max|x - oracle|  <= factor * max|plain - oracle|  + atol(dtype)
    mean|x - oracle| <= factor * mean|plain - oracle| + atol(dtype) / 8

factor is 2 for outputs and L, 3 for gradients. The atol of a few ulps keeps the rule sane
when the baseline is (almost) exact. NaN or Inf anywhere fails.
"""
from dataclasses import asdict, dataclass

import torch

OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 3.0

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


def compare(name: str, actual: torch.Tensor, oracle: torch.Tensor, baseline: torch.Tensor,
            factor: float, dtype: torch.dtype) -> Verdict:
    """Judge `actual` against the float64 `oracle`, with `baseline` (plain PyTorch in `dtype`)."""
    atol = ATOL[dtype]
    oracle = oracle.double().cpu()
    actual = actual.detach().double().cpu()
    baseline_err = (baseline.detach().double().cpu() - oracle).abs()
    max_bound = factor * baseline_err.max().item() + atol
    mean_bound = factor * baseline_err.mean().item() + atol / 8
    if actual.shape != oracle.shape:
        return Verdict(False, f"{name} has shape {tuple(actual.shape)}, expected {tuple(oracle.shape)}.",
                       float("inf"), max_bound, float("inf"), mean_bound, (), 0.0, 0.0)
    err = (actual - oracle).abs()
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
        reason = (f"{name} max error {max_err:.3g} at index {worst} exceeds the bound {max_bound:.3g} "
                  f"(oracle {at_worst[0]:.5g}, got {at_worst[1]:.5g}).")
    elif mean_err > mean_bound:
        reason = f"{name} mean error {mean_err:.3g} exceeds the bound {mean_bound:.3g}."
    else:
        reason = ""
    return Verdict(not reason, reason, max_err, max_bound, mean_err, mean_bound, worst, *at_worst)


def expected_attention(q, k, v, do, is_causal: bool) -> tuple[dict, dict]:
    """The float64 oracle, and the baseline: plain PyTorch attention in the inputs' dtype, on
    the inputs' device."""
    from .oracle import attention_and_grads

    return (attention_and_grads(q, k, v, do, is_causal),
            attention_and_grads(q, k, v, do, is_causal, dtype=q.dtype))


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
            verdicts[name] = compare(name, got[name], oracle[name], baseline[name], factor, q.dtype)
    return verdicts
