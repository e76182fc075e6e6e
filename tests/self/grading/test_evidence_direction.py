"""Every evidence line agrees with its verdict at a glance: a failing check's figures say which limit
was missed, by how much and in the direction that failed; a passing one's say it is within.

- FSDP's fp16 rule (grading/checks/test_fsdp.py): a pass is "within the allowed"; a failure by the
  numbers is "over the allowed ... by"; an FSDP that ignores compute_dtype fails because its result is
  float32 training's, too near it, and its line says that rather than quote the allowance it meets.
- A numeric failure of the flash checks (reference/tolerance.py's verdict reason): "is over the bound
  ..., N times it".
- A timing failure (grading/checks/test_timing.py judge_budget): "over the budget of 3x by ...".
"""
import pytest
import torch

from grading.checks import test_fsdp, test_timing
from reference.tolerance import compare


class Ended(Exception):
    pass


class FakeCheck:
    """What judge_budget reads and calls of a check: its verdict and evidence, kept."""

    def __init__(self):
        self.verdict = self.evidence = None

    def fail(self, diagnosis, evidence="", **_):
        self.verdict, self.evidence = "failed", evidence
        raise Ended(diagnosis)

    def ok(self, evidence="", **_):
        self.verdict, self.evidence = "passed", evidence


def test_fsdp_within_the_fp16_rule_says_within():
    line = test_fsdp.within_fp16_rule(1.3e-6, 1.3e-6, 2.4e-5)
    assert line.startswith("max difference from fp16-compute training 1.3e-06, within the allowed 2.4e-05"), line


def test_fsdp_over_the_fp16_rule_says_by_how_much():
    line = test_fsdp.over_fp16_rule(0.5, 1.3e-6, 2.4e-5)
    assert line.startswith("max difference from fp16-compute training 0.5, over the allowed 2.4e-05") and \
        "by 0.5 (" in line, line


def test_fsdp_ignoring_compute_dtype_says_it_is_too_near_float32_training():
    """The bundled fsdp_compute_dtype_ignored's figures: 7.5e-09 from float32 training, 1.3e-06 from
    fp16-compute training. The line used to quote the fp16 allowance it met ("allowed 3 x ..."),
    which reads like a pass under a failing verdict."""
    line = test_fsdp.as_float32_training(7.5e-9, 1.3e-6, 1.3e-6)
    assert line.startswith("max difference from float32 training 7.5e-09, under the 1.3e-06 by which computing in "
                           "float16 moves training away from it: the parameters are float32 training's"), line
    assert "allowed" not in line
    close_gap = test_fsdp.as_float32_training(3e-6, 1e-6, 1e-6)  # float16 barely moves training here
    assert "too little for the numbers to tell the two apart, so the dtypes the ranks saw decide" in close_gap


def test_a_numeric_failure_says_how_far_over_its_bound():
    oracle = torch.zeros(4, 8, dtype=torch.float64)
    got = oracle.clone()
    got[1, 2] = 0.37
    verdict = compare("dq", got, oracle, oracle, factor=2.0, dtype=torch.float32)
    assert not verdict.ok
    times = f"{0.37 / verdict.max_bound:.3g}"
    assert verdict.reason.startswith(f"dq max error 0.37 at index (1, 2) is over the bound {verdict.max_bound:.3g}, "
                                     f"{times} times it (oracle 0, got 0.37)"), verdict.reason


TIMING = {"student_ms": 23.7, "student_passes": 5, "reference_ms": 3.0, "reference_passes": 40, "sdpa_ms": None,
          "ratio": 7.9, "first_ms": 23.7, "decided_early": False, "stopped_after_s": None}
BUDGET = {"ratio": 3.0}


def test_a_timing_failure_says_how_far_over_its_budget():
    c = FakeCheck()
    with pytest.raises(Ended):
        test_timing.judge_budget(c, BUDGET, timing_case(), TIMING)
    assert c.verdict == "failed" and c.evidence.startswith(
        "7.90x the reference's time, over the budget of 3x by 4.90x; student 23.7 ms a pass"), c.evidence


def test_a_timing_pass_says_within_its_budget():
    c = FakeCheck()
    test_timing.judge_budget(c, BUDGET, timing_case(), {**TIMING, "student_ms": 3.6, "ratio": 1.2})
    assert c.verdict == "passed" and c.evidence.startswith("1.20x the reference's time, within the budget of 3x;")


def timing_case():
    """The timing case's identity only (judge_budget names it in its line)."""
    from fa2_sandbox.wire.cases import FlashCase
    return FlashCase(batch=(1,), n_queries=4096, n_keys=4096, head_dim=64, dtype="bfloat16", is_causal=True)
