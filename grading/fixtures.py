"""The grading tests' fixtures: `session` (the grading session's state) and `check` (a check's record).

Registered as a plugin with the grading plugin (grading/pytest_plugin.py), not a conftest.py:
the checks are collected from wherever the package is installed. `submission` is parametrized by
the grading plugin (plugin.py pytest_generate_tests)."""
import pytest

from grading.check import Check
from grading.session import GRADING


@pytest.fixture(scope="session")
def session(pytestconfig):
    state = pytestconfig.stash[GRADING]
    yield state
    state.close()


@pytest.fixture
def check(request, session, submission):
    """Factory: check(part, name, case="", tier="default") -> Check, recorded for this test.

    case: the case's id (a str), or the case itself (a FlashCase: anything with `.id` and
    `.to_json()`), whose fields the record then carries as data, or (id, case) for both.
    A submission whose adapters do not import fails the check here, with the import error; an
    advice check whose turn comes after --time-limit is cut here."""
    def make(part, name, case="", tier="default"):
        request.node.grading_check = Check(submission, part, name, case, tier, session.rubric,
                                           getattr(request.node, "grading_group", None))
        session.fail_if_unimportable(request.node.grading_check, submission)
        session.cut_if_out_of_time(request.node.grading_check)
        return request.node.grading_check
    return make
