"""The grading tests' fixtures: `session` (the grading session, as one test sees it) and `check`
(a check's record).

Registered as a plugin with the grading plugins (grading/pytest_plugin.py), not a conftest.py:
the checks are collected from wherever the package is installed. `submission` is parametrized by
the worker's plugin (grading/worker.py pytest_generate_tests)."""
import pytest

from grading.check import TEST_STATE, Check
from grading.session import WORKER_STATE, TrackSession


@pytest.fixture
def session(request):
    """The process's WorkerState, its runner calls going to this test's track."""
    return TrackSession(request.config.stash[WORKER_STATE], request.node.stash[TEST_STATE].identity.track)


@pytest.fixture
def check(request, session, submission):
    """Factory: check(case="") -> Check, recorded for this test: the check its module's `grading`
    marker declares for it (part, name, tier: grading/declaration.py), on this case.

    case: the case's id (a str), or the case itself (a FlashCase: anything with `.id` and
    `.to_json()`), whose fields the record then carries as data, or (id, case) for both.
    A submission whose adapters do not import fails the check here, with the import error; an
    advice check whose turn comes after --time-limit is cut here."""
    state = request.node.stash[TEST_STATE]

    def make(case=""):
        state.check = Check(submission, state.declared, case, session.rubric)
        session.fail_if_unimportable(state.check, submission)
        session.cut_if_out_of_time(state.check, state.position)
        return state.check
    return make
