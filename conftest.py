"""One tests/ folder, two roles.

`pytest` alone runs the project's own tests (tests/self). `pytest --impl PATH` grades
submissions with the grading suite (tests/grading) and writes reports/. The options and the
grading plugin come from fa2_adapters/pytest_plugin.py, installed as a pytest11 entry point.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path: Path, config):
    # Submissions are graded through the runner, never collected: a student's conftest.py
    # would otherwise run inside the grader.
    if collection_path.resolve().is_relative_to(ROOT / "submissions"):
        return True
    grading = bool(config.getoption("--impl"))
    parts = collection_path.parts
    if "self" in parts and grading:
        return True
    if "grading" in parts and not grading:
        return True
    return None
