"""Every word for how a runner call or a check ended, and the one mapping between them.

Both sides of the trust boundary speak these: the runner sends a call's status, the harness adds
the statuses of calls the runner could not answer, the checks turn a status into a check's
outcome, scoring counts outcomes, and the pages group checks by state. Adding a way to end means
adding it here and to the mapping, then wherever it is produced.
"""

# -- a runner call's status (fa2_sandbox/harness/client.py Reply.status) -------------------------
OK = "ok"  # answered
ERROR = "error"  # the submission raised
NOT_ATTEMPTED = "not_attempted"  # it raised NotImplementedError: the template's stub
ANSWERED = (OK, ERROR, NOT_ATTEMPTED)  # what a runner may send (serve.py); the rest the harness makes
TIMEOUT = "timeout"
CRASH = "crash"  # the runner died, or broke the channel, or ran out of memory
IMPORT_ERROR = "import_error"  # tests/adapters.py could not be imported

# -- why a call ran out of memory (Reply.oom) ----------------------------------------------------
OOM_HOST = "host"  # the runner's host memory limit
OOM_GPU_BUDGET = "gpu_budget"  # the student's own GPU budget: the student's crash
OOM_GPU_FULL = "gpu_full"  # the device was full of other processes' memory: the grader's to retry

# -- a check's outcome (grading/results/record.py CheckRecord.outcome) ---------------------------
PASSED = "passed"
FAILED = "failed"  # a wrong answer, or a call that went wrong (then the outcome is its status)
SKIPPED = "skipped"  # does not apply to the submission, or could not be measured: 0 of 0
NOT_GRADED_HERE = "not_graded_here"  # needs a GPU: keeps its share of the maximum, scores 0 for now
GRADER_ERROR = "grader_error"  # the grader itself failed: unscored, regraded
UNSETTLED = (GRADER_ERROR, NOT_GRADED_HERE)  # neither passed nor failed: Gradescope shows no status
CALL_OUTCOMES = (ERROR, NOT_ATTEMPTED, TIMEOUT, CRASH, IMPORT_ERROR)  # a failed check, by how its call ended

# -- a check's state on a page (reporting/) ------------------------------------------------------
STATE_PASSED, STATE_FAILED, STATE_SKIPPED = PASSED, FAILED, SKIPPED
STATE_UNGRADED = "ungraded"  # a grader error
STATE_NOT_HERE = "not_here"  # not graded on this machine


def outcome_of_call(status: str) -> str:
    """The outcome of a check failed by a runner call that ended with `status` (not OK)."""
    return status if status in CALL_OUTCOMES else ERROR


def state_of(outcome: str) -> str:
    """What a page groups a check by, from its outcome."""
    if outcome in (PASSED, SKIPPED):
        return outcome
    if outcome == NOT_GRADED_HERE:
        return STATE_NOT_HERE
    return STATE_UNGRADED if outcome == GRADER_ERROR else STATE_FAILED
