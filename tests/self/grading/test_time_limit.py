"""--time-limit, as Gradescope's per-run limit (grading/session.py cut_if_out_of_time): an advice
check whose turn comes after it is cut, earning nothing and keeping its points in its group; a
requirement check is never cut (issue 40)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_spent_time_limit_cuts_advice_checks_and_never_a_requirement(tmp_path):
    # The course case (a requirement of the official tests) and the 17x17 cases (robustness: advice).
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--impl", str(ROOT / "submissions" / "reference"), "--reports", str(tmp_path / "r"),
                           "--seed", "7", "--time-limit", "0", "-k", "test_forward and pytorch and (128x128 or 17x17)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    tests = {t["name"]: t for t in json.loads((tmp_path / "r" / "reference" / "results.json").read_text())["tests"]
             if t.get("status")}
    course = tests["reference::flash_pytorch::forward[fp32-128x128-d64-full]"]
    assert course["status"] == "passed" and course["score"] == course["max_score"], proc.stdout[-2000:]
    cut = [t for name, t in tests.items() if "17x17" in name]
    assert len(cut) == 2
    for t in cut:
        assert t["status"] == "failed" and t["score"] == 0 and t["max_score"] > 0  # its points stay in its group
        assert t["output"].startswith("cut: the run's time limit of 0 s was spent")
        assert "never a requirement check" in t["output"]
