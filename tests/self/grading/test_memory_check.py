"""The Triton memory check charges no bug twice (grading/checks/test_memory.py).

Its case is bf16 on a GPU. A class that raises in bf16 (a kernel that fails to compile for bf16
inputs) fails the bf16 checks already; the memory check measures it in float32 instead, and fails
for raising only where it runs in neither dtype, saying what went wrong in each. Runs on any
machine: the runner's replies are made up here, as the GPU would send them.
"""
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.client import Reply
from grading.check import Check
from grading.checks import test_memory
from grading.declaration import declared_for
from grading.rubric import Rubric

MiB = 2**20
COMPILE_ERROR = "CompilationError: at 12:14: Both operands must be same dtype. Got fp32 and bf16"


def ran(peak_mib: float) -> Reply:
    seen = {"peak_bytes": peak_mib * MiB, "largest_numel": 0, "largest_shape": []}
    return Reply("ok", result={"forward": seen, "backward": seen})


class FakeSession:
    """The session fixture on a GPU, answering each flash call by the case's dtype."""

    on_gpu, seed, rubric = True, 0, Rubric()

    def __init__(self, **replies):
        self.replies, self.asked = replies, []

    def call_cached(self, submission, request, timeout, what):
        dtype = request.case.dtype
        self.asked.append(dtype)
        return self.replies[dtype], {}


def grade(phase: str, **replies):
    """(outcome, output, dtypes asked for) of the Triton memory check of `phase`."""
    session, submission, made = FakeSession(**replies), SimpleNamespace(name="alice"), []

    declared = declared_for(test_memory.test_no_score_matrix, {"slot": "triton", "phase": phase}, session.rubric)

    def check(case=""):
        made.append(Check(submission, declared, case, session.rubric))
        return made[-1]

    try:
        test_memory.test_no_score_matrix(session, submission, check, "triton", phase)
    except pytest.fail.Exception:
        pass
    return made[0].record.outcome, made[0].record.output, session.asked


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_class_that_raises_in_bf16_is_measured_in_float32(phase):
    outcome, output, asked = grade(phase, bfloat16=Reply("error", COMPILE_ERROR), float32=ran(40))
    assert outcome == "passed" and asked == ["bfloat16", "float32"], output
    assert "Measured in float32: in bfloat16 the forward raised CompilationError" in output
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


def with_backward_error(reply: Reply, message: str) -> Reply:
    """`reply` (one that ran) with its backward raising `message`."""
    result = {**reply.result, "backward_error": {"status": "error", "message": message, "traceback": "bwd tb"}}
    del result["backward"]
    return Reply("ok", result=result)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_class_that_runs_in_neither_dtype_quotes_both_errors(phase):
    """Issue 34: a class whose kernel did not compile for bf16 and whose float32 path raised
    something else was told only of the compile error; both are quoted, once, in one sentence."""
    outcome, output, asked = grade(phase, bfloat16=Reply("error", COMPILE_ERROR, traceback="bf16 tb"),
                                   float32=Reply("error", "KeyError: torch.float32", traceback="fp32 tb"))
    assert outcome == "error" and asked == ["bfloat16", "float32"], output
    assert output.startswith(f"the {phase} must run in bfloat16, or else in float32, for its memory to be measured, "
                             f"and it ran in neither: in bfloat16 the forward raised {COMPILE_ERROR}; in float32 the "
                             f"forward raised KeyError: torch.float32; fix either and the memory is measured"), output
    assert "bfloat16:\nbf16 tb" in output and "float32:\nfp32 tb" in output, output


def test_a_backward_that_raises_in_both_dtypes_quotes_both_backward_errors():
    outcome, output, _ = grade("backward", bfloat16=with_backward_error(ran(40), COMPILE_ERROR),
                               float32=with_backward_error(ran(40), "IndexError: out of range"))
    assert outcome == "error", output
    assert f"in bfloat16 the backward raised {COMPILE_ERROR}; in float32 the backward raised IndexError: out of " \
           f"range;" in output, output


@pytest.mark.parametrize("fp32,found", [
    (Reply("timeout", "timed out after 300 s in forward (N=16384x16384)"),
     "in float32 the call timed out after 300 s in forward (N=16384x16384);"),
    (Reply("crash", "process died with SIGSEGV during forward"),
     "in float32 the runner crashed: process died with SIGSEGV during forward;"),
], ids=["timeout", "crash"])
def test_a_float32_retry_that_timed_out_or_crashed_says_so(fp32, found):
    outcome, output, _ = grade("forward", bfloat16=Reply("error", COMPILE_ERROR), float32=fp32)
    assert outcome == "error" and f"in bfloat16 the forward raised {COMPILE_ERROR}; {found}" in output, output


def test_the_same_error_in_both_dtypes_is_said_once():
    error = Reply("error", "AttributeError: module 'cs336_systems' has no attribute 'Flash'")
    outcome, output, _ = grade("forward", bfloat16=error, float32=error)
    assert outcome == "error" and output.count("AttributeError") == 1, output
    assert "ran in neither: in both the forward raised AttributeError" in output and "fix it" in output, output


@pytest.mark.parametrize("bf16", [Reply("crash", "ran out of GPU memory: CUDA out of memory"), ran(1100)],
                         ids=["out-of-memory", "n-by-n"])
def test_what_bf16_says_about_memory_is_never_retried(bf16):
    outcome, output, asked = grade("forward", bfloat16=bf16, float32=ran(40))
    assert outcome in ("crash", "failed") and asked == ["bfloat16"], output

