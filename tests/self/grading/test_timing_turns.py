"""The timing budget's measurement (grading/checks/flash_checks.py medians_ms): the student's and
the reference's runners take turns call by call, and a failed call ends the timing."""
from types import SimpleNamespace

from grading.checks.flash_checks import medians_ms

BUDGET = {"repeats": 3, "iters": 2}


class FakeRunner:
    """A runner whose call takes `ms` per iteration on the harness's clock, logging who ran when."""

    def __init__(self, name, ms, log, fail_at=None):
        self.name, self.ms, self.log, self.fail_at = name, ms, log, fail_at

    def call(self, request, timeout):
        self.log.append((self.name, tuple(request["seeds"])))
        ok = len([n for n, _ in self.log if n == self.name]) != self.fail_at
        return SimpleNamespace(ok=ok, phases={"timed": 10.0, "saving": 10.0 + self.ms * len(request["seeds"]) / 1000})


def test_runners_take_turns_on_the_same_seeds():
    log = []
    (student, _), (reference, _) = medians_ms([FakeRunner("student", 3.0, log), FakeRunner("reference", 1.5, log)],
                                              {"seed": 7}, 60, BUDGET)
    assert [name for name, _ in log] == ["student", "reference"] * 3
    assert log[0][1] == log[1][1] == (7, 8) and log[2][1] == (1007, 1008)
    assert round(student, 6) == 3.0 and round(reference, 6) == 1.5


def test_a_failed_call_ends_the_timing():
    log = []
    (student, student_reply), (reference, reference_reply) = medians_ms(
        [FakeRunner("student", 3.0, log, fail_at=2), FakeRunner("reference", 1.5, log)], {"seed": 7}, 60, BUDGET)
    assert [name for name, _ in log] == ["student", "reference", "student"]
    assert student is None and not student_reply.ok
    assert reference is None and reference_reply is None
