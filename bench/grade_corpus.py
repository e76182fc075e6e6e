"""Grade the development corpus (public CS336 assignment-2 repos) as one class, next to the
course's official attention tests, and print one table: repo | official | course tier | parts.

Prepare here (the corpus is never committed: corpus/ and .whl/ are git-ignored):

    fetch github:<owner>/<name> for each line of ../shared/corpus/repos.txt, then
    MIRROR=/work/.mirror bash ../shared/corpus/build.sh corpus
    python bench/grade_corpus.py prepare          # the official tests, the wheels, the old grader
    python bench/grade_corpus.py prepare --old-commit 1a8bbb9   # the old grader as issue 53 measures against

Run on a GPU (the device), from the repository root:

    python bench/grade_corpus.py run --out $OUT [--old] [-k EXPR] [--workers N]

`run` installs the carried wheels (the grader's `course` extra: einops, einx, jaxtyping) with
pip from disk, runs tests/test_attention.py of stanford-cs336/assignment2-systems in a copy of
every repo (as `uv run pytest` would: the repo and its path dependencies importable, with
package metadata), grades the class with the grader (`pytest -n N --impl 'corpus/*'`), with
--old also with the grader as it was at the commit `prepare` archived, and prints the table.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "corpus"
OFFICIAL = CORPUS / ".official"  # the course's tests (hidden from --impl globs)
# The course's distributed tests changed between years: 2025 (v1.0.5) tested get_ddp_individual_parameters
# and get_ddp_bucketed; 2026 tests get_ddp and FSDP. Each repo is tested with its own year's tests.
COURSE_YEARS = {"2025": "e495ed7", "2026": "9d95f3b"}
DISTRIBUTED_TESTS = ("test_ddp.py", "test_ddp_individual_parameters.py", "test_sharded_optimizer.py", "test_fsdp.py")
OLD_GRADER = CORPUS / ".old-grader"
PROFILE = Path("fa2_sandbox/runner/cpu_profile.py")
PROFILE_HOOKS = ROOT / "bench" / "device" / "profile-hooks.patch"
WHEELS = ROOT / ".whl"
COURSE_REPO = "/work/.mirror/stanford-cs336+assignment2-systems/repo"
sys.path.insert(0, str(ROOT))
from fa2_sandbox.wire import course_env  # noqa: E402  (the grader's own reading of uv path dependencies)
from fa2_sandbox.wire.outcomes import FAILED, PASSED, SKIPPED  # noqa: E402
from grading.results.gradescope import STATUS_FAILED, STATUS_PASSED, status_of  # noqa: E402

PARTS = ("flash_pytorch", "flash_triton", "memory", "ddp", "sharded_optimizer", "fsdp")
# Each official attention test (tests/test_attention.py) and the course-tier check that grades the same
# thing, as "part::check::full" or "::causal": the course tier is the official tests' cases, so each pair must agree.
OFFICIAL_CHECKS = {
    "test_flash_forward_pass_pytorch": "flash_pytorch::forward::full",
    "test_flash_backward_pytorch": "flash_pytorch::backward::full",
    "test_flash_forward_pass_triton[False]": "flash_triton::forward::full",
    "test_flash_forward_pass_triton[True]": "flash_triton::forward::causal",
    "test_flash_backward_triton[False]": "flash_triton::backward::full",
    "test_flash_backward_triton[True]": "flash_triton::backward::causal",
}


def add_profile_hooks(grader: Path) -> None:
    """An archived grader older than the CPU account's runner profile (fa2_sandbox/runner/cpu_profile.py,
    b3824fb) gets today's profile and the two hooks that report it (bench/device/profile-hooks.patch:
    the runner's totals in each reply, the client's line of GRADER_CPU_LOG), so bench/grade_speed.py
    splits its class's CPU by phase as it does today's: requirement 2 of issue 53 compares the two."""
    shutil.copy(ROOT / PROFILE, grader / PROFILE)
    subprocess.run(["patch", "-s", "-p1", "-d", str(grader), "-i", str(PROFILE_HOOKS)], check=True)


def prepare(old_commit: str) -> None:
    OFFICIAL.mkdir(parents=True, exist_ok=True)
    test = subprocess.run(["git", "--git-dir", COURSE_REPO, "show", "HEAD:tests/test_attention.py"],
                          check=True, capture_output=True, text=True).stdout
    (OFFICIAL / "test_attention.py").write_text(test)
    for year, commit in COURSE_YEARS.items():  # the distributed tests with the files they import
        files = subprocess.run(["git", "--git-dir", COURSE_REPO, "ls-tree", "-r", "--name-only", commit, "tests"],
                               check=True, capture_output=True, text=True).stdout.split()
        for name in files:
            if Path(name).name in DISTRIBUTED_TESTS + ("common.py", "conftest.py") or "/fixtures/" in name:
                target = OFFICIAL / year / Path(name).relative_to("tests")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(subprocess.run(["git", "--git-dir", COURSE_REPO, "show", f"{commit}:{name}"],
                                                  check=True, capture_output=True).stdout)
    shutil.rmtree(OLD_GRADER, ignore_errors=True)
    OLD_GRADER.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", old_commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(OLD_GRADER)], input=archive, check=True)
    hooked = not (OLD_GRADER / PROFILE).exists()
    if hooked:
        add_profile_hooks(OLD_GRADER)
    hooks = " with the CPU account's profile hooks" if hooked else ""
    print(f"official tests in {OFFICIAL}, grader {old_commit}{hooks} in {OLD_GRADER}")
    print("wheels: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl "
          "einops einx frozendict wadler-lindig (see /work/.library/device/README.md)")


def install_wheels() -> None:
    wheels = sorted(str(w) for w in WHEELS.glob("*.whl"))
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels], check=False)


# -- the official tests ------------------------------------------------------------------------

def official_environment(repo: Path, scratch: Path) -> dict:
    """PYTHONPATH as `uv run` leaves it: the repo, its path dependencies and their metadata."""
    env_info = course_env.read(repo)
    site = course_env.write_metadata(repo, env_info, str(scratch / "metadata"))
    path = [str(repo), *env_info.paths, site]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]),
            "PYTHONDONTWRITEBYTECODE": "1"}


def course_year(repo: Path) -> str:
    """The course year a repo follows: 2025 repos were handed test_ddp_individual_parameters.py."""
    return "2025" if (repo / "tests" / "test_ddp_individual_parameters.py").exists() else "2026"


def official_tests(repo: Path, timeout: int, suite: str = "attention") -> dict:
    """Run the course's tests in a copy of `repo`: {test name: outcome}. suite "attention" is this
    year's test_attention.py (as test_official_attention.py); "distributed" is the DDP, sharded
    optimizer and FSDP tests of the repo's course year, with their common.py, conftest.py and
    fixtures in place of the repo's copies (they run on the CPU, over gloo)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"official-{repo.name}-"))
    copy = scratch / repo.name
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    (copy / "tests").mkdir(exist_ok=True)
    (copy / "tests" / "__init__.py").touch()
    if suite == "attention":
        shutil.copyfile(OFFICIAL / "test_attention.py", copy / "tests" / "test_official_attention.py")
        tests = ["tests/test_official_attention.py"]
    else:
        year = OFFICIAL / course_year(repo)
        shutil.copytree(year, copy / "tests", dirs_exist_ok=True)
        tests = [f"tests/{t.name}" for t in sorted(year.glob("test_*.py"))]
    xml = scratch / "junit.xml"
    # The distributed tests rendezvous on a fixed port (common.py: 12390), so two repos tested at once
    # collide (EADDRINUSE): each runs in a network namespace of its own, with only a loopback.
    isolate = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if suite != "attention" else []
    command = [*isolate, sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", "-p", "no:fa2_grader", f"--junitxml={xml}", "--rootdir", str(copy)]
    try:
        proc = subprocess.run(command, cwd=copy, env=official_environment(copy, scratch), capture_output=True,
                              text=True, timeout=timeout)
        log = proc.stdout[-3000:] + proc.stderr[-2000:]
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if not xml.exists():
        return {"error": log.strip().splitlines()[-1] if log.strip() else "no result"}
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name")
        if suite != "attention":  # several files: test_official_ddp::test_DistributedDataParallel[...]
            name = f"{case.get('classname').split('.')[-1]}::{name}"
        outcome = PASSED  # an official test, in the grader's words for a check (JUnit XML has its own tags)
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = FAILED
            elif child.tag == "skipped":
                outcome = SKIPPED
        outcomes[name] = outcome
    if not outcomes:  # collection failed: the import of the adapters, say
        outcomes["error"] = log.strip().splitlines()[-1] if log.strip() else "collection failed"
    shutil.rmtree(scratch, ignore_errors=True)
    return outcomes


# -- grading and the table -----------------------------------------------------------------------

def grade(grader: Path, reports: Path, workers: int, select: str, log: Path, timeout: float, seed=None,
          repos=("*",)) -> float:
    """Grade the corpus (the repos matching the globs `repos`) with the grader in `grader`; past
    `timeout` the run is stopped and every repo's results.json is assembled from the checks that
    finished (each is written on its own)."""
    start = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-n", str(workers), *(f"--impl={CORPUS}/{r}" for r in repos),
               f"--reports={reports}",
               "-p", "no:cacheprovider", "-q", "-k", select] + ([f"--seed={seed}"] if seed is not None else [])
    with log.open("w") as out:
        try:
            subprocess.run(command, cwd=grader, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            out.write(f"\nstopped after {timeout:.0f} s; results assembled from the checks that finished\n")
            sys.path.insert(0, str(grader))
            from grading.results.scoring import assemble
            from grading.rubric import Rubric
            for folder in sorted(p for p in reports.iterdir() if (p / "checks").is_dir()):
                assemble(reports, folder.name, Rubric())
    return time.monotonic() - start


def summarize(reports: Path) -> dict:
    """Per repo: import problem, course tier passed / graded per slot, score / max per part."""
    rows = {}
    for results in sorted(reports.glob("*/results.json")):
        data = json.loads(results.read_text())
        tests = data.get("tests", [])
        parts = data.get("extra_data", {}).get("parts", {})
        course, checks = {}, {}
        for slot in ("flash_pytorch", "flash_triton"):
            mine = [t for t in tests if t.get("part") == slot and t.get("tier") == "course"]
            course[slot] = (sum(status_of(t) == STATUS_PASSED for t in mine), len(mine))
            for t in mine:  # "<submission>::flash_triton::forward[fp32-128x128-d64-causal]"
                check, _, case = t["name"].split("::")[-1].partition("[")
                mask = "causal" if case.rstrip("]").endswith("-causal") else "full"
                checks[f"{slot}::{check}::{mask}"] = status_of(t) == STATUS_PASSED
        rows[results.parent.name] = {
            "ungradable": data.get("extra_data", {}).get("ungradable"),
            "course": course, "course_checks": checks, "score": data.get("score"), "max_score": data.get("max_score"),
            "parts": {p: (round(v.get("score", 0), 1), round(v.get("max_score", 0), 1)) for p, v in parts.items()},
            "tf32": sum(t.get("precision") == "tf32" for t in tests),
            "failed": {t["name"].split("::", 1)[1]: (t.get("diagnosis") or t["output"])[:300]
                       for t in tests if status_of(t) == STATUS_FAILED},
            "notes": data.get("extra_data", {}).get("notes", []),
        }
    return rows


def official_agreement(official: dict, graded: dict) -> str:
    """Each official attention test against the course-tier check of the same case (OFFICIAL_CHECKS):
    how many agree, and each that does not."""
    agree, differ = 0, []
    for name, outcomes in sorted(official.items()):
        checks = graded.get(name, {}).get("course_checks", {})
        for test, outcome in outcomes.items():
            if test in OFFICIAL_CHECKS and outcome != SKIPPED and OFFICIAL_CHECKS[test] in checks:
                ours = checks[OFFICIAL_CHECKS[test]]
                agree += ours == (outcome == PASSED)
                if ours != (outcome == PASSED):
                    verdict = "passed" if ours else "not passed"
                    differ.append(f"  {name} {test}: official {outcome}, the grader's {verdict}")
    return "\n".join([f"official tests against the grader's course-tier checks, test by test: {agree} of "
                      f"{agree + len(differ)} agree", *differ])


def table(official: dict, graded: dict, old: dict | None) -> str:
    lines = ["| repo | official attention tests | course tier (PyTorch; Triton) | " +
             ("old grader course tier | old score | " if old else "") + "score | " + " | ".join(PARTS) + " |",
             "|---" * (4 + len(PARTS) + (2 if old else 0)) + "|"]
    for name in sorted(set(official) | set(graded)):
        outcomes = official.get(name, {})
        passed = sum(o == PASSED for n, o in outcomes.items() if n != "error")
        ran = sum(o != SKIPPED for n, o in outcomes.items() if n != "error")
        cell = f"{passed}/{ran}" if ran else outcomes.get("error", "-")[:60]
        row = graded.get(name, {})
        course = "; ".join(f"{p}/{n}" for p, n in row.get("course", {}).values()) or "-"
        if row.get("ungradable"):
            course = "ungradable: " + row["ungradable"][:80]
        parts = " | ".join("{:g}/{:g}".format(*row["parts"][p]) if p in row.get("parts", {}) else "-" for p in PARTS)
        before = ""
        if old:
            o = old.get(name, {})
            before = ("; ".join(f"{p}/{n}" for p, n in o.get("course", {}).values()) or "-") + \
                     (" (ungradable)" if o.get("ungradable") else "") + f" | {o.get('score', '-')} | "
        score = f"{row.get('score', '-')}/{row.get('max_score', '-')}"
        lines.append(f"| {name} | {cell} | {course} | {before}{score} | {parts} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["prepare", "run", "official", "table"],
                        help="official: only the official tests (run: they, then the grader)")
    parser.add_argument("--out", type=Path, default=Path("corpus-results"))
    parser.add_argument("--old", action="store_true", help="also grade with the archived old grader")
    parser.add_argument("--old-commit", default="HEAD", help="for prepare: the grader commit to archive")
    parser.add_argument("-k", dest="select", default="not test_budget",
                        help="pytest -k for the grading runs (default: all but the timing budgets)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--official-timeout", type=int, default=600)
    parser.add_argument("--suite", choices=["attention", "distributed"], default="attention",
                        help="for official: which of the course's tests (distributed: on the CPU, over gloo)")
    parser.add_argument("--threads", type=int, default=8, help="for official: repos tested at once")
    parser.add_argument("--official-from", type=Path, help="reuse an earlier run's official.json")
    parser.add_argument("--grade-timeout", type=float, default=3600, help="seconds for one grading run")
    parser.add_argument("--seed", type=int, help="the grading runs' --seed (default: a fresh secret one)")
    parser.add_argument("--repos", nargs="+", default=["*"],
                        help="the corpus folders to grade and test, as globs (default: all); a class too "
                             "slow for one device call can be split")
    args = parser.parse_args()
    if args.action == "prepare":
        return prepare(args.old_commit)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.action in ("run", "official"):
        install_wheels()
        repos = sorted({p for r in args.repos for p in CORPUS.glob(r) if p.is_dir() and not p.name.startswith(".")})
        if args.official_from:
            official = json.loads(args.official_from.read_text())
        else:
            print(f"official {args.suite} tests on {len(repos)} repos ...", flush=True)
            official, started = {}, time.monotonic()
            with ThreadPoolExecutor(max_workers=args.threads) as pool:
                running = {pool.submit(official_tests, r, args.official_timeout, args.suite): r.name for r in repos}
                for done in as_completed(running):  # written as each ends, so a cut run keeps them
                    official[running[done]] = done.result()
                    (args.out / "official.json").write_text(json.dumps(official, indent=1))
                    print(f"  {running[done]}: {time.monotonic() - started:.0f} s", flush=True)
        (args.out / "official.json").write_text(json.dumps(official, indent=1))
        if args.action == "official":
            return print(json.dumps(official, indent=1))
        print(f"grading {len(repos)} repos with -n {args.workers} ...", flush=True)
        seconds = grade(ROOT, args.out / "reports", args.workers, args.select, args.out / "grader.log",
                        args.grade_timeout, args.seed, args.repos)
        print(f"graded in {seconds:.0f} s", flush=True)
        if args.old:
            seconds = grade(OLD_GRADER, args.out / "reports-old", args.workers, args.select,
                            args.out / "grader-old.log", args.grade_timeout, args.seed, args.repos)
            print(f"old grader: {seconds:.0f} s", flush=True)
    official = json.loads((args.out / "official.json").read_text())
    graded = summarize(args.out / "reports")
    old = summarize(args.out / "reports-old") if (args.out / "reports-old").exists() else None
    (args.out / "summary.json").write_text(json.dumps({"official": official, "graded": graded, "old": old}, indent=1))
    print(table(official, graded, old))
    print(official_agreement(official, graded))


if __name__ == "__main__":
    main()
