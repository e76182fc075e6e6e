"""The grader as a pytest plugin: its options, and the grading plugin it registers under --impl.

Installed (`pip install -e .`), this module loads through the `pytest11` entry point before
pytest reads its arguments, so `pytest --impl /any/absolute/path` parses as an option and not as
a test path. It is the only place options are added. Its shape is pytest-xdist's: options and
configure here, the session's hooks in their own class (tests/grading/plugin.py GradingPlugin),
registered only when there is something to grade, its state in `config.stash`.
"""
def pytest_addoption(parser):
    group = parser.getgroup("grading")
    group.addoption("--impl", action="append", default=[], metavar="PATH",
                    help="submission directory or glob to grade (repeatable), e.g. 'submissions/*'")
    group.addoption("--seed", type=int, default=None,
                    help="base seed for every input (default: a secret one, drawn when the reports folder is new "
                         "and kept in DIR/.seed, so a regrade repeats it)")
    group.addoption("--rubric", default=None, metavar="FILE", help="rubric YAML (default tests/grading/rubric.yaml)")
    group.addoption("--reports", default="reports", metavar="DIR", help="where results and pages go")
    group.addoption("--student-view", action="store_true", help="leave hidden checks out of the pages")


def pytest_configure(config):
    if config.getoption("--impl"):
        # Imported here, not at the top: tests/ is on sys.path only once pytest has read the
        # project's `pythonpath` setting, after this module loaded.
        from tests.grading.plugin import GradingPlugin

        config.pluginmanager.register(GradingPlugin(config), "grading")
