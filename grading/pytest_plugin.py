"""The grader as a pytest plugin: its options, and the grading plugin it registers under --impl.

Installed (`pip install .`, or `-e` from a checkout), this module loads through the `pytest11`
entry point before pytest reads its arguments, so `pytest --impl /any/absolute/path` parses as an
option and not as a test path. It is the only place options are added. Its shape is
pytest-xdist's: options and configure here, the hooks in a class per role (grading/controller.py
ControllerPlugin, grading/worker.py WorkerPlugin) and the checks' fixtures (grading/fixtures.py),
registered only when there is something to grade, each role's state in `config.stash` of the
process that has the role (controller.py ControllerState, session.py WorkerState).

The checks (grading/checks) are part of the installed package: a grading run given no test path
collects them from wherever the package is, whatever folder pytest runs in.

pytest picks its settings file before any plugin's options are known, so in `--impl PATH` (two
words) it takes PATH for a test path: a course repo ships a pyproject.toml with pytest settings
of its own, which then become the run's settings (its addopts, its rootdir, its conftest.py
imported into the grader). The same goes for an existing folder after `--reports`, and for the
folder a grading run starts in. So before any conftest is loaded, a run that would grade under
settings other than the grader's starts again with the grader's own (`-c`), and says so: a
checkout's pyproject.toml (rootdir the checkout), or, installed without one, the package's
grading/pytest.ini (rootdir the folder the run started in, where --lf's cache then lives).

A run with xdist workers starts again with `-c` even under the grader's settings: each worker
parses the run's arguments again, later, when the folder after `--reports` exists (the run made
it), takes it for a test path, finds no settings of ours, and would start again itself, which
kills it: every worker died, and `-n 2 --reports DIR` for a new DIR ended "no tests ran".
"""
import os
import sys
from pathlib import Path

import pytest

from fa2_sandbox import PROJECT_ROOT
from grading import declaration

GRADER_ROOT = PROJECT_ROOT  # a checkout, or site-packages when installed
CHECKS = GRADER_ROOT / "grading" / "checks"
PACKAGE_SETTINGS = GRADER_ROOT / "grading" / "pytest.ini"
CHECKOUT_SETTINGS = GRADER_ROOT / "pyproject.toml"
RESTARTED = "FA2_GRADER_OWN_SETTINGS"  # set in the restarted run: never restart twice


def in_checkout() -> bool:
    """Whether the grader runs from its source tree (a clone, `pip install -e`), not an install."""
    return CHECKOUT_SETTINGS.is_file() and (GRADER_ROOT / "tests" / "self").is_dir()


def grader_settings() -> Path:
    return CHECKOUT_SETTINGS if in_checkout() else PACKAGE_SETTINGS


def pytest_addoption(parser):
    group = parser.getgroup("grading")
    group.addoption("--impl", action="append", default=[], metavar="PATH",
                    help="submission directory or glob to grade (repeatable), e.g. 'submissions/*'")
    group.addoption("--seed", type=int, default=None,
                    help="base seed for every input (default: a secret one, drawn when the reports folder is new "
                         "and kept in DIR/.seed, so a regrade repeats it)")
    group.addoption("--rubric", default=None, metavar="FILE",
                    help="rubric YAML (default: the grader's own, grading/rubric.yaml)")
    group.addoption("--reports", default="reports", metavar="DIR",
                    help="where results, pages and grades.csv go; one folder per class (default: reports, in the "
                         "folder the run starts in)")
    group.addoption("--keep-others", action="store_true",
                    help="list the submissions graded into DIR by earlier runs on the class page too (default: "
                         "the class page, grades.csv and gradescope_scores.csv list this run's submissions only)")
    group.addoption("--student-view", action="store_true", help="leave hidden checks out of the pages")
    group.addoption("--time-limit", type=float, default=None, metavar="S",
                    help="seconds one submission may be graded for, as Gradescope's time limit: its checks' times, "
                         "summed over the workers that ran them; an advice check whose turn comes later is cut (fails, "
                         "earning nothing); a requirement or timing check is never cut (default: none)")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """Under --impl, one plugin and one state per role, as junitxml and xdist register theirs: the
    controller's wherever there is no `workerinput`, the worker's (and the checks' fixtures)
    wherever the checks run, an xdist worker or a run without workers (both, then, in one process,
    the controller handing the worker's side what a worker would be given: grading/protocol.py)."""
    # The checks modules' declaration (registered in every run: --strict-markers refuses an unknown one).
    config.addinivalue_line("markers", declaration.HELP)
    if not config.getoption("--impl"):
        return
    # Imported here, not at the top: the engine (torch, the harness) is loaded only to grade.
    from grading import fixtures, protocol
    from grading.controller import CONTROLLER_STATE, ControllerPlugin, ControllerState
    from grading.session import WORKER_STATE, WorkerState
    from grading.worker import WorkerPlugin

    settings = protocol.settings(config)
    runs_checks = runs_checks_here(config)
    if not hasattr(config, "workerinput"):
        config.stash[CONTROLLER_STATE] = ControllerState(config, settings)
        config.pluginmanager.register(ControllerPlugin(config), "grading-controller")
        if runs_checks:
            protocol.hand_over(config, config.stash[CONTROLLER_STATE].for_workers())
    if runs_checks:
        config.stash[WORKER_STATE] = WorkerState(config, settings)
        config.pluginmanager.register(WorkerPlugin(config), "grading-worker")
        config.pluginmanager.register(fixtures, "grading-fixtures")


def runs_checks_here(config) -> bool:
    """Whether this process runs the checks: an xdist worker, or a run that starts none. xdist's own
    rule for starting workers (its pytest_configure, which registers its DSession where it does) is
    read here, not that DSession: xdist's hook is trylast too, and runs after this plugin's."""
    if hasattr(config, "workerinput"):
        return True
    starts_workers = config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))
    return not starts_workers or bool(config.getoption("collectonly"))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    namespace = early_config.known_args_namespace
    if not namespace.impl:
        return
    settings = grader_settings()
    # An xdist worker takes the controller's arguments, `-c settings` included, so it finds its
    # settings ours. (PYTEST_XDIST_WORKER does not tell a worker: a grading run started from a
    # test that runs in a worker inherits it, and must still start again.)
    ours = early_config.inipath is not None and early_config.inipath.resolve() == settings
    if not ours:
        restart_with_own_settings(early_config, settings)
    told = namespace.inifilename is not None and Path(namespace.inifilename).resolve() == settings
    if getattr(namespace, "numprocesses", None) not in (None, 0) and not told:
        restart_with_own_settings(early_config, settings, say=False)  # for the workers (above)
    if not namespace.file_or_dir:
        # The installed checks, as if given on the command line. pytest finds its first
        # conftest.py files from the namespace (its own hook runs after this one) and collects
        # from `args`: both get the path, or a conftest.py of the folder the run started in would load.
        args.append(str(CHECKS))
        namespace.file_or_dir = [str(CHECKS)]


def restart_with_own_settings(early_config, settings: Path, say: bool = True):
    """Start this run again (exec: never returns) with `-c settings`, or stop if this is already the
    restart. `say`: tell the user that pytest took other settings (it did)."""
    found = early_config.inipath or "no settings file"
    if os.environ.get(RESTARTED):
        where = f"Run it from {GRADER_ROOT} and write" if in_checkout() else "Write"
        raise pytest.UsageError(f"pytest read its settings from {found} (rootdir {early_config.rootpath}), not from "
                                f"the grader's {settings}, even when told to. {where} --impl=PATH and "
                                f"--reports=DIR as one word each.")
    capture = early_config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # give the restarted run the terminal back, not pytest's capture files
        capture.stop_global_capturing()
    if say:
        print(f"[grader] pytest took its settings from {found} (rootdir {early_config.rootpath}), not the grader's: "
              f"an option's value was read as a test path, or the folder has settings of its own. Starting again "
              f"with the grader's own settings, {settings}.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    rootdir = GRADER_ROOT if in_checkout() else early_config.invocation_params.dir
    safe_path = ["-P"] if getattr(sys.flags, "safe_path", False) else []  # python -P: keep the cwd off sys.path
    argv = [sys.executable, *safe_path, "-m", "pytest", "-c", str(settings), "--rootdir", str(rootdir),
            *early_config.invocation_params.args]
    os.execve(sys.executable, argv, {**os.environ, RESTARTED: "1"})
