"""A check whose call changed an input in place names the change first, then the numeric error if
any (grading/checks/changed_inputs.py, Check.preface). The hygiene check's float32 look is held by
the example q_row_nudged_in_place (test_examples.py)."""
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.client import Reply
from fa2_sandbox.runner import flash_call, input_changes
from fa2_sandbox.wire.cases import FlashCase, make_inputs
from grading.check import Check
from grading.checks import test_flash
from grading.checks.changed_inputs import changed_inputs, name_changed_inputs
from grading.checks.test_flash import judge
from grading.declaration import declared_for
from grading.matrix import COURSE_CASE
from grading.rubric import Rubric
from reference.flash_pytorch import FlashAttentionPytorch
from tests.self.fa2_sandbox.test_input_changes import NudgesQ

SEED = 4242
HANDOUT_LIKE = FlashCase(batch=(2,), n_queries=256, n_keys=256, head_dim=32)
Q_NUDGED = {"q": {"changed": 32, "numel": 16384, "largest": 2.93e-4}}


def answered(changed: dict) -> Reply:
    return Reply("ok", result={"changed_inputs": changed})


def test_the_sentence_names_phase_tensor_count_and_size():
    assert changed_inputs(answered({"forward": Q_NUDGED, "backward": {}})) == \
        "the forward changed q in place (32 of 16,384 elements, by up to 0.00029)"
    both = answered({"forward": Q_NUDGED, "backward": {
        "k": {"changed": 1, "numel": 8, "largest": None}, "dO": {"changed": 8, "numel": 8, "largest": 0.5}}})
    assert changed_inputs(both) == ("the forward changed q in place (32 of 16,384 elements, by up to 0.00029); the "
                                    "backward changed k in place (1 of 8 elements, some to inf or NaN) and dO in "
                                    "place (8 of 8 elements, by up to 0.5)")
    assert changed_inputs(both, ("forward",)) == changed_inputs(answered({"forward": Q_NUDGED}))
    reshaped = answered({"forward": {"v": {"changed": 4, "numel": 4, "largest": None, "now": "float32 of shape [2]"}}})
    assert changed_inputs(reshaped) == "the forward changed v in place (it is now float32 of shape [2])"


def test_nothing_is_said_where_nothing_changed_or_nothing_answered():
    assert changed_inputs(answered({"forward": {}, "backward": {}})) == ""
    assert changed_inputs(Reply("error", "RuntimeError: boom")) == ""
    assert changed_inputs(Reply("ok", result={"changed_inputs": "forged"})) == ""


def judged(case, tier, cls):
    """The forward check's record for `cls` on `case`, as test_forward words it."""
    rubric = Rubric()
    grading = SimpleNamespace(seed=SEED, on_gpu=False, rubric=rubric, oracles=None)
    declared = declared_for(test_flash.test_forward, {"slot": "pytorch", "tier": tier, "case": case}, rubric)
    check = Check(SimpleNamespace(name="student"), declared, case, rubric)
    q, k, v, do = make_inputs(case, SEED, "cpu")
    before = input_changes.snapshot({"q": q, "k": k, "v": v})
    tensors = flash_call.run_flash(cls, q, k, v, do, case.is_causal)
    reply = answered({"forward": input_changes.changes(before, {"q": q, "k": k, "v": v})})
    try:
        name_changed_inputs(check, reply, ("forward",))
        judge(check, grading, "pytorch", tier, case, tensors, ["o", "L"])
    except pytest.fail.Exception:
        pass
    return check.record


def test_a_failing_check_names_the_change_before_the_error():
    record = judged(HANDOUT_LIKE, "handout", NudgesQ)
    assert record.outcome == "failed"
    first, error = record.diagnosis.split(": the oracle was computed from the inputs as given; ")
    assert first.startswith("the forward changed q in place (32 of 16,384 elements, by up to ")
    assert " is wrong in " in error  # the numeric error comes after ("o is wrong in 0% of its rows ...")


def test_a_passing_check_names_it_too():
    record = judged(COURSE_CASE, "course", NudgesQ)
    assert record.outcome == "passed"
    assert record.output.startswith("the forward changed q in place (64 of 32,768 elements, by up to ")
    assert "within the official tests' tolerance" in record.output


def test_a_class_that_changes_nothing_reads_as_before():
    record = judged(HANDOUT_LIKE, "handout", FlashAttentionPytorch)
    assert record.outcome == "passed" and record.output.startswith("o: max error")
