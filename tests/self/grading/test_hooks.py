"""The grading plugins' hooks, run in this process with pytester (as pytest-xdist tests its own):
a run that collects no check stops with exit status 4 and writes no report; -k regrades part of
a submission and keeps the other checks' results; --lf reruns only what failed and keeps what
passed; a test the grader's own code broke runs once more and is then a grader error, in the
test or in its setup; -x leaves a submission incomplete; a bad rubric stops the run with status 4;
the grader's sort of the checks survives pytest's own. The runners are still real subprocesses
(the sandbox), the pytest session is not.

Each run takes the grader's own settings (`-c`, `--rootdir`), as grading/pytest_plugin.py would
restart it with, so the plugin has no reason to start the run again in a new process."""
import csv
import json
from collections import Counter

import pytest
from _pytest import pytester as pytester_module

from grading.pytest_plugin import GRADER_ROOT, grader_settings
from grading.results.gradescope import status_of

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
    return {t["name"].split("::", 1)[1]: status_of(t) for t in results["tests"]}


def test_a_run_that_collects_no_check_stops_with_status_4(pytester):
    other = pytester.makepyfile(test_other="def test_nothing_to_grade():\n    pass\n")
    result, reports = grade(pytester, f"--impl={REFERENCE}", str(other))
    assert result.ret == 4, result.stdout.str()[-2000:]
    assert not (reports / "index.html").exists()


@pytest.mark.parametrize("kind", ["missing", "file", "empty folder", "glob matching nothing"])
def test_a_path_that_is_not_a_submission_stops_the_run_before_collection(pytester, kind):
    """Exit status 4 (pytest's usage error), one sentence naming the path and what was expected
    there, and nothing written: no reports folder at all."""
    path = {"missing": pytester.path / "does-not-exist", "file": pytester.makefile(".txt", notes="a file"),
            "empty folder": pytester.mkdir("empty"), "glob matching nothing": pytester.path / "exmples" / "*"}[kind]
    result, reports = grade(pytester, f"--impl={path}")
    assert result.ret == 4, result.stdout.str()[-2000:]
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and f"--impl {path}" in errors[0].replace("'", ""), result.stderr.str()
    assert "expected a submission folder" in errors[0] or "expected a glob of submission folders" in errors[0]
    assert "tests/adapters.py" in errors[0] and "adapters.py" in errors[0].replace("tests/adapters.py", "")
    assert not reports.exists() and "passed" not in result.stdout.str()


def test_help_names_the_reports_folders_default(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    result = pytester.runpytest_inprocess("--help")
    result.stdout.fnmatch_lines(["*--reports=DIR*(default: reports, in the folder the run starts in)*",
                                 "*--keep-others*earlier runs*"])


def class_rows(reports) -> list:
    """The names in grades.csv, one row per submission of the class."""
    return [line.split(",", 1)[0] for line in (reports / "grades.csv").read_text().splitlines()[1:]]


def test_a_glob_grades_the_submissions_it_matches_and_names_the_folders_it_skipped(pytester):
    classroom = pytester.mkdir("classroom")
    (classroom / "reference").symlink_to(REFERENCE, target_is_directory=True)
    (classroom / "notes").mkdir()  # no adapters file: not a submission
    result, reports = grade(pytester, f"--impl={classroom}/*", "-k", COURSE_FORWARD)
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines([f"skipped 1 folder that --impl matched and that hold* no tests/adapters.py or "
                                 f"adapters.py: {classroom}/notes"])
    assert class_rows(reports) == ["reference"]
    page = (reports / "index.html").read_text()
    assert "Not graded: 1 folder" in page and f"{classroom}/notes" in page
    assert "warning" not in result.stderr.str()  # a correct run is quiet: no Gradescope upload warnings
    results = json.loads((reports / "reference" / "results.json").read_text())
    total = f"{results['score']:.2f}".rstrip("0").rstrip(".") + " / " + f"{results['max_score']:g}"
    result.stdout.fnmatch_lines(["*grading 1 submission with seed*",  # the points as the pages show them
                                 f"*[[]1 of 1 submission done[]] reference: {total} *", f"reference * {total} *"])
    # the progress line has a line of its own, after the row of results it came in, not inside it
    lines = result.stdout.lines
    done = next(i for i, line in enumerate(lines) if "submission done]" in line)
    assert lines[done].startswith("[1 of 1 submission done]") and lines[done - 1].rstrip().endswith("[100%]"), \
        "\n".join(lines[done - 2:done + 2])
    extra = results["extra_data"]
    assert 0 < extra["wall_seconds"] == results["execution_time"] and extra["check_seconds"] > 0
    page = (reports / "reference" / "index.html").read_text()
    assert f"<dt>grading time</dt><dd>{extra['wall_seconds']:.1f} s (wall clock" in page
    assert "<dt>sum of check times</dt>" in page
    assert "<title>Class report · 1 submission</title>" in (reports / "index.html").read_text()


def test_reports_hold_the_class_of_the_last_run_unless_asked_to_keep_others(pytester):
    """The class page, grades.csv and gradescope_scores.csv list the submissions this run names;
    --keep-others lists those graded into the folder before too. An earlier run never changes
    the class of a later one (its mean, its rows)."""
    result, reports = grade(pytester, f"--impl={REFERENCE}", "-k", COURSE_FORWARD)
    assert result.ret == 0 and class_rows(reports) == ["reference"]
    result, _ = grade(pytester, f"--impl={WRONG}", "-k", COURSE_FORWARD)
    assert class_rows(reports) == ["no_softmax_scale"]
    assert "1 graded into" in result.stdout.str() and "--keep-others lists them too" in result.stdout.str()
    assert "reference" in (reports / "index.html").read_text().split('id="left-out"')[1]
    assert (reports / "reference" / "results.json").exists()  # left out of the class, never deleted
    result, _ = grade(pytester, f"--impl={WRONG}", "-k", COURSE_FORWARD, "--keep-others")
    assert class_rows(reports) == ["no_softmax_scale", "reference"]
    assert 'id="left-out"' not in (reports / "index.html").read_text()


BROKEN_ADAPTERS = """import torch


def get_ddp(module: torch.nn.Module):
    return module +
"""


def test_adapters_that_do_not_import_are_one_cause_in_every_part(pytester):
    """Every check of every part fails with the same sentence (the error's first line, the file and
    the line); no part is "not scored" and none gives its points to another; ungradable is not
    also provisional (the timing checks need a GPU here)."""
    broken = pytester.mkdir("broken")
    (broken / "tests").mkdir()
    (broken / "tests" / "adapters.py").write_text(BROKEN_ADAPTERS)
    result, reports = grade(pytester, f"--impl={broken}", "-k", "not test_forward and not test_backward or 128x128")
    assert result.ret == 1, result.stdout.str()[-2000:]
    results = json.loads((reports / "broken" / "results.json").read_text())
    sentence = "tests/adapters.py failed to import: SyntaxError: invalid syntax (tests/adapters.py, line 5)"
    assert results["extra_data"]["ungradable"] == sentence
    diagnoses = {t["part"]: set() for t in results["tests"]}
    for test in results["tests"]:
        diagnoses[test["part"]].add(test["diagnosis"])
    assert set(diagnoses) == {"flash_pytorch", "flash_triton", "ddp", "sharded_optimizer", "fsdp", "memory", "timing"}
    assert all(found == {sentence} for found in diagnoses.values()), diagnoses
    parts = results["extra_data"]["parts"]
    assert parts["fsdp"]["max_score"] == 8 and all(part["score"] == 0 for part in parts.values())
    assert results["output"].endswith(f"graded. {sentence}")  # -k left the rest never run: incomplete
    assert results["extra_data"]["provisional"] is False and "provisional" not in results["output"]
    assert "None" not in json.dumps(results["tests"])


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


# -- a test the grader's own code broke: run once more, then a grader error --------------------

PYTORCH_COURSE = "pytorch and 128x128 and not replay"  # the PyTorch class's course forward and backward


def test_a_grader_error_runs_the_test_once_more_then_is_recorded_unscored(pytester, monkeypatch):
    """The oracle comparison (test_flash.judge) raises twice in the forward check, a grader bug, and
    once in the backward, a flaky one: the backward passes on its second run and keeps the first
    error for staff; the forward is a grader error, with both attempts, neither passed nor failed,
    and the submission is incomplete. test_grader_errors.py follows such a run through regrades."""
    from grading.checks import test_flash

    judge, raised = test_flash.judge, Counter()

    def breaking(check, *args, **kwargs):
        raised[check.record.check] += 1
        if raised[check.record.check] <= {"forward": 2, "backward": 1}[check.record.check]:
            raise KeyError(f"oracle broke ({raised[check.record.check]})")
        return judge(check, *args, **kwargs)

    monkeypatch.setattr(test_flash, "judge", breaking)
    result, reports = grade(pytester, f"--impl={REFERENCE}", "-k", PYTORCH_COURSE)
    assert result.ret == 1, result.stdout.str()[-2000:]
    results = json.loads((reports / "reference" / "results.json").read_text())
    tests = {t["name"].split("::", 1)[1]: t for t in results["tests"]}
    forward = tests["flash_pytorch::forward[fp32-128x128-d64-full]"]
    backward = tests["flash_pytorch::backward[fp32-128x128-d64-full]"]
    assert forward["outcome"] == "grader_error" and status_of(forward) is None
    assert [a.split(" at ")[0] for a in forward["attempts"]] == \
        ["KeyError: 'oracle broke (1)'", "KeyError: 'oracle broke (2)'"]
    assert status_of(backward) == "passed" and "oracle broke (1)" in backward["retried_after"]
    assert raised == {"forward": 2, "backward": 2}
    assert results["extra_data"]["incomplete"] is True


SETUP_FAILS = """
import pytest


@pytest.fixture(autouse=True)
def broken_fixture(request):
    if request.node.name.startswith("test_backward"):
        raise RuntimeError("fixture broke")
"""


def test_a_grader_error_in_setup_is_recorded_too(pytester):
    """A fixture of the grader's that fails: no check was made, a stand-in record says why."""
    pytester.makepyfile(broken_fixture_plugin=SETUP_FAILS)
    pytester.syspathinsert()
    result, reports = grade(pytester, f"--impl={REFERENCE}", "-k", PYTORCH_COURSE, "-p", "broken_fixture_plugin")
    assert result.ret == 1, result.stdout.str()[-2000:]
    results = json.loads((reports / "reference" / "results.json").read_text())
    tests = {t["name"].split("::", 1)[1]: t for t in results["tests"]}
    assert status_of(tests["flash_pytorch::forward[fp32-128x128-d64-full]"]) == "passed"
    stand_in = tests["grader::test_backward[pytorch-course-fp32-128x128-d64-full]"]
    assert stand_in["outcome"] == "grader_error" and stand_in["max_score"] == 0
    assert "RuntimeError: fixture broke at " in stand_in["diagnosis"] and "(in setup)" in stand_in["diagnosis"]
    assert "grader" not in results["extra_data"]["parts"]
    assert results["extra_data"]["incomplete"] is True and results["output"].startswith("incomplete: 1 of ")


def test_a_run_stopped_by_x_is_incomplete(pytester):
    """no_softmax_scale fails its first check; -x stops there: not "0 / 2, 1 of 1 checks failed"."""
    result, reports = grade(pytester, f"--impl={WRONG}", "-x", "-k", PYTORCH_COURSE)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*stopping after 1 failures*"])
    results = json.loads((reports / "no_softmax_scale" / "results.json").read_text())
    assert len(results["tests"]) == 1 and status_of(results["tests"][0]) == "failed"  # a student failure
    extra = results["extra_data"]
    assert extra["incomplete"] is True and extra["checks_graded"] == 1
    assert results["output"].startswith(f"incomplete: 1 of {extra['checks_expected']} checks graded")
    never = [u["check_id"] for u in extra["ungraded"] if u["name"] is None]
    assert any("test_backward" in n and "no_softmax_scale-pytorch-fp32-128x128-d64-full" in n for n in never)
    with open(reports / "grades.csv", newline="") as f:
        assert next(csv.DictReader(f))["state"] == "incomplete"


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


def test_a_bad_rubric_stops_the_run_with_status_4_before_any_report(pytester, tmp_path):
    from tests.self.grading.test_rubric import bad_rubric
    path, line = bad_rubric(tmp_path, "visibility: after_due_date", "visibility: after_due")
    result, reports = grade(pytester, f"--impl={REFERENCE}", "--rubric", str(path))
    assert result.ret == 4, result.stdout.str()[-2000:]
    assert f"{path}:{line}: groups.flash_pytorch.forward.robustness.visibility is 'after_due'" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() and not reports.exists()


def test_the_sort_survives_pytests_own_reordering(pytester):
    """pytest regroups items by session-scoped parameters after the tryfirst hooks; the sort
    must come after it (on a CPU: a runner's distributed checks first, one after another)."""
    result, _ = grade(pytester, "--collect-only", "-q", f"--impl={REFERENCE}")
    modules = [line.split("::")[0].rsplit("/", 1)[-1] for line in result.outlines if "::" in line]
    distributed = [m in ("test_distributed.py", "test_fsdp.py") for m in modules]
    assert sum(distributed) > 10 and distributed == sorted(distributed, reverse=True), modules
    rest = [m for m in modules if m not in ("test_distributed.py", "test_fsdp.py")]
    assert rest[1:5] == ["test_memory.py"] * 4, rest  # the smallest case, then memory (tracks.memory_early)
