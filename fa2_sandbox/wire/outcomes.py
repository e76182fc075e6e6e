"""Every word for how a runner call or a check ended, and everything that follows from each: one table.

Both sides of the trust boundary speak these: the runner sends a call's status, the harness adds
the statuses of calls the runner could not answer, the checks turn a status into a check's
outcome, scoring counts passes and fails, and the pages group checks by state. All of that is read
off the rows below, so nobody else spells a word or decides what it means. How an outcome's badge
looks is the pages' own (reporting/badges.py), and Gradescope's word for it is the Gradescope
export's (grading/results/gradescope.py): the runner draws no page and talks to no Gradescope.

Adding a way for a runner call to end (a new runner fault, say the harness refusing a reply too
large) is: its constant and STATUSES row here (and its OUTCOMES row when it is a new way for a
check to end, and its badge style in reporting/badges.py), the place that produces it
(fa2_sandbox/harness/client.py or fa2_sandbox/runner/serve.py), and its hostile example under
submissions/hostile/. tests/self/fa2_sandbox/test_outcomes.py holds the table to that.

The words themselves are written to disk (check files and results.json entries as `outcome`, the runner
channel): never rename one, add a new one.
"""
from dataclasses import dataclass

# -- a runner call's status (fa2_sandbox/harness/client.py Reply.status) -------------------------
OK = "ok"  # answered
ERROR = "error"  # the submission raised
NOT_ATTEMPTED = "not_attempted"  # it raised NotImplementedError: the template's stub
NOT_RUN = "not_run"  # one rank's scenario after an earlier scenario of the same run failed (serve.py)
TIMEOUT = "timeout"
CRASH = "crash"  # the runner died, or broke the channel, or ran out of memory
IMPORT_ERROR = "import_error"  # tests/adapters.py could not be imported

# -- why a call ran out of memory (Reply.oom) ----------------------------------------------------
OOM_HOST = "host"  # the runner's host memory limit
OOM_GPU_ALLOWANCE = "gpu_allowance"  # the student's own GPU allowance: the student's crash
OOM_GPU_FULL = "gpu_full"  # the device was full of other processes' memory: the grader's to retry

# -- a check's outcome (grading/results/record.py CheckRecord.outcome) ---------------------------
PASSED = "passed"
FAILED = "failed"  # a wrong answer, or a call that went wrong (then the outcome is its status)
SKIPPED = "skipped"  # does not apply to the submission, or could not be measured: 0 of 0
NOT_GRADED_HERE = "not_graded_here"  # needs a GPU: keeps its share of the maximum, scores 0 for now
GRADER_ERROR = "grader_error"  # the grader itself failed: unscored, regraded

# -- a check's state on a page (reporting/): which section lists it ------------------------------
STATE_PASSED, STATE_FAILED, STATE_SKIPPED = PASSED, FAILED, SKIPPED
STATE_UNGRADED = "ungraded"  # a grader error
STATE_NOT_HERE = "not_here"  # not graded on this machine
STATES = (STATE_FAILED, STATE_PASSED, STATE_SKIPPED, STATE_UNGRADED, STATE_NOT_HERE)

@dataclass(frozen=True)
class Outcome:
    """One way a check can end, and all that follows from it."""
    word: str  # in check files and results.json: never renamed
    state: str  # the page section that lists it (STATES)
    # Whether it counts as a pass (a skipped check does: 0 of 0) or a fail (a timeout does); None:
    # neither, it is not scored yet (a grader error, a check that needs a GPU).
    passes: bool | None
    sentence: str  # what it means, for whoever reads the page (the badge's tooltip) or Gradescope

    @property
    def label(self) -> str:
        """What its badge says: "import error"."""
        return self.word.replace("_", " ")

    @property
    def passed(self) -> bool:
        """Counts as a pass: a skipped check passes (0 / 0)."""
        return self.passes is True

    @property
    def settled(self) -> bool:
        """A pass or a fail; False for a check still to be graded (grader error, needs a GPU)."""
        return self.passes is not None


OUTCOMES = {row.word: row for row in (
    Outcome(PASSED, STATE_PASSED, True, "passed: the check found nothing wrong"),
    Outcome(FAILED, STATE_FAILED, False, "failed: the submission's answer was wrong"),
    Outcome(SKIPPED, STATE_SKIPPED, True,
            "skipped: does not apply to this submission, or could not be measured on it (0 of 0 points)"),
    Outcome(NOT_GRADED_HERE, STATE_NOT_HERE, None, "not graded here: it needs a GPU"),
    Outcome(GRADER_ERROR, STATE_UNGRADED, None,
            "the grader itself failed: counts neither for nor against the submission until regraded"),
    # A check failed by a runner call takes the call's status as its outcome (STATUSES below).
    Outcome(ERROR, STATE_FAILED, False, "error: the submission raised an exception"),
    Outcome(NOT_ATTEMPTED, STATE_FAILED, False,
            "not attempted: the submission raised NotImplementedError (the template's stub)"),
    Outcome(TIMEOUT, STATE_FAILED, False, "timeout: the call ran past its time limit"),
    Outcome(CRASH, STATE_FAILED, False,
            "crash: the submission's process died, broke the grader's channel or ran out of memory"),
    Outcome(IMPORT_ERROR, STATE_FAILED, False,
            "import error: tests/adapters.py could not be imported"),
)}


def row_of(outcome: str) -> Outcome:
    """The row of `outcome`; a word the table does not know (an older or a forged results.json)
    reads as a failure (and the pages give it a plain badge), which is what the pages and Gradescope
    always did."""
    return OUTCOMES.get(outcome) or Outcome(outcome, STATE_FAILED, False, outcome.replace("_", " "))


def state_of(outcome: str) -> str:
    """What a page groups a check by, from its outcome."""
    return row_of(outcome).state


# Neither a pass nor a fail: GRADER_ERROR, NOT_GRADED_HERE.
UNSETTLED = tuple(w for w, row in OUTCOMES.items() if not row.settled)


# -- who ends a runner call with each status, and what a check the call fails ends with ---------
RUNNER = "runner"  # serve.py sends it: the submission answered, raised, or had not been written
HARNESS = "harness"  # client.py makes it: the runner could not answer (it hung, died, or never imported)
RANK = "rank"  # serve.py writes it for one rank's scenario inside a distributed call's result, never as a call's status


@dataclass(frozen=True)
class Status:
    word: str
    made_by: str  # RUNNER, HARNESS or RANK
    fails_as: str | None  # the OUTCOMES word of a check this status fails; None: answered, the check goes on
    # The case's call got no answer: the check that made the call fails for it, and every
    # other check that needs the answer says so (grading/checks/flash_checks.py got_no_answer).
    # False where the status is every check's own finding: the template's stub, the adapters' import.
    unanswered: bool = False


STATUSES = {s.word: s for s in (
    Status(OK, RUNNER, None),
    Status(ERROR, RUNNER, ERROR, unanswered=True),
    Status(NOT_ATTEMPTED, RUNNER, NOT_ATTEMPTED),
    Status(NOT_RUN, RANK, ERROR),
    Status(TIMEOUT, HARNESS, TIMEOUT, unanswered=True),
    Status(CRASH, HARNESS, CRASH, unanswered=True),
    Status(IMPORT_ERROR, HARNESS, IMPORT_ERROR),
)}
# What a runner may send as a call's status (client.py refuses the rest).
ANSWERED = tuple(s.word for s in STATUSES.values() if s.made_by == RUNNER)
CALL_OUTCOMES = tuple(dict.fromkeys(s.fails_as for s in STATUSES.values() if s.fails_as))  # a failed check, by its call


def outcome_of_call(status: str) -> str:
    """The outcome of a check failed by a runner call that ended with `status` (not OK)."""
    s = STATUSES.get(status)
    return s.fails_as if s and s.fails_as else ERROR
