"""The Triton memory check charges no bug twice (grading/checks/test_memory.py).

Its case is bf16 on a GPU. A class that raises in bf16 (a kernel that fails to compile for bf16
inputs) fails the bf16 checks already; the memory check measures it in float32 instead, and fails
for raising only where it runs in neither dtype. Runs on any machine: the runner's replies are
made up here, as the GPU would send them.
"""
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.client import Reply
from grading.check import Check
from grading.checks import test_memory
from grading.rubric import Rubric

MiB = 2**20
COMPILE_ERROR = "CompilationError: at 12:14: Both operands must be same dtype. Got fp32 and bf16"


def ran(peak_mib: float) -> Reply:
    seen = {"peak_bytes": peak_mib * MiB, "largest_numel": 0, "largest_shape": []}
    return Reply("ok", result={"forward": seen, "backward": seen})


class Grading:
    """The grading fixture on a GPU, answering each flash call by the case's dtype."""

    on_gpu, seed, rubric = True, 0, Rubric()

    def __init__(self, **replies):
        self.replies, self.asked = replies, []

    def call_cached(self, submission, key, request, timeout, what):
        dtype = request["case"]["dtype"]
        self.asked.append(dtype)
        return self.replies[dtype], {}


def grade(phase: str, **replies):
    """(outcome, output, dtypes asked for) of the Triton memory check of `phase`."""
    grading, submission, made = Grading(**replies), SimpleNamespace(name="alice"), []

    def check(part, name, case="", tier="default"):
        made.append(Check(submission, part, name, case, tier, grading.rubric))
        return made[-1]

    try:
        test_memory.test_no_score_matrix(grading, submission, check, "triton", phase)
    except pytest.fail.Exception:
        pass
    return made[0].record.outcome, made[0].record.output, grading.asked


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_class_that_raises_in_bf16_is_measured_in_float32(phase):
    outcome, output, asked = grade(phase, bfloat16=Reply("error", COMPILE_ERROR), float32=ran(40))
    assert outcome == "passed" and asked == ["bfloat16", "float32"], output
    assert "Measured in float32: in bfloat16 the " + phase + " raised CompilationError" in output
    # and a matrix seen in float32 fails, against float32's byte limit (N x N fp32 is 1 GiB)
    outcome, output, _ = grade(phase, bfloat16=Reply("error", COMPILE_ERROR), float32=ran(1100))
    assert outcome == "failed" and "an N x N matrix is materialised" in output, output


def test_a_backward_that_raises_in_bf16_is_measured_in_float32():
    bf16 = ran(40)
    bf16.result = {**bf16.result, "backward_error": {"status": "error", "message": COMPILE_ERROR}}
    del bf16.result["backward"]
    outcome, output, asked = grade("backward", bfloat16=bf16, float32=ran(40))
    assert outcome == "passed" and asked == ["bfloat16", "float32"], output
    # the forward ran in bf16, and is measured there
    outcome, output, asked = grade("forward", bfloat16=bf16, float32=ran(40))
    assert outcome == "passed" and asked == ["bfloat16"] and "float32" not in output, output


def test_a_class_that_runs_in_neither_dtype_fails_for_raising():
    outcome, output, _ = grade("forward", bfloat16=Reply("error", COMPILE_ERROR),
                               float32=Reply("error", "ValueError: no"))
    assert outcome == "error" and output.startswith("raised " + COMPILE_ERROR), output


@pytest.mark.parametrize("bf16", [Reply("crash", "ran out of GPU memory: CUDA out of memory"), ran(1100)],
                         ids=["out-of-memory", "n-by-n"])
def test_what_bf16_says_about_memory_is_never_retried(bf16):
    outcome, output, asked = grade("forward", bfloat16=bf16, float32=ran(40))
    assert outcome in ("crash", "failed") and asked == ["bfloat16"], output

