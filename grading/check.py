"""A check: what one grading test found, as a CheckRecord that the plugin records when the test ends.

Tests make one through the `check` fixture (grading/fixtures.py) and settle it with ok, fail, skip,
not_measured, not_here or settle_reply; a call that went wrong ends it by the outcome words of
fa2_sandbox/wire/outcomes.py.

What the grader keeps on a grading test besides (its identity, the check its module declares
for it, the Check it made, the grader's errors of a test run again) is one TestState under the
item's stash, set at collection by the worker's plugin (grading/worker.py). Its identity
(CheckIdentity) is made once there, from the test's parameters, and travels as that value: the
controller's scheduler reads it, never a string parsed back.
"""
import re
from dataclasses import dataclass

import pytest

from fa2_sandbox.wire import course_env, outcomes
from fa2_sandbox.wire.cases import FlashCase
from grading.declaration import Declared
from grading.results.record import NOT_GRADED_HERE, CheckRecord
from grading.tracks import Track, submission_track

# Python's words for an import that found no module: "No module named 'cs336_basics'".
NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def submission_of(item):
    """The name of the submission a grading test grades, or None for any other test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "submission" not in callspec.params:
        return None
    return callspec.params["submission"].name


def check_id(item) -> str:
    """A grading test's id in the records: its module's name and its name,
    "grading.checks.test_flash::test_forward[alice-...]". Not pytest's node id, a path from the
    rootdir, which a checkout and an installed package (or two rootdirs) would give two ways."""
    return f"{item.module.__name__}::{item.name}"


def case_data(case) -> tuple:
    """(id, fields) of a check's case: a case id alone (fields {}), an object with `.id` and
    `.to_json()` (fa2_sandbox.wire.cases.FlashCase), whose fields become plain JSON data, or
    (id, such an object): its fields under an id of the test's own ("triton-<case id>", say)."""
    if isinstance(case, str):
        return case, {}
    label, case = case if isinstance(case, tuple) else (case.id, case)
    fields = {key: list(value) if isinstance(value, tuple) else value for key, value in case.to_json().items()}
    return label, fields


class Check:
    """What one test found, as a CheckRecord (`.record`). Tests fill it through fail, ok, skip,
    update and settle_reply; the plugin settles it when the test's report comes."""

    def __init__(self, submission, declared: Declared, case, rubric):
        case_id, case_fields = case_data(case)
        self.record = CheckRecord(submission=submission.name, part=declared.part, check=declared.check,
                                  case=case_id, case_fields=case_fields, tier=declared.tier, group=declared.group,
                                  source=rubric.source(declared.group), advice=rubric.advice(declared.group))
        self.opening = ""  # what every verdict says first (preface)
        self.root = getattr(submission, "root", None)  # where its pyproject files are read (missing_folder)

    def update(self, **fields):
        self.record.update(**fields)

    def preface(self, sentence: str):
        """Have the verdict, pass or fail, start with `sentence`: what the call did beside the answers
        judged (changed its inputs in place, say), which explains them and must come first."""
        self.opening = sentence

    def _after_preface(self, text: str) -> str:
        return f"{self.opening}; {text}" if self.opening else text

    def missing_folder(self, diagnosis: str) -> str:
        """The diagnosis, ended with the folder to add where it is a `No module named` error on a
        path dependency the submission declares and lacks (a git submodule not checked out, say)."""
        found = NO_MODULE.search(diagnosis)
        if found is None or self.root is None:
            return diagnosis
        advice = course_env.missing_path_dependency(self.root, found.group(1))
        return f"{diagnosis} {advice}" if advice and advice not in diagnosis else diagnosis

    def fail(self, diagnosis: str, evidence: str = "", outcome: str = outcomes.FAILED, **details):
        diagnosis = self.missing_folder(self._after_preface(diagnosis))
        self.update(outcome=outcome, diagnosis=diagnosis,
                    output=diagnosis + ("\n" + evidence if evidence else ""), **details)
        pytest.fail(self.record.output, pytrace=False)

    def ok(self, note: str = "", **details):
        self.update(outcome=outcomes.PASSED, output=self._after_preface(note or "passed"), **details)

    def skip(self, reason: str):
        """The check does not apply to this submission (an adapter of the other template): 0 of 0."""
        self.update(outcome=outcomes.SKIPPED, output=f"skipped: {reason}")
        pytest.skip(reason)

    def not_measured(self, reason: str):
        """What the check measures cannot be read from this submission's structure, though its calls
        worked (an optimizer with no .state, a wrapper with no buffers to read), or the slot is the
        template's stub: neither passed nor failed, 0 of 0, like a skipped check, so it can never
        cost the submission a requirement; a group none of whose checks was measured shares its
        points out (Rubric.weights). Never for a call of the submission's that went wrong: a
        failure never earns points (flash_checks.fail_unanswered)."""
        self.update(outcome=outcomes.SKIPPED, output=f"could not be measured: {reason}")
        pytest.skip(f"could not be measured: {reason}")

    def not_here(self, reason: str):
        """The check cannot run on this machine (it needs a GPU): it keeps its share of the maximum
        and scores nothing until graded where it can run, so the total is provisional."""
        self.update(outcome=NOT_GRADED_HERE, output=f"not graded here: {reason}")
        pytest.skip(f"not graded here: {reason}")

    def settle_reply(self, reply):
        """Fail the check if the runner call itself went wrong; otherwise return quietly."""
        self.update(seconds=reply.seconds)
        if reply.ok:
            return
        outcome = reply.outcome
        if outcome == outcomes.NOT_ATTEMPTED:
            self.fail(f"not attempted: {reply.message}", outcome=outcome)
        if outcome == outcomes.ERROR:
            self.fail(f"raised {reply.message}", reply.traceback, outcome=outcome)
        self.fail(reply.message, outcome=outcome)


@dataclass(frozen=True)
class CheckIdentity:
    """Who one collected grading test is: the records' id (check_id), its submission, its track (the
    runner of the submission its calls go to), its case (its parameters), and the size of its flash
    case. The worker sends it to the controller beside xdist's node id
    (grading/worker.py, grading/controller.py), whose scheduler reads it (grading/scheduler.py)."""
    check_id: str
    submission: str
    track: Track
    case: str  # its parameters but the submission, "pytorch-robustness-fp32-17x17-d64-full" ("" for none)
    case_size: int | None = None  # its flash case's FlashCase.work, as the runner's timeouts compare them
    kernel: str = ""  # its flash case's FlashCase.kernel ("" for none): what a Triton slot compiles for it

    @property
    def shared_call(self) -> str:
        """What it shares a runner call with: the tests of its track with the same case share one
        (forward and backward of a case, say); a test with no case shares none."""
        return self.case or self.check_id

    @property
    def submission_track(self) -> str:
        """Its submission's track, by name: the xdist group it is scheduled in, whose tests run on one
        worker, with one runner."""
        return submission_track(self.submission, self.track)

    def to_json(self) -> dict:
        return {"check_id": self.check_id, "submission": self.submission, "track": self.track.name,
                "case": self.case, "case_size": self.case_size, "kernel": self.kernel}

    @classmethod
    def from_json(cls, data: dict) -> "CheckIdentity":
        return cls(**{**data, "track": Track(data["track"])})


def identify(item, track: Track) -> CheckIdentity:
    """A grading test's identity, from its parameters."""
    params = {name: value for name, value in item.callspec.params.items() if name != "submission"}
    cases = [value for value in params.values() if isinstance(value, FlashCase)]
    return CheckIdentity(check_id=check_id(item), submission=submission_of(item), track=track,
                         case="-".join(str(getattr(value, "id", value)) for value in params.values()),
                         case_size=cases[0].work if cases else None, kernel=cases[0].kernel if cases else "")


@dataclass
class TestState:
    """What the grader keeps on one grading test, in `item.stash[TEST_STATE]`."""
    __test__ = False  # not a test class, whatever its name

    identity: CheckIdentity
    declared: Declared  # the check it makes and its rubric group, as its module declares them
    check: Check | None = None  # what it found, once the `check` fixture made it
    first_error: str | None = None  # the grader's error that made the test run a second time
    errors: list | None = None  # both attempts' grader errors, when the second failed too
    position: int = 0  # its index in the run's order of checks, the same in every process (time_limit.py)


TEST_STATE = pytest.StashKey[TestState]()
