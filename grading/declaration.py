"""How a checks module declares its checks: the `grading` marker, once per module.

Every module under grading/checks says, once, which check each of its tests makes and which runner
of the submission its calls use:

    pytestmark = pytest.mark.grading(check_of=check_of, track=track)

- check_of(test, params) -> (part, check, tier): the check a test makes, given the test function's
  name and its parameters. With the rubric it gives the check's group, known at collection, so
  a check that never ran still has its group (grading/results/scoring.py). The `check` fixture
  takes the part, check and tier from here: a test names only its case, and cannot make a check
  its module does not declare.
- track(params, per_kernel) -> Track: the runner its calls use (grading/tracks.py declared_track).

A module without the marker, a test its check_of does not know, or a track that is not a Track
stops collection with a sentence that names the module and the test.
"""
import sys
from dataclasses import dataclass

import pytest

MARKER = "grading"
# The marker's line of `pytest --markers`; registered by grading/pytest_plugin.py.
HELP = (f"{MARKER}(check_of, track): on a checks module, the check each of its tests makes and the runner "
        f"it uses (grading/declaration.py)")


@dataclass(frozen=True)
class Declared:
    """The check a collected test makes, as its module declares it, and its rubric group."""
    part: str
    check: str
    tier: str
    group: str


def declaration(item, what: str):
    """The function `what` ("check_of" or "track") of the item's module's marker."""
    marker = item.get_closest_marker(MARKER)
    if marker is None or what not in marker.kwargs:
        raise pytest.UsageError(
            f"{item.module.__name__} declares no {what} for {item.originalname}: a checks module sets "
            f"`pytestmark = pytest.mark.{MARKER}(check_of=..., track=...)` (grading/declaration.py)")
    return marker.kwargs[what]


def declared_check(item, rubric) -> Declared:
    """The check a grading test makes, from its module's check_of, with its rubric group."""
    return _declared(item.module.__name__, declaration(item, "check_of"), item.originalname,
                     item.callspec.params, rubric)


def declared_for(test, params: dict, rubric) -> Declared:
    """The check that test function `test` makes with `params`, as its module declares it: for
    running a check outside a pytest session (the project's tests, bench tools), with no item."""
    mark = getattr(sys.modules[test.__module__], "pytestmark", None)
    if mark is None or mark.name != MARKER:
        raise pytest.UsageError(f"{test.__module__} has no `pytestmark = pytest.mark.{MARKER}(...)`")
    return _declared(test.__module__, mark.kwargs["check_of"], test.__name__, params, rubric)


def _declared(module: str, check_of, test: str, params: dict, rubric) -> Declared:
    try:
        part, check, tier = check_of(test, params)
    except (KeyError, ValueError, TypeError) as exc:
        raise pytest.UsageError(f"{module}'s check_of knows no check for {test} ({type(exc).__name__}: {exc}): "
                                f"add the test to it (grading/declaration.py)") from exc
    return Declared(part, check, tier, rubric.group_of(part, check, tier))
