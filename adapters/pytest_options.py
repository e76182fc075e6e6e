"""The grader's command-line options, as a pytest plugin.

Installed, it loads through the `pytest11` entry point before pytest reads its arguments, so
`pytest --impl /any/absolute/path` parses as an option and not as a test path. Without an
install, the repository's conftest.py adds the same options.
"""
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
