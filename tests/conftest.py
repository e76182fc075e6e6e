"""One tests/ folder, two roles.

`pytest` alone runs the project's own tests (tests/self). `pytest --impl PATH` grades
submissions with the grading suite (tests/grading) and writes reports/.
"""
from pathlib import Path


def pytest_addoption(parser):
    group = parser.getgroup("grading")
    group.addoption("--impl", action="append", default=[], metavar="PATH",
                    help="submission directory (or glob) to grade; repeatable")


def pytest_ignore_collect(collection_path: Path, config):
    grading = bool(config.getoption("--impl"))
    parts = collection_path.parts
    if "self" in parts and grading:
        return True
    if "grading" in parts and not grading:
        return True
    return None
