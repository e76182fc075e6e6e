"""One tests/ folder, two roles.

`pytest` alone runs the project's own tests (tests/self). `pytest --impl PATH` grades
submissions with the grading suite (tests/grading) and writes reports/.
"""
from pathlib import Path


def pytest_addoption(parser):
    from adapters import pytest_options

    try:
        pytest_options.pytest_addoption(parser)
    except ValueError:  # already added by the installed entry point
        pass


def pytest_configure(config):
    if config.getoption("--impl"):
        from tests.grading.plugin import GradingPlugin
        config.pluginmanager.register(GradingPlugin(config), "grading")


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
