"""The grading plugin's hooks, run in this process with pytester (as pytest-xdist tests its own):
a run that collects no check stops with exit status 4 and writes no report; -k regrades part of
a submission and keeps the other checks' results; --lf reruns only what failed and keeps what
passed. The runners are still real subprocesses (the sandbox), the pytest session is not.

Each run takes the grader's own settings (`-c`, `--rootdir`), as grading/pytest_plugin.py would
restart it with, so the plugin has no reason to start the run again in a new process."""
import json

import pytest
from _pytest import pytester as pytester_module

from grading.pytest_plugin import GRADER_ROOT, grader_settings

pytest_plugins = ["pytester"]
REFERENCE = GRADER_ROOT / "submissions" / "reference"
WRONG = GRADER_ROOT / "submissions" / "examples" / "no_softmax_scale"  # fails the course forward
COURSE_FORWARD = "test_forward and pytorch and 128x128"  # the PyTorch class's course case, forward only


def grade(pytester, *args):
    """A grading run in this process, into pytester's folder; (its outcome, the reports folder)."""
    reports = pytester.path / "reports"
    result = pytester.runpytest_inprocess("-c", str(grader_settings()), "--rootdir", str(GRADER_ROOT),
                                          "-p", "no:xdist", "-p", "no:randomly", f"--reports={reports}",
                                          "--seed=20261127", *args)
    return result, reports


def checks(reports, name) -> dict:
    """{part::check[case]: status} of a submission's results.json."""
    results = json.loads((reports / name / "results.json").read_text())
    return {t["name"].split("::", 1)[1]: t.get("status") for t in results["tests"]}


def test_a_run_that_collects_no_check_stops_with_status_4(pytester):
    other = pytester.makepyfile(test_other="def test_nothing_to_grade():\n    pass\n")
    result, reports = grade(pytester, f"--impl={REFERENCE}", str(other))
    assert result.ret == 4, result.stdout.str()[-2000:]
    assert not (reports / "index.html").exists()


def test_k_regrades_part_and_keeps_the_rest(pytester):
    result, reports = grade(pytester, f"--impl={REFERENCE}", "-k", COURSE_FORWARD)
    assert result.ret == 0, result.stdout.str()[-2000:]
    first = checks(reports, "reference")
    assert first == {"flash_pytorch::forward[fp32-128x128-d64-full]": "passed"}
    result, _ = grade(pytester, f"--impl={REFERENCE}", "-k", "test_backward and pytorch and 128x128")
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert checks(reports, "reference") == {**first, "flash_pytorch::backward[fp32-128x128-d64-full]": "passed"}


def test_last_failed_reruns_only_the_failures_and_keeps_the_rest(pytester):
    both = [f"--impl={REFERENCE}", f"--impl={WRONG}", "-k", COURSE_FORWARD]
    result, reports = grade(pytester, *both)
    result.assert_outcomes(passed=1, failed=1)
    result, _ = grade(pytester, f"--impl={REFERENCE}", f"--impl={WRONG}", "--lf")
    result.assert_outcomes(failed=1)  # the failure alone, graded again
    assert checks(reports, "reference") == {"flash_pytorch::forward[fp32-128x128-d64-full]": "passed"}
    assert checks(reports, "no_softmax_scale") == {"flash_pytorch::forward[fp32-128x128-d64-full]": "failed"}


KEPT = ("torch", "triton", "numpy", "sympy", "grading", "fa2_sandbox", "reference", "reporting")


@pytest.fixture(autouse=True)
def keep_native_modules(monkeypatch):
    """pytester takes the modules a run imported out of sys.modules when the run ends, so that the
    next run imports them afresh. These stay: torch and triton register native libraries that
    cannot be loaded twice in one process (triton aborts, torch refuses a second TORCH_LIBRARY), and
    the grader's packages, imported before any run (the pytest11 entry point), would keep their old
    submodules as attributes: `from grading import fixtures` would find the last run's module and
    its session key, not this run's."""
    take = pytester_module.SysModulesSnapshot.__init__

    def keeping(self, preserve=None):
        take(self, preserve=lambda name: name.split(".")[0] in KEPT or bool(preserve and preserve(name)))
    monkeypatch.setattr(pytester_module.SysModulesSnapshot, "__init__", keeping)


@pytest.fixture(autouse=True)
def _own_cache(keep_native_modules, pytester, monkeypatch):
    """--lf's cache in pytester's folder, never the outer run's."""
    monkeypatch.setenv("PYTEST_ADDOPTS", f"-o cache_dir={pytester.path / '.cache'}")
