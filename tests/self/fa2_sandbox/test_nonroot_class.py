"""Issue 14 in CI: a grader that is not root finds in hostile submissions what root's grader finds.

bench/hostile_modes.py grades the whole hostile class twice (root's sandbox mode "namespace",
then "userns") and compares check by check; that takes minutes a mode. Here root's side is
test_hostile.py's class session (the `hostile_class_run` fixture: root's grader the normal way,
mode "namespace", each runner with a uid of its own), which the suite grades anyway; a grader
whose process really runs as nobody (test_nonroot.as_nobody: setpriv, with this Python, a venv's
as it is, in a private mount namespace where /root holds only the Python install and the project
when they live there)
grades the reference and a few hostile examples of that class again with test_hostile's `grade`
(its rubric, its -k selection, -n 2) and the class's seed. Its mode is "userns", the only
confinement an ordinary user's grader gets.

Every check must be in both runs with the same status and score, and with the example's finding
lines (EXPECTED.yaml `finding`) in the same checks' output. Only the mode differs, by design.

The examples that hang are left out: under the hostile rubric each costs 30 s per timed-out
check (hang_c_call: about 100 s), too long for CI. test_nonroot.py's
test_a_grader_that_is_not_root shows that a nobody grader's hanging runner dies with its setsid'd
child.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from fa2_sandbox.harness.client import PROJECT_ROOT
from grading.results.gradescope import status_of
from tests.self.fa2_sandbox.test_hostile import HOSTILE, REFERENCE, class_seed, isolated, results, session_count
from tests.self.fa2_sandbox.test_nonroot import NOBODY, as_nobody

# Quick ones (2 to 13 s each on 2 CPU cores), each exercising something the two modes do differently.
SUBSET = [
    "control_buggy",          # honest and wrong: the plain grading path, scores other than 0
    "tamper_files",           # hunts for the reference, the reports and other submissions' files
    "crash_sysexit_forward",  # exits mid-call: the status must come out through the namespace's init
    "channel_forge",          # forges the reply, naming files outside the exchange folder
    "output_flood",           # 40 MB of output per call, through the launcher's pipes
]
NAMES = ["reference", *SUBSET]
WORKERS = 2
GRADE_TIMEOUT = 240  # one run takes about 30 s here

# Run as nobody: test_hostile's own `grade`, so both runs build the same pytest command.
NOBODY_GRADER = '''
import json, os, sys
from pathlib import Path
sys.path.insert(0, {project!r})
from tests.self.fa2_sandbox.test_hostile import grade
proc, wall = grade([Path(p) for p in {impls!r}], Path({reports!r}), workers={workers}, timeout={timeout},
                   seed={seed})
print("RESULT " + json.dumps({{"uid": os.getuid(), "returncode": proc.returncode, "wall": wall,
                              "output": proc.stdout[-4000:] + proc.stderr[-2000:]}}))
'''


def findings(name: str) -> list:
    if name == "reference":
        return []
    return yaml.safe_load((HOSTILE / name / "EXPECTED.yaml").read_text()).get("finding", [])


def outcomes(reports: Path) -> tuple:
    """A run's {check: (status, score, finding lines in its output)} and {submission: isolation mode}."""
    rows, modes = {}, {}
    for name in NAMES:
        graded = results(reports, name)
        modes[name] = (graded["extra_data"].get("isolation") or {}).get("mode")
        for test in graded["tests"]:
            found = tuple(f for f in findings(name) if f in test["output"])
            rows[test["name"]] = (status_of(test), test["score"], found)
    return rows, modes


@pytest.mark.slow  # grades in a subprocess (about 50 s); CI runs it: it runs every test
def test_nobody_grades_the_hostile_subset_as_root_does(hostile_class_run):
    if os.geteuid() != 0:
        pytest.skip("not root: there is no root grader here to compare a nobody grader with")
    if os.environ.get("GRADER_SANDBOX") or not isolated():
        pytest.skip("root's grader does not get sandbox mode \"namespace\" here (GRADER_SANDBOX is set, "
                    "or no mount namespaces)")
    impls = [str(REFERENCE)] + [str(HOSTILE / name) for name in SUBSET]

    public = Path(tempfile.mkdtemp(prefix="nonroot-class-"))  # tmp_path is root's alone (mode 700)
    try:
        os.chmod(public, 0o755)
        os.chown(public, NOBODY, NOBODY)  # nobody's to write: its reports, its rubric copy, its HOME
        script = NOBODY_GRADER.format(project=str(PROJECT_ROOT), impls=impls, reports=str(public / "reports"),
                                      workers=WORKERS, timeout=GRADE_TIMEOUT, seed=class_seed(hostile_class_run))
        proc = as_nobody(script, public, timeout=GRADE_TIMEOUT + 60)
        assert "RESULT " in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
        run = json.loads(proc.stdout.split("RESULT ", 1)[1])
        assert run["uid"] == NOBODY and run["returncode"] in (0, 1), run["output"]
        # the grader, not root, wrote the reports: they are nobody's
        assert (public / "reports").stat().st_uid == NOBODY
        assert (public / "reports" / "reference" / "results.json").stat().st_uid == NOBODY
        nobody_rows, nobody_modes = outcomes(public / "reports")
        nobody_count = session_count(run["output"])
        note = (results(public / "reports", "reference")["extra_data"].get("isolation") or {}).get("note", "")
    finally:
        shutil.rmtree(public, ignore_errors=True)
    if set(nobody_modes.values()) == {"none"} and "user namespaces were refused" in note:
        pytest.skip("unprivileged user namespaces are refused on this machine: " + note[:300])

    root_rows, root_modes = outcomes(hostile_class_run["reports"])
    print(f"\nroot ('namespace'): the class session, {hostile_class_run['wall']:.0f} s; "
          f"nobody ('userns'): {len(nobody_rows)} checks in {run['wall']:.0f} s")

    assert root_modes == dict.fromkeys(NAMES, "namespace"), root_modes
    assert nobody_modes == dict.fromkeys(NAMES, "userns"), nobody_modes
    differ = [(key, root_rows.get(key), nobody_rows.get(key)) for key in sorted(set(root_rows) | set(nobody_rows))
              if root_rows.get(key) != nobody_rows.get(key)]
    table = "\n".join(f"  {key}\n      root:   {a}\n      nobody: {b}" for key, a, b in differ)
    assert not differ, (f"{len(differ)} checks differ, (status, score, findings) or None where missing:\n"
                        f"{table}")
    # and none is missing from both: every check nobody's session ran has its row in results.json
    # (test_hostile's test_session_completes asserts the same of root's)
    for name in NAMES:
        assert any(key.startswith(f"{name}::") for key in root_rows), f"no checks for {name}"
    assert len(nobody_rows) == nobody_count, f"nobody: pytest ran {nobody_count}, results.json hold {len(nobody_rows)}"
