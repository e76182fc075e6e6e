"""The grader against deliberately hostile submissions (submissions/hostile/, each with an
EXPECTED.yaml), and the runner's guarantees one by one.

The measurement: one `pytest -n 2` session grades the hostile examples mixed with the reference
and an honest buggy control, on a selection of checks (SELECT) and with small timeouts
(fixtures/hostile_rubric.yaml). It must finish; each hostile example must get its precise
finding; the controls' results.json must equal a solo run of each (name, score, status of every
check); nothing a hostile example spawned may survive the session.

On a GPU machine the class holds the `gpu_only` and `gpu` examples and the controls (the rest
behave the same on any machine); HOSTILE_ALL=1 takes them all. HOSTILE_RUN_DIR=DIR keeps the
gradings there, so that several pytest calls (under a per-command time limit) share them.
"""
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from fa2_sandbox.harness import confinement
from fa2_sandbox.harness.client import PROJECT_ROOT
from grading.results import store
from grading.results.gradescope import status_of

HOSTILE = PROJECT_ROOT / "submissions" / "hostile"
REFERENCE = PROJECT_ROOT / "submissions" / "reference"
RUBRIC = Path(__file__).parents[1] / "fixtures" / "hostile_rubric.yaml"
ON_GPU = torch.cuda.is_available()
SELECT = ("(pytorch and (128x128-d64-full or 17x17)) or hygiene or no_library or no_score_matrix"
          " or (triton and (128x128-d64-full or 17x17)) or (budget and pytorch and not reference)")
MEMORY_LIMIT_GB = "3"  # for every runner of the session: the hog must hit it, not the machine
ORPHAN_MARK = "hostile-orphan-"  # in the command line of every process orphan_children spawns
# ... and this in those that the tests here and in test_nonroot spawn themselves: the class session
# kills what is left of orphan_children's, and must not kill a test's running beside it on the
# other xdist worker (each test kills only its own mark).
TEST_MARK = "selftest-orphan-"


def examples() -> dict:
    found = {}
    for folder in sorted(HOSTILE.iterdir()):
        if not (folder / "EXPECTED.yaml").is_file():
            continue
        spec = yaml.safe_load((folder / "EXPECTED.yaml").read_text())
        if spec.get("gpu_only") and not ON_GPU:
            continue
        if ON_GPU and not (spec.get("gpu_only") or spec.get("gpu") or spec.get("control")) \
                and os.environ.get("HOSTILE_ALL") != "1":
            continue
        found[folder.name] = spec
    return found


EXAMPLES = examples()
CONTROLS = ["reference"] + [name for name, spec in EXAMPLES.items() if spec.get("control")]


def rubric(folder: Path) -> Path:
    """The grading rubric with the hostile rubric's timeouts; on a GPU with room for first-call
    Triton compiling and autotuning (no example that hangs runs on a GPU by default, so the long
    timeouts cost nothing there)."""
    data = yaml.safe_load((PROJECT_ROOT / "grading" / "rubric.yaml").read_text())
    data["timeouts"] = yaml.safe_load(RUBRIC.read_text())["timeouts"]
    if ON_GPU:
        data["timeouts"].update(flash=180, timing=600)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rubric.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def grade(impls: list, reports: Path, workers: int, timeout: float, seed: int = None):
    """One grading session of `impls` under the hostile rubric and SELECT; without `seed`, the
    reports folder's secret seed (a new folder draws a fresh one)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--reports", str(reports),
           "--rubric", str(rubric(reports.parent / f"{reports.name}-rubric")), "-k", SELECT]
    if seed is not None:
        cmd.append(f"--seed={seed}")
    if workers:  # loadgroup named outright: the plugin's own switch to it does not reach the workers
        cmd += ["-n", str(workers), "--dist", "loadgroup"]
    for impl in impls:
        cmd += ["--impl", str(impl)]
    env = {**os.environ, "GRADER_MEMORY_LIMIT_GB": MEMORY_LIMIT_GB}
    env = {k: v for k, v in env.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def orphans(mark: str = ORPHAN_MARK) -> list:
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if mark in cmdline and "cmdline" not in cmdline:
            found.append((int(pid), cmdline.replace("\0", " ")))
    return found


def kill_orphans(mark: str = ORPHAN_MARK):
    for pid, _ in orphans(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def session_count(output: str) -> int | None:
    """How many checks pytest's summary line says the session ran, whatever their outcome (None:
    no summary line, the session did not end normally)."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)]
    if not lines:
        return None
    return sum(int(n) for n, _ in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", lines[-1]))


def run_class(base: Path) -> dict:
    """The class session: the hostile examples, the reference and the control, `-n 2`. Its reports
    serve test_determinism and test_nonroot_class too, which grade some of it again another way
    and compare (with its seed, `class_seed`)."""
    kill_orphans()
    impls = [REFERENCE] + [HOSTILE / name for name in EXAMPLES]
    proc, wall = grade(impls, base / "class", workers=2, timeout=1200)
    survivors = orphans()
    kill_orphans()
    print(f"\nhostile class session: {len(impls)} submissions, {wall:.0f} s wall")
    return {"returncode": proc.returncode, "output": (proc.stdout + proc.stderr)[-6000:], "wall": wall,
            "reports": str(base / "class"), "survivors": survivors, "count": session_count(proc.stdout)}


def class_seed(run: dict) -> int:
    """The seed the class session drew its inputs from (its reports folder's secret seed)."""
    return store.secret_seed(run["reports"])


def run_solo(base: Path, name: str) -> dict:
    proc, wall = grade([REFERENCE if name == "reference" else HOSTILE / name], base / f"solo-{name}",
                       workers=0, timeout=900)
    return {"returncode": proc.returncode, "output": proc.stdout[-3000:], "reports": str(base / f"solo-{name}")}


def once(tmp_path_factory, key: str, compute) -> dict:
    """compute(base) once per session, even when `pytest -n 2` spreads this module's tests over
    workers: the first worker runs it under a lock in the session's shared folder, the others
    read what it wrote."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the session's workers
    if os.environ.get("HOSTILE_RUN_DIR"):  # kept across sessions: grade once, check in several calls
        base = Path(os.environ["HOSTILE_RUN_DIR"]).resolve()
        base.mkdir(parents=True, exist_ok=True)
    done = base / f"hostile-{key}.json"
    with open(base / f"hostile-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(json.dumps(compute(base / "hostile")))
    run = json.loads(done.read_text())
    run["reports"] = Path(run["reports"])
    return run


@pytest.fixture
def solo_run(tmp_path_factory):
    return lambda name: once(tmp_path_factory, f"solo-{name}", lambda base: run_solo(base, name))


def results(reports: Path, name: str) -> dict:
    path = reports / name / "results.json"
    assert path.exists(), f"no results.json for {name}"
    return json.loads(path.read_text())


def check_key(test: dict) -> str:
    return test["name"].split("::", 1)[1]  # part::check[case], without the submission


def matches(key: str, pattern: str) -> bool:
    """fnmatch with '[' literal: the patterns are check names like flash_pytorch::forward[*]."""
    return fnmatch.fnmatchcase(key, pattern.replace("[", "[[]"))


def isolated() -> bool:
    return confinement.isolation(tempfile.gettempdir())["mode"] == "namespace"


# -- the class session ------------------------------------------------------------------------

@pytest.mark.slow
def test_session_completes(hostile_class_run):
    out = hostile_class_run["output"]
    assert hostile_class_run["returncode"] in (0, 1), out[-4000:]
    assert "INTERNALERROR" not in out and "HOSTILE CONFTEST" not in out, out[-4000:]
    assert "worker crash" not in out, out[-4000:]
    rows = {name: results(hostile_class_run["reports"], name)["tests"] for name in ["reference", *EXAMPLES]}
    assert all(rows.values()), [name for name, tests in rows.items() if not tests]
    # every check the session ran has its row in a results.json
    counted = {name: len(tests) for name, tests in rows.items()}
    assert sum(counted.values()) == hostile_class_run["count"], (hostile_class_run["count"], counted, out[-2000:])
    print(f"class session wall time: {hostile_class_run['wall']:.0f} s")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, s in EXAMPLES.items() if not s.get("control")])
def test_hostile_finding(hostile_class_run, name):
    spec = EXAMPLES[name]
    graded = results(hostile_class_run["reports"], name)
    tests = {check_key(t): t for t in graded["tests"]}

    def matching(pattern):
        return [k for k in tests if matches(k, pattern)]

    must_fail = list(spec.get("must_fail", [])) + (list(spec.get("must_fail_gpu", [])) if ON_GPU else [])
    problems = []
    for pattern in must_fail:
        keys = matching(pattern)
        if not keys and not pattern.startswith("timing::"):
            problems.append(f"must_fail {pattern!r} matched no check")
        for key in keys:
            test = tests[key]
            unscored = test.get("outcome") in ("skipped", "not_graded_here")
            if status_of(test) != "failed" and not unscored:
                problems.append(f"{key} should fail, got {test['status']}: {test['output'][:200]}")
            elif status_of(test) == "failed" and not (ON_GPU and key.startswith("memory::")):
                # (on a GPU the memory checks warm up first, so their failure says 'setup')
                problems.extend(f"{key}: finding {f!r} missing from: {test['output'][:300]}"
                                for f in spec.get("finding", []) if f not in test["output"])
    for pattern in spec.get("must_pass", []):
        keys = matching(pattern)
        if not keys:
            problems.append(f"must_pass {pattern!r} matched no check")
        problems.extend(f"{k} should pass: {tests[k]['output'][:300]}" for k in keys
                        if status_of(tests[k]) != "passed")
    listed = must_fail + list(spec.get("may_fail", [])) + list(spec.get("must_pass", []))
    for key, test in tests.items():  # anything else may only fail as not attempted (a slot it skips)
        if any(matches(key, p) for p in listed) or status_of(test) == "passed":
            continue
        if test.get("outcome") not in ("not_attempted", "import_error", "not_graded_here"):
            problems.append(f"{key} failed unexpectedly: {test['output'][:300]}")

    log = graded["extra_data"]["runner_log_tail"]
    problems.extend(f"log lacks {s!r}" for s in spec.get("log_contains", []) if s not in log)
    if isolated():
        problems.extend(f"log lacks {s!r}: {log[-600:]}" for s in spec.get("log_contains_isolated", []) if s not in log)
    if "log_max_bytes" in spec and len(log.encode()) > spec["log_max_bytes"]:
        problems.append(f"log tail is {len(log.encode())} bytes, over {spec['log_max_bytes']}")
    if spec.get("no_survivors"):
        survivors = [c for _, c in hostile_class_run["survivors"] if spec["no_survivors"] in c]  # [pid, cmdline]
        if survivors and not isolated() and all("setsid" in c for c in survivors):
            pytest.xfail("without a uid of its own, a setsid'd child escapes the process-group kill")
        problems.extend(f"survived the session: {c}" for c in survivors)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("name", CONTROLS)
def test_controls_unchanged(hostile_class_run, solo_run, name):
    """A control's results are the same graded next to the hostile examples as graded alone."""
    solo = solo_run(name)
    assert solo["returncode"] in (0, 1), solo["output"]
    strip = lambda r: sorted((t["name"], t["score"], t["max_score"], status_of(t)) for t in r["tests"])
    assert strip(results(hostile_class_run["reports"], name)) == strip(results(solo["reports"], name))
