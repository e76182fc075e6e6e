"""The checkout's two roles.

`pytest` alone runs the project's own tests (tests/self). `pytest --impl PATH` grades
submissions with the grading checks (grading/checks, collected from wherever the package is
installed) and writes reports/. The options and the grading plugin come from
grading/pytest_plugin.py, installed as a pytest11 entry point.
"""
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
