"""The grader, run exactly as a user runs it, gives the bundled reference submission full marks."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.results import scoring
from grading.rubric import Rubric
from tests.self.grading.test_examples import demo_class_reports

ROOT = Path(__file__).resolve().parents[3]


# demo_class: CI judges its demo class's reference here; graded again in the README's test command,
# it would cost that command a whole grading of the reference, which the README's first command is.
@pytest.mark.slow
@pytest.mark.demo_class
def test_reference_scores_full_marks(tmp_path):
    # .ci/run's demo class (README.md's command, the reference among the examples), whose exit
    # status and pages .ci/run checks: this judges its reference, not a second grading of it.
    reports, log = demo_class_reports(), None
    if reports is None:
        reports = tmp_path / "reports"
        proc = subprocess.run([sys.executable, "-m", "pytest", "--impl", "submissions/reference", "--reports",
                               str(reports), "-q"],
                              cwd=ROOT, capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        log = proc.stdout
    results = json.loads((reports / "reference" / "results.json").read_text())
    # Full marks of what this machine can grade; the maximum is the rubric's, on every machine, and
    # what needs a GPU is "not graded here" (counted 0, the total provisional) on a CPU.
    assert results["max_score"] == pytest.approx(Rubric().total())
    waiting = sum(t["max_score"] for t in results["tests"] if t["outcome"] == "not_graded_here")
    assert results["score"] == pytest.approx(results["max_score"] - waiting, abs=0.005), results["output"]  # hundredths
    assert results["extra_data"]["provisional"] == (waiting > 0)
    outcomes = {t["outcome"] for t in results["tests"]}
    assert outcomes <= {"passed", "skipped", "not_graded_here"}
    for test in results["tests"]:
        if test["outcome"] in ("skipped", "not_graded_here"):
            assert test["output"].startswith(("skipped: ", "not graded here: ")) and len(test["output"]) > 20, test
    parts = results["extra_data"]["parts"]
    assert parts["flash_pytorch"]["max_score"] > 0 and parts["flash_triton"]["max_score"] > 0
    if log is not None:
        assert "grades" in log and "reference" in log
    stopped_at_the_triton_checks(reports, tmp_path / "stopped")


def stopped_at_the_triton_checks(reports: Path, stopped: Path):
    """The reference's run as a time limit would have left it before its Triton forward and
    backward checks (their check files gone), assembled as run_autograder does: the PyTorch
    groups, all of whose checks ran, score in full; the Triton groups hold their points back."""
    shutil.copytree(reports / "reference", stopped / "reference")
    for path in (stopped / "reference" / "checks").glob("flash_triton_*ward_*.json"):
        path.unlink()
    results = scoring.assemble(stopped, "reference", Rubric())
    grouped = {t["extra_data"]["group"]: t for t in
               json.loads((stopped / "reference" / "gradescope.json").read_text())["tests"]}
    rubric = Rubric()
    for group in ("flash_pytorch.forward.course", "flash_pytorch.backward.course", "flash_pytorch.forward.handout"):
        assert grouped[group]["score"] == grouped[group]["max_score"] == rubric.points(group), grouped[group]
        assert "never ran" not in grouped[group]["output"]
    unrun = results["extra_data"]["never_run_by_group"]
    assert unrun and all(group.startswith("flash_triton.") for group in unrun)
    assert all(grouped[g]["score"] == 0 for g in unrun if g.endswith(("forward.course", "backward.course")))
