"""The grader as a pytest plugin: its options, and the grading plugin it registers under --impl.

Installed (`pip install -e .`), this module loads through the `pytest11` entry point before
pytest reads its arguments, so `pytest --impl /any/absolute/path` parses as an option and not as
a test path. It is the only place options are added. Its shape is pytest-xdist's: options and
configure here, the session's hooks in their own class (tests/grading/plugin.py GradingPlugin),
registered only when there is something to grade, its state in `config.stash`.

pytest picks its settings file before any plugin's options are known, so in `--impl PATH` (two
words) it takes PATH for a test path: a course repo ships a pyproject.toml with pytest settings
of its own, which then become the run's settings (its addopts, its rootdir, its conftest.py
imported into the grader). The same goes for an existing folder after `--reports`. So before
any conftest is loaded, a run that would grade under settings other than the grader's starts
again with the grader's own (`-c` and `--rootdir`), and says so.
"""
import os
import sys
from pathlib import Path

import pytest

GRADER_ROOT = Path(__file__).resolve().parents[1]
GRADER_SETTINGS = GRADER_ROOT / "pyproject.toml"
RESTARTED = "FA2_GRADER_OWN_SETTINGS"  # set in the restarted run: never restart twice
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


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if not early_config.known_args_namespace.impl or not GRADER_SETTINGS.is_file():
        return
    if early_config.inipath is not None and early_config.inipath.resolve() == GRADER_SETTINGS:
        return
    found = early_config.inipath or "no settings file"
    if os.environ.get(RESTARTED):
        raise pytest.UsageError(f"pytest read its settings from {found} (rootdir {early_config.rootpath}), not from "
                                f"the grader's {GRADER_SETTINGS}, even when told to. Run it from {GRADER_ROOT} "
                                f"and write --impl=PATH and --reports=DIR as one word each.")
    capture = early_config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # give the restarted run the terminal back, not pytest's capture files
        capture.stop_global_capturing()
    print(f"[grader] pytest took its settings from {found} (rootdir {early_config.rootpath}): an option's value "
          f"was read as a test path. Starting again with the grader's own settings, {GRADER_SETTINGS}.",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    argv = [sys.executable, "-m", "pytest", "-c", str(GRADER_SETTINGS), "--rootdir", str(GRADER_ROOT),
            *early_config.invocation_params.args]
    if not early_config.known_args_namespace.file_or_dir:  # pytest reads testpaths only when run from the rootdir
        argv.append(str(GRADER_ROOT / "tests"))
    os.execve(sys.executable, argv, {**os.environ, RESTARTED: "1"})
