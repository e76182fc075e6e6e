"""The grader catches real student bugs.

Every example under submissions/examples/ is a small course-style repo: most carry one deliberate
bug, a few are correct but written differently from the reference. All of them are graded in ONE
run of the real suite, exactly as a user runs it:

    python -m pytest -n 2 --impl 'submissions/examples/*' --reports DIR

and then each example's results.json is held against its EXPECTED.yaml:

    bug:        one sentence
    must_fail:  patterns (fnmatch, on "part::check[case]"), each must match >= 1 failed check
    diagnosis:  substrings, each must appear in the diagnosis or output of >= 1 failed check
    must_pass:  optional patterns, each must match >= 1 check that ran and passed, and no
                failed check
    may_fail:   patterns allowed to fail (parts not implemented, collateral damage)
    gpu_only:   true when the bug only shows on a GPU; gpu_must_fail, gpu_diagnosis,
                gpu_must_pass and gpu_may_fail add to the lists above when the run had a GPU,
                cpu_diagnosis when it had none (wordings that differ by device, e.g. the memory
                checks)
    cpu_not_here: optional patterns for a run without a GPU: each must match >= 1 check, and
                every check it matches must be "not graded here" (it needs a GPU)
    known_gap:  optional: the grader is known to miss this bug (why). The example's must_fail and
                diagnosis then xfail; once the grader catches it the test fails, to drop the key.

Every failed check that no must_fail or may_fail pattern covers is a failure of this test, and an
example without must_fail (a correct one) must score full marks on everything but its may_fail.
The table example x part -> caught / missed / ok is printed (see it with `pytest -s`), written
next to the reports (table.txt, with run.json and grader.log), and included in every failure
message. FA2_EXAMPLES_ARGS adds words to the grading command, e.g. FA2_EXAMPLES_ARGS="-n 4";
FA2_EXAMPLES_REPORTS=DIR judges the reports of an earlier class run instead (what .ci/run does).
The tests that need the class run are marked demo_class: the README's test command leaves them
out (grading the class takes most of its time budget), and .ci/run runs them on its demo class.
"""
import fcntl
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grading.results.gradescope import status_of

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "submissions" / "examples"
NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "EXPECTED.yaml").is_file()) if EXAMPLES.is_dir() else []
PARTS = ("flash_pytorch", "flash_triton", "memory", "ddp", "sharded_optimizer", "fsdp", "timing")
TIMEOUT_S = 3600


def matches(pattern: str, name: str) -> bool:
    """fnmatch with only * and ? special: the [ ] of check names are literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name) is not None


def part_of(pattern_or_name: str) -> str:
    return pattern_or_name.split("::", 1)[0]


# -- one grading run for the whole session, shared by xdist workers ----------------------------

def run_grader(out: Path) -> dict:
    """`python -m pytest -n 2 --impl 'submissions/examples/*' --reports DIR`, plus the words of
    FA2_EXAMPLES_ARGS if set (e.g. "-n 4" on a bigger machine)."""
    reports = out / "reports"
    # --opt=value: a separate absolute path would be taken for a test path (and set the rootdir)
    # while the options are still unknown, which they are where the plugin is not installed.
    command = [sys.executable, "-m", "pytest", "-n", "2", "--impl=submissions/examples/*",
               f"--reports={reports}", "-q", "-p", "no:cacheprovider", "--durations=25",
               *shlex.split(os.environ.get("FA2_EXAMPLES_ARGS", ""))]
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    run = {"command": " ".join(command[1:]), "returncode": proc.returncode, "seconds": time.monotonic() - start,
           "cpu_seconds": cpu, "reports": str(reports), "stdout_tail": proc.stdout[-6000:],
           "stderr_tail": proc.stderr[-3000:]}
    (out / "run.json").write_text(json.dumps(run, indent=1))
    (out / "grader.log").write_text(proc.stdout + "\n" + proc.stderr)
    return run


def demo_class_reports():
    """The reports folder of .ci/run's demo class run (FA2_EXAMPLES_REPORTS, relative to the
    project), or None: then the tests that judge it grade for themselves."""
    if not os.environ.get("FA2_EXAMPLES_REPORTS"):
        return None
    return (ROOT / os.environ["FA2_EXAMPLES_REPORTS"]).resolve()


def earlier_run(reports: Path) -> dict:
    """A class run made before this session that graded submissions/examples/* into `reports`
    (FA2_EXAMPLES_REPORTS): .ci/run grades the README's demo class once, checks its exit status,
    and lets this test judge those reports instead of grading the examples a second time."""
    return {"command": f"the class run whose reports are in {reports} (FA2_EXAMPLES_REPORTS)", "returncode": None,
            "seconds": None, "reports": str(reports), "stdout_tail": "", "stderr_tail": ""}


@pytest.fixture(scope="session")
def graded(tmp_path_factory, worker_id, testrun_uid):
    """The grading run, done once per session: under xdist the first worker to get here runs
    it, and the others wait on a lock and read its results."""
    base = tmp_path_factory.getbasetemp()
    out = (base if worker_id == "master" else base.parent) / f"examples-{testrun_uid}"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (reports := demo_class_reports()) is not None:
                run = earlier_run(reports)
            elif (out / "run.json").exists():
                run = json.loads((out / "run.json").read_text())
            else:
                run = run_grader(out)
            if not (out / "verdicts.json").exists():
                verdicts = {name: judge(name, Path(run["reports"])) for name in NAMES}
                table = render_table(verdicts, run)
                (out / "table.txt").write_text(table)
                (out / "verdicts.json").write_text(json.dumps(verdicts, indent=1))
                print("\n" + table)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    verdicts = json.loads((out / "verdicts.json").read_text())
    return run, verdicts, (out / "table.txt").read_text(), out


# -- judging one example -----------------------------------------------------------------------

def load_expected(name: str) -> dict:
    data = yaml.safe_load((EXAMPLES / name / "EXPECTED.yaml").read_text()) or {}
    for key in ("must_fail", "diagnosis", "must_pass", "may_fail", "cpu_diagnosis", "cpu_not_here", "gpu_must_fail",
                "gpu_diagnosis", "gpu_must_pass", "gpu_may_fail"):
        data[key] = list(data.get(key) or [])
    return data


def judge(name: str, reports: Path) -> dict:
    """Everything the test asserts, worked out once: problems, gap problems and the table row."""
    expected = load_expected(name)
    path = reports / name / "results.json"
    if not path.exists():
        return {"problems": [f"no results.json for {name} (the grading run did not finish it)"], "gap": [],
                "row": {p: "NO RESULT" for p in PARTS}, "score": None, "max_score": None}
    results = json.loads(path.read_text())
    on_gpu = results["extra_data"].get("environment", {}).get("device", "cpu") != "cpu"
    must_fail, diagnosis, may_fail = expected["must_fail"], expected["diagnosis"], expected["may_fail"]
    must_pass, not_here = expected["must_pass"], []
    if on_gpu:
        must_fail, diagnosis = must_fail + expected["gpu_must_fail"], diagnosis + expected["gpu_diagnosis"]
        may_fail, must_pass = may_fail + expected["gpu_may_fail"], must_pass + expected["gpu_must_pass"]
    else:
        diagnosis, not_here = diagnosis + expected["cpu_diagnosis"], expected["cpu_not_here"]

    checks = [{"name": t["name"].split("::", 1)[1], "status": status_of(t), "score": t["score"],
               "max_score": t["max_score"], "outcome": t.get("outcome", ""),
               "text": (t.get("diagnosis") or "") + "\n" + (t.get("output") or "")}
              for t in results["tests"]]
    failed = [c for c in checks if c["status"] == "failed"]
    problems, gap = [], []  # gap: what a known_gap excuses (the bug not caught, or not explained)

    for pattern in must_fail:
        if not any(matches(pattern, c["name"]) for c in failed):
            seen = [f"{c['name']}: {c['status']}" for c in checks if matches(pattern, c["name"])]
            gap.append(f"must_fail {pattern!r} matched no failed check"
                       + (f" (it matched: {'; '.join(seen[:5])})" if seen else " (it matched no check at all)"))
    for text in diagnosis:
        if not any(text in c["text"] for c in failed):
            given = sorted({c["text"].strip().splitlines()[0] for c in failed if c["text"].strip()})
            gap.append(f"diagnosis {text!r} appears in no failed check; diagnoses given: " + "; ".join(given[:8]))
    for c in failed:
        if not any(matches(p, c["name"]) for p in must_fail + may_fail):
            problems.append(f"unexpected failure {c['name']} [{c['outcome']}]: {c['text'].strip()[:300]}")
    for pattern in not_here:
        hit = [c for c in checks if matches(pattern, c["name"])]
        if not hit:
            problems.append(f"cpu_not_here {pattern!r} matched no check at all")
        problems += [f"cpu_not_here {pattern!r}: {c['name']} is {c['outcome']}, expected not_graded_here "
                     f"({c['text'].strip()[:200]})" for c in hit if c["outcome"] != "not_graded_here"]
    for pattern in must_pass:
        hit = [c for c in checks if matches(pattern, c["name"])]
        if not any(c["outcome"] == "passed" for c in hit):
            problems.append(f"must_pass {pattern!r} matched no check that ran and passed "
                            f"({len(hit)} matched, outcomes {sorted({c['outcome'] for c in hit})})")
        problems += [f"must_pass {pattern!r}: {c['name']} failed [{c['outcome']}]: {c['text'].strip()[:200]}"
                     for c in hit if c["status"] == "failed"]
    lost = sum(c["max_score"] - c["score"] for c in checks if c["status"] == "failed"
               and not any(matches(p, c["name"]) for p in may_fail))
    if not must_fail and lost > 1e-6:
        problems.append(f"a correct example lost {lost:g} points outside its may_fail "
                        f"(score {results['score']} of {results['max_score']})")
    if expected.get("known_gap") and not gap:
        problems.append(f"known_gap is set but the grader now catches the bug: remove known_gap from "
                        f"{name}/EXPECTED.yaml ({expected['known_gap']})")
    elif gap and not expected.get("known_gap"):
        problems += gap

    row = {}
    for part in PARTS:
        in_part = [c for c in checks if part_of(c["name"]) == part]
        wanted = [p for p in must_fail if part_of(p) == part]
        unexpected = [c for c in failed if part_of(c["name"]) == part
                      and not any(matches(p, c["name"]) for p in must_fail + may_fail)]
        if unexpected:
            row[part] = "UNEXPECTED"
        elif wanted:
            caught = all(any(matches(p, c["name"]) for c in failed) for p in wanted)
            row[part] = "caught" if caught else ("missed (known)" if expected.get("known_gap") else "missed")
        elif not in_part or all(c["outcome"] in ("skipped", "not_graded_here") for c in in_part):
            row[part] = "skipped" if in_part else "-"
        elif any(c["status"] == "failed" for c in in_part):
            row[part] = "-"  # only allowed failures: not attempted or collateral
        else:
            row[part] = "ok"
    return {"problems": problems, "gap": gap, "row": row, "score": results["score"],
            "max_score": results["max_score"], "known_gap": expected.get("known_gap"),
            "device": "gpu" if on_gpu else "cpu"}


def render_table(verdicts: dict, run: dict) -> str:
    width = max([len(n) for n in verdicts] + [7])
    head = f"{'example':{width}}  " + "  ".join(f"{p:>17}" for p in PARTS) + "   score"
    when = (f"examples graded in {run['seconds']:.0f} s wall, {run.get('cpu_seconds', 0):.0f} s CPU "
            f"({run['command']}; exit status {run['returncode']})" if run["seconds"] is not None
            else f"examples judged from {run['command']}")
    lines = [when, head,
             "-" * len(head)]
    for name, v in verdicts.items():
        score = f"{v['score']:g}/{v['max_score']:g}" if v["score"] is not None else "-"
        flag = "  <-- " + v["problems"][0][:80] if v["problems"] else ""
        lines.append(f"{name:{width}}  " + "  ".join(f"{v['row'].get(p, '-'):>17}" for p in PARTS)
                     + f"   {score}{flag}")
    return "\n".join(lines)


# -- the tests ---------------------------------------------------------------------------------

def test_examples_exist():
    assert len(NAMES) >= 25, f"expected at least 25 examples in {EXAMPLES}, found {len(NAMES)}"
    index = (EXAMPLES / "README.md").read_text()
    unlisted = [name for name in NAMES if f"`{name}`" not in index]
    assert not unlisted, f"{EXAMPLES / 'README.md'} does not list {unlisted}: add a row for each"
    for name in NAMES:
        folder = EXAMPLES / name
        assert (folder / "README.md").is_file() and (folder / "tests" / "adapters.py").is_file(), name
        expected = load_expected(name)
        assert expected.get("bug"), f"{name}/EXPECTED.yaml has no bug sentence"
        if expected.get("gpu_only"):
            assert not expected["must_fail"], f"{name} is gpu_only: its must_fail belongs under gpu_must_fail"


@pytest.mark.slow
@pytest.mark.demo_class
def test_grading_run_finished(graded):
    run, verdicts, table, out = graded
    # None: the reports of an earlier class run, whose exit status .ci/run checked itself
    assert run["returncode"] in (0, 1, None), (f"the grading run exited with {run['returncode']}\n"
                                         f"{run['stdout_tail']}\n{run['stderr_tail']}")
    missing = [n for n, v in verdicts.items() if v["score"] is None]
    assert not missing, f"no results for {missing}\n{run['stdout_tail']}"


@pytest.mark.slow
@pytest.mark.demo_class
@pytest.mark.parametrize("name", NAMES)
def test_example(graded, name):
    run, verdicts, table, out = graded
    verdict = verdicts[name]
    seed_file = Path(run["reports"]) / ".seed"  # the run's secret seed: a verdict must not depend on it
    seed = seed_file.read_text().strip() if seed_file.exists() else "unknown"
    context = (f"\n\n{table}\n\n(reports: {run['reports']}; grader log: {out / 'grader.log'}; seed {seed}: "
               f"python -m pytest --impl submissions/examples/{name} --seed {seed} grades this example again)")
    assert not verdict["problems"], f"{name}:\n  " + "\n  ".join(verdict["problems"]) + context
    if verdict.get("known_gap"):
        pytest.xfail(f"known gap: {verdict['known_gap']} ({'; '.join(verdict['gap'])})")
