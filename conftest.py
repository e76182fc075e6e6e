"""The checkout's two roles.

`pytest` alone runs the project's own tests (tests/self). `pytest --impl PATH` grades
submissions with the grading checks (grading/checks, collected from wherever the package is
installed) and writes reports/. The options and the grading plugin come from
grading/pytest_plugin.py, installed as a pytest11 entry point.
"""
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path: Path, config):
    path = collection_path.resolve()
    # Submissions are graded through the runner, never collected: a student's conftest.py
    # would otherwise run inside the grader.
    if path.is_relative_to(ROOT / "submissions"):
        return True
    grading = bool(config.getoption("--impl"))
    if grading and path.is_relative_to(ROOT / "tests"):
        return True
    if not grading and path.is_relative_to(ROOT / "grading" / "checks"):
        return True
    return None


def pytest_configure(config):
    config._self_tests_started = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # The project's tests say how many workers `-n auto` gave them and the wall time they took, so
    # that a run on another machine can be held against this one's; a grading run prints its own.
    if config.getoption("--impl") or hasattr(config, "workerinput"):
        return
    workers = len(config.getoption("tx", None) or []) if config.getoption("dist", "no") != "no" else 0
    seconds = time.monotonic() - config._self_tests_started
    terminalreporter.write_line(f"the project's tests took {seconds:.0f} s on {workers or 'no'} xdist workers "
                                f"({len(os.sched_getaffinity(0))} cores here)")
