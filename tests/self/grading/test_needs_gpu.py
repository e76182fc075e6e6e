"""A Triton class that does not run under the CPU's Triton interpreter is "needs a GPU" in every
Triton check, and one that does is judged there (grading/checks/flash_checks.py needs_gpu).

The runner's replies are made up here, keyed by case, with errors raised and described the way
the runner describes them (fa2_sandbox/runner/errors.py describe, traceback.format_exc).
"""
import inspect
import traceback
from types import SimpleNamespace

import pytest
import torch

from fa2_sandbox.harness.client import Reply
from fa2_sandbox.runner.errors import describe
from fa2_sandbox.wire.cases import FlashCase
from grading.check import Check
from grading.checks import test_flash, test_memory, test_timing
from grading.checks.flash_checks import machine_error
from grading.declaration import declared_for
from grading.matrix import COURSE_CASE, flash_cases, replay_cases
from grading.rubric import Rubric
from tests.self.fixtures.refusals import launch, look_up_dtype, refuse_cpu_tensors, refuse_cpu_tensors_saying_so


def raised(function, *args) -> dict:
    """{"message", "traceback"} of what `function(*args)` raised, as the runner sends them."""
    try:
        function(*args)
    except Exception as exc:
        return {"message": describe(exc), "traceback": traceback.format_exc(limit=-8)}
    raise AssertionError(f"{function.__name__} raised nothing")


CPU_TENSOR = torch.zeros(2)
BARE_ASSERT = raised(refuse_cpu_tensors, CPU_TENSOR)
CUDA_ASSERT = raised(refuse_cpu_tensors_saying_so, CPU_TENSOR)
KEY_ERROR = raised(launch, CPU_TENSOR)
NO_CUDA = raised(lambda: torch.empty(2, device="cuda")) if not torch.cuda.is_available() else None


def test_an_error_of_the_machine_names_cuda_or_what_the_interpreter_lacks():
    assert BARE_ASSERT["message"] == "AssertionError"  # named by the line that raised it alone
    assert machine_error(**BARE_ASSERT)
    assert machine_error(**CUDA_ASSERT)
    if NO_CUDA is not None:  # "Torch not compiled with CUDA enabled", or no driver
        assert machine_error(**NO_CUDA), NO_CUDA
    assert machine_error("InterpreterError: NotImplementedError('inline_asm not supported in interpreter mode')", "")
    assert machine_error("RuntimeError: Found no NVIDIA driver on your system.", "")


def test_an_error_of_the_class_is_its_own():
    # A frame above names cuda (the call line shown for `launch`); the line that raised does not.
    assert "is_cuda" in KEY_ERROR["traceback"] and KEY_ERROR["message"] == "KeyError: torch.float32"
    assert not machine_error(**KEY_ERROR)
    assert not machine_error("CompilationError: at 12:14: Both operands must be same dtype. Got fp32 and bf16", "")
    assert not machine_error("InterpreterError: ValueError('axis 2 out of bounds for shape (16, 16)')", "")
    assert not machine_error("AssertionError", "")


# -- the checks, with made-up replies ---------------------------------------------------------------

def error(raised: dict) -> Reply:
    return Reply("error", raised["message"], traceback=raised["traceback"])


def ran(backward_error: dict | None = None) -> Reply:
    """A call whose forward answered (its tensors are not needed: nothing here is judged)."""
    seen = {"peak_bytes": 0, "largest_numel": 0, "largest_shape": [], "forbidden_ops": {}, "triton_launches": 1}
    result = {"forward": seen, "n_lse": 1, "inputs_unchanged": True}
    if backward_error:
        result["backward_error"] = {"status": "error", **backward_error}
    else:
        result["backward"] = seen
    return Reply("ok", result=result)


class FakeSession:
    """The session fixture, answering each flash call by its case: `course` for the course case,
    `other` for every other case."""

    seed, rubric = 0, Rubric()

    def __init__(self, on_gpu: bool, course: Reply, other: Reply):
        self.on_gpu, self.course, self.other = on_gpu, course, other
        self.stubs, self.asked = {"alice": set()}, []

    def fail_if_stub(self, check, submission, function):
        pass

    def call_cached(self, submission, request, timeout, what):
        case = request.case
        self.asked.append(case)
        return (self.course if case == COURSE_CASE else self.other), {}


def grade(test, session, *args) -> Check:
    """The Check that `test(session, submission, check, *args)` settled: the check its module's
    `grading` marker declares for it (grading/declaration.py), as a collected test gets it."""
    submission, made = SimpleNamespace(name="alice"), []
    params = dict(zip(list(inspect.signature(test).parameters)[3:], args))
    declared = declared_for(test, params, session.rubric)

    def check(case=""):
        made.append(Check(submission, declared, case, session.rubric))
        return made[-1]

    try:
        test(session, submission, check, *args)
    except (pytest.fail.Exception, pytest.skip.Exception):
        pass
    return made[0]


def triton_case(tier: str, on_gpu: bool = False, dtype: str = "float32") -> FlashCase:
    return next(c for t, c in flash_cases("triton", on_gpu) if t == tier and c.dtype == dtype and c != COURSE_CASE)


TIERS = ("course", "handout", "causal", "robustness")


@pytest.mark.parametrize("refusal", [CUDA_ASSERT, BARE_ASSERT], ids=["with-message", "bare"])
def test_a_class_that_refuses_cpu_tensors_needs_a_gpu_in_every_triton_check(refusal):
    session = FakeSession(on_gpu=False, course=error(refusal), other=error(refusal))
    checks = [grade(test, session, "triton", tier, triton_case(tier)) for tier in TIERS
              for test in (test_flash.test_forward, test_flash.test_backward)]
    tier, case = next((t, c) for t, c in flash_cases("triton", False) if c.head_dim == 48)  # a refusable head dim
    checks += [grade(test_flash.test_forward, session, "triton", tier, case),
               grade(test_flash.test_hygiene, session, *test_flash.HYGIENE[1]),
               grade(test_flash.test_no_library_attention, session, *test_flash.IMPLEMENTATION[1]),
               grade(test_flash.test_replay, session, "triton", *replay_cases("triton", False)[0]),
               grade(test_memory.test_no_score_matrix, session, "triton", "forward"),
               grade(test_memory.test_no_score_matrix, session, "triton", "backward"),
               grade(test_timing.test_budget, session, "triton")]
    for c in checks:
        assert c.record.outcome == "not_graded_here", (c.record.check, c.record.case, c.record.output)
    for c in checks[:-3]:  # the flash checks quote the class's error; memory and timing need a GPU anyway
        assert c.record.output == ("not graded here: it needs a GPU: the class does not run under the CPU's "
                                          "Triton interpreter (the course case, B=4, N=128, d=64, float32, raised "
                                          f"{refusal['message']})"), c.record.output
    assert set(session.asked) == {COURSE_CASE}  # no other case was run to learn it


def test_on_a_gpu_nothing_changes():
    session = FakeSession(on_gpu=True, course=error(CUDA_ASSERT), other=error(CUDA_ASSERT))
    for tier in ("handout", "causal"):
        for test in (test_flash.test_forward, test_flash.test_backward):
            c = grade(test, session, "triton", tier, triton_case(tier, on_gpu=True))
            assert c.record.outcome == "error" and "Triton kernel only support CUDA" in c.record.output, c.record.output


def test_a_class_that_runs_the_course_case_is_judged_on_every_other_case():
    # It runs the course case under the interpreter, and raises on another case, even naming CUDA:
    # that error is its own, charged as on a GPU.
    session = FakeSession(on_gpu=False, course=ran(), other=error(CUDA_ASSERT))
    for tier in ("handout", "causal", "robustness"):
        for test in (test_flash.test_forward, test_flash.test_backward):
            c = grade(test, session, "triton", tier, triton_case(tier, dtype="bfloat16"))
            assert c.record.outcome == "error", (tier, c.record.output)
            # the backward says its case got no answer, as the forward raised (issue 41)
            said = "raised" if test is test_flash.test_forward else "no answer to judge: the forward raised"
            assert c.record.output.startswith(f"{said} AssertionError: Triton kernel only support CUDA")


def test_an_error_of_the_class_on_the_course_case_fails_the_other_cases():
    session = FakeSession(on_gpu=False, course=error(KEY_ERROR), other=error(KEY_ERROR))
    for tier in ("handout", "causal"):
        c = grade(test_flash.test_forward, session, "triton", tier, triton_case(tier))
        assert c.record.outcome == "error" and "raised KeyError: torch.float32" in c.record.output, c.record.output
    # the course tier alone stays "needs a GPU", as the official tests skip the class without one
    c = grade(test_flash.test_forward, session, "triton", "course", COURSE_CASE)
    assert c.record.outcome == "not_graded_here" and "KeyError: torch.float32" in c.record.output


def test_a_backward_that_refuses_cpu_tensors_needs_a_gpu_in_the_backward_checks_only():
    session = FakeSession(on_gpu=False, course=ran(backward_error=CUDA_ASSERT),
                      other=error(raised(look_up_dtype, CPU_TENSOR)))
    backward = grade(test_flash.test_backward, session, "triton", "handout", triton_case("handout"))
    assert backward.record.outcome == "not_graded_here", backward.record.output
    assert ("(the backward of the course case, B=4, N=128, d=64, float32, raised AssertionError: Triton kernel only "
            "support CUDA)") in backward.record.output
    forward = grade(test_flash.test_forward, session, "triton", "handout", triton_case("handout"))
    assert forward.record.outcome == "error" and "KeyError: torch.float32" in forward.record.output


def test_the_pytorch_class_is_judged_on_the_cpu_whatever_it_raises():
    # The official tests run the PyTorch class on the CPU: refusing CPU tensors there is a failure.
    session = FakeSession(on_gpu=False, course=error(CUDA_ASSERT), other=error(CUDA_ASSERT))
    tier, case = next((t, c) for t, c in flash_cases("pytorch", False) if t == "handout")
    c = grade(test_flash.test_forward, session, "pytorch", tier, case)
    assert c.record.outcome == "error" and "Triton kernel only support CUDA" in c.record.output
