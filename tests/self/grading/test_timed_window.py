"""A timing budget's window (grading/checks/timed_window.py) lasts a bounded time whatever the
student's speed. The stall it ends: a window measured 5 calls x 13 passes of the student, then of
the reference, and drew inputs and wrote outputs while every other runner stood paused, so one
slow kernel held the class for a minute or more (issue 40)."""
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.client import Reply, SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire import outcomes
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash, PrepareTiming, WarmTiming
from grading.checks import timed_window as tw
from grading.checks.test_timing import chosen_configs

ROOT = Path(__file__).resolve().parents[3]
CASE = FlashCase(batch=(64,), n_queries=4096, n_keys=4096, head_dim=64, dtype="bfloat16", is_causal=True)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeRunner:
    """A runner whose passes take `ms` each on `clock`, logging each call's passes, stretch and
    timeout; a call that would outlast its timeout is stopped there with the stretches finished."""

    def __init__(self, name, ms, clock, log, fail=False, first_call_ms=None):
        self.name, self.ms, self.clock, self.log, self.fail = name, ms, clock, log, fail
        self.first_call_ms = first_call_ms  # the passes of its first call take this long (a disturbed start)

    def call(self, request, timeout):
        self.log.append((self.name, request.passes, request.per_sync, round(timeout, 3)))
        if self.fail:
            return Reply(outcomes.ERROR, message="RuntimeError: boom")
        ms, self.first_call_ms = self.first_call_ms or self.ms, None
        phases, start = {"timed": self.clock.now}, self.clock.now
        for i in range(1, request.passes + 1):
            if self.clock.now + ms / 1000 > start + timeout:
                self.clock.now = start + timeout
                return Reply(outcomes.TIMEOUT, message="timed out", phases=phases)
            self.clock.now += ms / 1000
            if i % request.per_sync == 0 or i == request.passes:
                phases[f"pass {i}"] = self.clock.now
        return Reply(outcomes.OK, phases=phases)


def window(student_ms, reference_ms=1.5, student_passes=12, fail=False, disturbed=None):
    """`disturbed`: (the student's first pass, the reference's first round), in ms a pass."""
    clock, log = Clock(), []
    student = FakeRunner("student", student_ms, clock, log, fail, first_call_ms=disturbed and disturbed[0])
    reference = FakeRunner("reference", reference_ms, clock, log, first_call_ms=disturbed and disturbed[1])
    started = clock.now
    m = tw.measure(student, reference, CASE, 3.0, started + tw.WINDOW_S, clock, student_passes)
    return m, log, clock.now - started


def test_the_reference_brackets_the_students_passes():
    m, log, held = window(student_ms=3.0)
    assert [(name, passes, per_sync) for name, passes, per_sync, _ in log] == [
        ("reference", 24, 12), ("student", 1, 1), ("student", 11, 4), ("reference", 24, 12)]
    assert len(m.student_ms) == 3 and len(m.reference_ms) == 4 and m.passes == 12
    assert m.ratio == pytest.approx(2.0) and not m.decided_early and m.stopped_after_s is None
    assert set(m.steps) == {"reference", "student's first pass", "student's passes", "reference again"}
    assert held < 0.15  # 2 x 24 reference passes of 1.5 ms, 12 student passes of 3 ms


def test_a_slow_kernel_is_decided_by_its_first_pass():
    m, log, held = window(student_ms=1000.0, student_passes=1)  # a second a pass, 667x the reference
    assert m.decided_early and m.first_ms == 1000.0 and m.passes == 1
    assert [name for name, *_ in log] == ["reference", "student"]
    assert held <= tw.WINDOW_S


def test_a_short_first_pass_over_the_line_is_not_decided_alone():
    """A first pass of 15 ms, 10x the reference (the DECIDED line is 2 x 3 = 6x), is shorter than
    EARLY_MIN_MS: its 11 other passes run (0.17 s), and the verdict is the fastest stretch's; a
    first pass timed alone on a busy CPU read 6 to 10 times what the same kernel's stretches read."""
    m, log, held = window(student_ms=15.0)
    assert not m.decided_early and len(m.student_ms) == 3 and m.ratio == pytest.approx(10.0)
    assert [name for name, *_ in log] == ["reference", "student", "student", "reference"]
    # 600 ms a pass: the others would hold the window to its end, and the first decides
    m, log, held = window(student_ms=600.0)
    assert m.decided_early and m.passes == 1


def test_a_window_disturbed_at_its_start_does_not_decide_the_budget():
    """As measured on a 2-GPU host: the reference's first round read 10 ms a pass (1.6 ms
    elsewhere) and the student's first pass 156 ms, 16x the reference and over the DECIDED line,
    for a kernel of 2.5 ms a pass. Its later passes and the reference's second round, undisturbed,
    judge it: 2.5 / 1.6, within the budget of 3x."""
    m, log, held = window(student_ms=2.5, reference_ms=1.6, disturbed=(156.0, 10.0))
    assert not m.decided_early and m.first_ms == pytest.approx(156.0)
    assert [name for name, *_ in log] == ["reference", "student", "student", "reference"]
    assert m.ratio == pytest.approx(2.5 / 1.6) and held <= tw.WINDOW_S


def test_a_pass_that_outlasts_the_window_is_stopped_at_its_deadline():
    m, log, held = window(student_ms=60_000.0, student_passes=1)  # a minute a pass
    reference_round = tw.REFERENCE_PASSES * 1.5 / 1000
    assert m.stopped_after_s == pytest.approx(tw.WINDOW_S - tw.RESERVE_S - reference_round, abs=0.01)
    assert log[1][0] == "student" and log[1][3] <= tw.WINDOW_S - tw.RESERVE_S
    assert held <= tw.WINDOW_S


def test_the_students_later_passes_fit_what_the_window_has_left():
    # Planned for 12 from a warm pass under load; on the quiet GPU each takes 400 ms, under
    # EARLY_MIN_MS, so undecided: after the reference's round (36 ms) and the first pass, 5 more fit.
    m, log, held = window(student_ms=400.0)
    assert not m.decided_early and m.passes == 6 and m.stopped_after_s is None
    assert held <= tw.WINDOW_S


def test_a_student_call_that_fails_ends_the_measurement():
    m, log, _ = window(student_ms=3.0, fail=True)
    assert m.failed == "student" and m.failure.message == "RuntimeError: boom"
    assert m.ratio is None


def test_each_stretch_is_timed_from_its_phase_messages():
    assert tw.pass_times_ms({"timed": 1.0, "pass 1": 1.002, "pass 2": 1.005}) == pytest.approx([2.0, 3.0])
    assert tw.pass_times_ms({"timed": 1.0, "pass 4": 1.008, "pass 6": 1.014}) == pytest.approx([2.0, 3.0])
    assert tw.pass_times_ms({"setup": 1.0}) == []


SLOW = '''
import time
import torch


class Slow(torch.autograd.Function):
    """Plain attention that sleeps {seconds} s in its forward: a kernel that slow, on a CPU."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        time.sleep({seconds})
        p = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        ctx.save_for_backward(q, k, v, p)
        return p @ v

    @staticmethod
    def backward(ctx, do):
        q, k, v, p = ctx.saved_tensors
        dp = do @ v.transpose(-1, -2)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) / q.shape[-1] ** 0.5
        return ds @ k, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do, None


def get_flashattention_autograd_function_pytorch():
    return Slow
'''


def test_a_real_runner_that_outlasts_the_window_is_stopped_within_it(tmp_path):
    """The stall, with real runners on the CPU: a class whose pass takes 5 s. In the window its
    first pass is stopped at the deadline, with its runner, and the window
    (here: from the reference's first pass to the measurement's end) stays within WINDOW_S."""
    (tmp_path / "adapters.py").write_text(textwrap.dedent(SLOW.format(seconds=5)))
    case = FlashCase(batch=(2,), n_queries=33, n_keys=33, head_dim=16, dtype="float32", is_causal=False)
    student = SubmissionRunner(load_submission(tmp_path), import_timeout=120)
    reference = SubmissionRunner(load_submission(ROOT / "submissions" / "reference"), import_timeout=120)
    try:
        for runner, passes in ((student, 1), (reference, tw.REFERENCE_INPUTS)):
            warm = runner.call(WarmTiming("pytorch", case, seed=5, device="cpu"), 120)
            assert warm.ok and chosen_configs(warm) == []  # nothing autotuned (steady_autotune.py)
            assert runner.call(PrepareTiming("pytorch", case, seed=5, passes=passes, device="cpu"), 120).ok
        started = time.monotonic()
        m = tw.measure(student, reference, case, 3.0, started + tw.WINDOW_S, student_passes=1, device="cpu")
        held = time.monotonic() - started
    finally:
        student.close()
        reference.close()
    assert m.stopped_after_s is not None and m.first_ms is None and len(m.reference_ms) == 2
    assert held <= tw.WINDOW_S + 0.5  # the kill and the reap of the stopped runner
    # The reference's own record of the same two stretches, from its first round
    assert m.reference_rounds_before == [0]
    assert [s["passes"] for s in m.reference_own] == [tw.REFERENCE_STRETCH] * 2
    for own, outside in zip(m.reference_own, m.reference_ms):
        assert own["gpu_ms"] is None and 0 < own["enqueue_ms"] <= own["own_ms"]
        assert own["own_ms"] <= outside * 1.5 + 1  # the harness's stamps add the messages' way, little on an idle CPU


def test_what_a_warm_up_says_its_autotuners_chose_is_kept_bounded():
    """The runner's word (steady_autotune.py): kept in the timing row to compare runs, never judged,
    so whatever a submission's process sends is cut to a few short strings."""
    said = [{"kernel": "flash_fwd", "config": "BLOCK: 64"}, "junk", {"kernel": "k" * 500}] + [{}] * 40
    kept = chosen_configs(Reply(outcomes.OK, result={"chosen": said}))
    assert kept[0] == {"kernel": "flash_fwd", "config": "BLOCK: 64"}
    assert len(kept) == 15 and len(kept[1]["kernel"]) == 100  # 16 looked at, the string left out
    assert chosen_configs(Reply(outcomes.OK, result={"chosen": "all of them"})) == []
    assert chosen_configs(Reply(outcomes.TIMEOUT)) == []


def test_a_warm_up_gets_what_the_start_left_of_the_limit_and_its_timeout_is_a_sentence():
    """The timing check's warm-up ends `timing` seconds after the check began, its runner's start
    and import included; the reference's warm-up keeps the whole limit (its slowness is the
    grader's, never the student's)."""
    from grading.checks import test_timing

    asked = []

    class Runner:
        def __init__(self, reply):
            self.reply = reply

        def call(self, request, timeout, until=None):
            asked.append((request.op, round(timeout), until is not None))
            return self.reply

    class Failed(Exception):
        pass

    class Check:
        def fail(self, sentence, evidence="", outcome="failed", **details):
            raise Failed(sentence, evidence, outcome)

    timed_out = Reply(outcomes.TIMEOUT, message="timed out after 20 s in setup", seconds=20.0)
    ready = Reply(outcomes.OK, seconds=3.0)
    grading = SimpleNamespace(seed=5)
    case = FlashCase(batch=(64,), n_queries=4096, n_keys=4096, head_dim=64, dtype="bfloat16", is_causal=True)
    with pytest.raises(Failed) as failed:
        test_timing.measure_budget(Check(), grading, SimpleNamespace(name="alice"), (Runner(timed_out), Runner(ready)),
                                   "triton", case, {"ratio": 3.0}, 120.0, time.monotonic() - 100.0)
    # the student's warm-up ends at the check's deadline whatever holds it; the reference's has none
    assert sorted(asked) == [("warm_timing", 20, True), ("warm_timing", 120, False)]
    sentence, evidence, outcome = failed.value.args
    assert sentence.startswith("its warm-up at the timing case (bf16-4096x4096-d64-causal: compiling, autotuning")
    assert ("had not ended 120 s after the check began (its runner's start and import, and any wait for the "
            "GPU, included)") in sentence
    assert evidence == "timed out after 20 s in setup" and outcome == "timeout"


class PausedAllAlong:
    """A reservation that timing windows keep pausing (gpu_ledger.Holding): every poll, a second more."""

    def __init__(self):
        self.paused = 0.0

    def paused_s(self):
        self.paused += 1.0
        return self.paused


def test_a_warm_up_paused_by_window_after_window_still_ends_at_its_deadline(tmp_path):
    """The stall of a timing-only run: 16 timing checks at once, their windows back to back, and a
    cold warm-up credited with every pause ran past 200 s of a 120 s limit, holding its worker's
    next check behind it (notes/grading-speed.md, 2026-11-28). With `until` the call ends there
    whatever paused it; without, each pause moves its deadline on (a fair timeout for a call that
    is not a warm-up): here it waits the class's whole 8 s out."""
    (tmp_path / "adapters.py").write_text(textwrap.dedent(SLOW.format(seconds=8)))
    case = FlashCase(batch=(2,), n_queries=33, n_keys=33, head_dim=16, dtype="float32", is_causal=False)
    request = Flash("pytorch", case, seed=5)
    def timed(**until):  # a runner of its own: after a timeout its runner fails that case at once
        runner = SubmissionRunner(load_submission(tmp_path), import_timeout=120)
        try:
            assert runner.import_failure() is None
            started = time.monotonic()
            reply = runner._call(request, 2.0, holding=PausedAllAlong(), **{k: started + v for k, v in until.items()})
            return reply, time.monotonic() - started
        finally:
            runner.close()

    reply, bounded = timed(until=2.0)
    credited, unbounded = timed()
    assert reply.status == "timeout" and bounded < 3.0
    assert credited.ok and unbounded >= 8.0


def test_a_window_record_keeps_why_real_time_was_refused():
    # every timing check of a class run on a GPU failed as a grader error when the refusal (a
    # sentence, or None) was rounded with the window's seconds
    window = {"raised_threads": 18, "real_time_threads": 0, "real_time_refused": "Operation not permitted",
              "in_flight_s": 0.123456, "measured_s": 1.98765}
    record = tw.window_record(window, {"student": 0.5555})
    assert record == {"raised_threads": 18, "real_time_threads": 0, "real_time_refused": "Operation not permitted",
                      "in_flight_s": 0.12, "measured_s": 1.99, "steps": {"student": 0.56}}
    assert tw.window_record({**window, "real_time_refused": None, "early": True}, {}) == {
        **record, "real_time_refused": None, "early": True, "steps": {}}
