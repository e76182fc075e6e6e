"""An output in another dtype than the inputs fails only the checks that ask for the dtype.

The official tests compare with torch.testing.assert_close, which checks dtypes (course tier), and
the checks beyond the handout ask for the input dtype (advice: hygiene, the PyTorch slot's bf16
tier). The handout asks for none, so its requirements judge the numbers alone. Found grading the
corpus on an H100: Atle18's Triton kernel returns a float32 o for bfloat16 inputs, and its
handout-tier forward checks failed on the dtype alone.
"""
from types import SimpleNamespace

import pytest
import torch

from fa2_sandbox.wire.cases import FlashCase
from grading.check import Check
from grading.checks import test_flash
from grading.checks.flash_checks import expected
from grading.checks.test_flash import judge
from grading.declaration import declared_for
from grading.rubric import Rubric

SEED = 20261125
CASE = FlashCase(batch=(2,), n_queries=64, n_keys=64, head_dim=16, dtype="bfloat16")
FP32_CASE = FlashCase(batch=(2,), n_queries=64, n_keys=64, head_dim=16)


def judged(slot, tier, case, answer):
    """The check's record after judging `answer` (o, L) with the rule of `tier`."""
    rubric = Rubric()
    grading = SimpleNamespace(seed=SEED, on_gpu=False, rubric=rubric, oracles=None)
    declared = declared_for(test_flash.test_forward, {"slot": slot, "tier": tier, "case": case}, rubric)
    check = Check(SimpleNamespace(name="student"), declared, case, rubric)
    try:
        judge(check, grading, slot, tier, case, answer, ["o", "L"])
    except pytest.fail.Exception:
        pass
    return check.record


def exact(case, o_dtype):
    """The float64 oracle's o (in `o_dtype`) and L (float32): the best answer a kernel can give."""
    oracle = expected(case, SEED, "cpu")[1][0]
    return {"o": oracle["o"].to(o_dtype), "L": oracle["L"].float()}


def test_handout_tier_judges_the_numbers_of_a_float32_output():
    record = judged("triton", "handout", CASE, exact(CASE, torch.float32))
    assert record.outcome == "passed", record.output
    assert "o is float32, expected bfloat16" in record.output  # said, not counted


def test_advice_tier_still_asks_for_the_input_dtype():
    record = judged("pytorch", "bf16", CASE, exact(CASE, torch.float32))
    assert record.outcome == "failed" and record.advice
    assert record.diagnosis == "o is float32, expected bfloat16."


def test_course_tier_asks_for_the_dtype_as_assert_close_does():
    record = judged("triton", "course", FP32_CASE, exact(FP32_CASE, torch.float64))
    assert record.outcome == "failed"
    assert record.diagnosis == "o is float64, expected float32."


def test_a_wrong_answer_in_another_dtype_still_fails_the_handout_tier():
    answer = exact(CASE, torch.float32)
    answer["o"] = answer["o"] * 1.05
    record = judged("triton", "handout", CASE, answer)
    assert record.outcome == "failed"
    assert "expected bfloat16" not in record.diagnosis
