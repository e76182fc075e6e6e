"""The same class graded twice, once in one process (-n 0) and once over two xdist workers
(-n 2), gets identical scores and statuses for every check (issue 13, item 4; there are no
timing checks on a CPU).

The -n 2 run is test_hostile.py's class session (the `hostile_class_run` fixture), which the
suite grades anyway; this test grades part of that class again in one process, with the same
rubric, the same -k selection and the same seed, and compares check by check. The part is a
small mixed class: the reference (correct), control_buggy (honest and wrong), tamper_replay
(replays cached outputs: which of two cases of one shape gets the replay follows the order in
which a runner answers them, and the replay check's second input must catch it either way) and
crash_segfault (its runner dies and is restarted).
"""
import json
from pathlib import Path

import pytest

from grading.results.gradescope import status_of
from tests.self.fa2_sandbox.test_hostile import HOSTILE, REFERENCE, class_seed, grade, results

CLASS = ["reference", "control_buggy", "tamper_replay", "crash_segfault"]


def graded(reports: Path) -> dict:
    """{submission: {check name: (score, status, outcome)}} of one run, and each one's total."""
    rows = {}
    for name in CLASS:
        graded = results(reports, name)
        rows[name] = {t["name"]: (t["score"], status_of(t), t.get("outcome"))
                      for t in graded["tests"] if not t["name"].split("::")[1].startswith("timing")}
        rows[name]["total"] = (graded["score"], graded["max_score"], None)
    return rows


@pytest.mark.slow
def test_one_process_and_two_workers_agree(hostile_class_run, tmp_path):
    # the class session's seed: drawn fresh each session, so the agreement holds for inputs nobody chose
    seed = class_seed(hostile_class_run)
    impls = [REFERENCE if name == "reference" else HOSTILE / name for name in CLASS]
    proc, wall = grade(impls, tmp_path / "n0", workers=0, timeout=900, seed=seed)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    serial, parallel = graded(tmp_path / "n0"), graded(hostile_class_run["reports"])
    print(f"\n-n 0: {sum(map(len, serial.values()))} checks of {len(CLASS)} submissions in {wall:.0f} s")
    differences = [f"{name}: {check}: -n 0 {serial[name].get(check)} vs -n 2 {parallel[name].get(check)}"
                   for name in CLASS for check in sorted(set(serial[name]) | set(parallel[name]))
                   if serial[name].get(check) != parallel[name].get(check)]
    assert not differences, f"seed {seed}:\n" + "\n".join(differences)
    assert all(len(checks) > 1 for checks in serial.values()), json.dumps(serial)[:2000]  # every one was graded
