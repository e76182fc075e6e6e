"""The same class graded twice, once in one process (-n 0) and once over two xdist workers
(-n 2), gets identical scores and statuses for every check (issue 13, item 4; there are no
timing checks on a CPU).

The class mixes a correct submission, buggy ones and hostile ones (a replaying cache, a
segfault), on a selection of checks small enough for CI: the course and odd-length PyTorch
cases, hygiene, the implementation check and the sharded optimizer.
"""
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLASS = ["submissions/reference", "submissions/examples/causal_ignored", "submissions/examples/lse_base2",
         "submissions/hostile/tamper_replay", "submissions/hostile/crash_segfault",
         "submissions/examples/sharded_full_state_everywhere"]
SELECT = "pytorch and (128x128 or 17x17 or hygiene or no_library) or test_sharded"


def grade(reports: Path, workers: str, seed: int) -> dict:
    """{submission: {check name: (score, status, outcome)}} of one run."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
               *[f"--impl={c}" for c in CLASS], f"--reports={reports}", "-k", SELECT, f"--seed={seed}"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    graded = {}
    for name in (Path(c).name for c in CLASS):
        results = json.loads((reports / name / "results.json").read_text())
        graded[name] = {t["name"]: (t["score"], t.get("status"), t["extra_data"].get("outcome"))
                        for t in results["tests"] if not t["name"].split("::")[1].startswith("timing")}
        graded[name]["total"] = (results["score"], results["max_score"], None)
    return graded


@pytest.mark.slow
def test_one_process_and_two_workers_agree(tmp_path):
    # One seed for both (each new reports folder would otherwise draw its own secret one), fresh
    # each session, so the agreement holds for inputs nobody chose.
    seed = random.randrange(2**31)
    serial, parallel = grade(tmp_path / "n0", "0", seed), grade(tmp_path / "n2", "2", seed)
    assert set(serial) == set(parallel)
    differences = [f"{name}: {check}: -n 0 {serial[name].get(check)} vs -n 2 {parallel[name].get(check)}"
                   for name in serial for check in set(serial[name]) | set(parallel[name])
                   if serial[name].get(check) != parallel[name].get(check)]
    assert not differences, f"seed {seed}:\n" + "\n".join(differences)
    assert all(len(checks) > 1 for checks in serial.values())  # every submission was graded
