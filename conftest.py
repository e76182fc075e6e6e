"""One tests/ folder, two roles.

`pytest` alone runs the project's own tests (tests/self). `pytest --impl PATH` grades
submissions with the grading suite (tests/grading) and writes reports/.
"""
from pathlib import Path

DEFAULT_SEED = 20260


def pytest_addoption(parser):
    group = parser.getgroup("grading")
    group.addoption("--impl", action="append", default=[], metavar="PATH",
                    help="submission directory or glob to grade (repeatable), e.g. 'submissions/*'")
    group.addoption("--seed", type=int, default=DEFAULT_SEED,
                    help=f"base seed for every input (default {DEFAULT_SEED}); use a private one for hidden runs")
    group.addoption("--rubric", default=None, metavar="FILE", help="rubric YAML (default tests/grading/rubric.yaml)")
    group.addoption("--reports", default="reports", metavar="DIR", help="where results and pages go")
    group.addoption("--student-view", action="store_true", help="leave hidden checks out of the pages")


def pytest_configure(config):
    if config.getoption("--impl"):
        from tests.grading.plugin import GradingPlugin
        config.pluginmanager.register(GradingPlugin(config), "grading")


def pytest_ignore_collect(collection_path: Path, config):
    grading = bool(config.getoption("--impl"))
    parts = collection_path.parts
    if "self" in parts and grading:
        return True
    if "grading" in parts and not grading:
        return True
    return None
