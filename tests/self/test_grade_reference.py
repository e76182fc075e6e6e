"""The grader, run exactly as a user runs it, gives the bundled reference submission full marks."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_reference_scores_full_marks(tmp_path):
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--impl", "submissions/reference", "--reports",
                           str(reports), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    results = json.loads((reports / "reference" / "results.json").read_text())
    assert results["max_score"] > 0 and results["score"] == results["max_score"], results["output"]
    outcomes = {t["extra_data"]["outcome"] for t in results["tests"]}
    assert outcomes <= {"passed", "skipped"}
    for test in results["tests"]:
        if test["extra_data"]["outcome"] == "skipped":
            assert test["output"].startswith("skipped: ") and len(test["output"]) > 20, test
    parts = results["extra_data"]["parts"]
    assert parts["flash_pytorch"]["max_score"] > 0 and parts["flash_triton"]["max_score"] > 0
    assert "grades" in proc.stdout and "reference" in proc.stdout
