"""How long grading takes, and where the time goes: the scenarios of issue 12, in one table.

Run on a GPU (the device), from the repository root, with a grader checkout in GRADER (this
repository by default, or an archived older one, to compare):

    python bench/grade_speed.py single --out $OUT/single [--grader DIR] [--workers auto] [--cold] [--limit S] [--seed N]
    python bench/grade_speed.py class  --out $OUT/class  [--grader DIR] [--workers auto] [--limit S] [--seed N]
    (either with [--fresh-caches]: compile into new, empty caches of the run's own)
    python bench/grade_speed.py startup --out $OUT/startup
    python bench/grade_speed.py table  $OUT/single $OUT/class ...

On the device the grader needs its own dependencies first: the GPU image lacks pydantic, so
carry its wheels (pydantic, pydantic_core, annotated_types, typing_inspection in .whl/) and run
`python3 -m pip install -q --no-index --no-deps .whl/*.whl && python3 -m pip install -q --no-deps
--no-build-isolation -e .` before this script (the editable install registers the pytest plugin).
A call returns only a few files from $OUT: tar the runs' speed.json, timeline.json and pytest.log.

`single` grades the bundled reference submission alone (the full default rubric, `-n WORKERS`:
on a GPU its checks spread over the workers in shards, grading/shards.py);
`--cold` first empties the grader's persistent Triton cache, so compiling and autotuning are
counted. `class` grades the bundled class (the reference and submissions/examples) with
`-n WORKERS`. Each writes the grader's reports and a `speed.json`: the wall time of the whole
run, and the time of every check from the check records (`recorded_at`, written as each check
finishes) by check kind and by submission. A run stopped at `--limit` seconds still counts
what finished, marked as stopped; and how busy the CPUs and GPUs were (bench/utilization.py:
a run whose CPUs are busy throughout is CPU-bound, and more GPUs will not speed it up). `table`
prints one row per run, the runner starts, the worker that finished
last (with bench/timeline.py's record of which test ran where and when) and the slowest check
kinds. `startup` times the process starts every shard pays, alone on the machine.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.utilization import Utilization  # noqa: E402


def triton_cache_dir() -> Path:
    """Where the grader keeps compiled kernels between runs (fa2_adapters/harness/kernel_cache.py)."""
    from fa2_adapters.harness.kernel_cache import cache_root
    return cache_root() / "triton"


def fresh_caches(out: Path) -> dict:
    """Empty caches of this run's own, for every compiler the grader and its runners use: two runs
    compare from the same cold start, whatever ran on the machine before."""
    caches = out / "caches"
    shutil.rmtree(caches, ignore_errors=True)
    names = {"GRADER_CACHE_DIR": "grader", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor",
             "XDG_CACHE_HOME": "xdg"}
    return {variable: str(caches / name) for variable, name in names.items()}


def grade(grader: Path, impls: list, workers: str, out: Path, limit: float, seed: int | None = None,
          env: dict | None = None) -> dict:
    reports = out / "reports"
    shutil.rmtree(reports, ignore_errors=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.timeline",
               f"--reports={reports}", "-n", workers, *[f"--impl={i}" for i in impls]]
    if seed is not None:  # the same inputs as another run, so their verdicts compare check by check
        command.append(f"--seed={seed}")
    print("+", " ".join(command), flush=True)
    env = {**os.environ, **(env or {}), "FA2_TIMELINE": str(out / "timeline.json"), "PYTHONPATH": str(ROOT)}
    (out / "timeline.json").unlink(missing_ok=True)
    start = time.monotonic()
    stopped = False
    with (out / "pytest.log").open("w") as log, Utilization() as use:
        try:
            status = subprocess.run(command, cwd=grader, stdout=log, stderr=subprocess.STDOUT, timeout=limit,
                                    env=env).returncode
        except subprocess.TimeoutExpired:
            status, stopped = None, True
    wall = time.monotonic() - start
    return {"command": " ".join(command[1:]), "wall_s": round(wall, 1), "status": status, "stopped": stopped,
            "started": time.time() - wall, **breakdown(reports, time.time() - wall, workers == "0"),
            "runner_starts": runner_starts(reports), "workers": workers_summary(out / "timeline.json"),
            "utilization": use.summary()}


def runner_starts(reports: Path) -> dict:
    """How many runners started and how long each took to be ready, from the runners' logs
    ("runner ready in X s", fa2_adapters/harness/client.py)."""
    seconds = []
    for path in reports.glob("*/results.json"):
        log = json.loads(path.read_text()).get("extra_data", {}).get("runner_log_tail") or ""  # every shard's
        seconds += [float(m) for m in re.findall(r"runner ready in ([0-9.]+) s", log)]
    seconds.sort()
    return {"count": len(seconds), "total_s": round(sum(seconds), 1),
            "median_s": seconds[len(seconds) // 2] if seconds else None, "max_s": max(seconds, default=None)}


def workers_summary(path: Path) -> dict:
    """Each worker's first start, last stop and busy seconds (from bench/timeline.py), relative to
    the first test's start; and, for the worker that finished last, its groups in order."""
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    if not rows:
        return {}
    t0 = min(r["start"] for r in rows)
    workers = defaultdict(lambda: {"first": float("inf"), "last": 0.0, "busy": 0.0, "groups": {}})
    for r in rows:
        w = workers[r["worker"]]
        w["first"] = min(w["first"], r["start"] - t0)
        w["last"] = max(w["last"], r["stop"] - t0)
        w["busy"] += r["stop"] - r["start"]
        group = r["test"].rsplit("@", 1)[-1] if "@" in r["test"] else "-"
        span = w["groups"].setdefault(group, [r["start"] - t0, 0.0, 0.0])  # first start, last stop, busy
        span[1] = max(span[1], r["stop"] - t0)
        span[2] += r["stop"] - r["start"]
    summary = {name: {"first": round(w["first"], 1), "last": round(w["last"], 1), "busy": round(w["busy"], 1),
                      "groups": {g: [round(x, 1) for x in span] for g, span in w["groups"].items()}}
               for name, w in sorted(workers.items())}
    return summary


def breakdown(reports: Path, started: float, sequential: bool) -> dict:
    """Seconds by check kind (part::check[tier]) and by submission, from the check records.

    Sequential runs (-n 0) charge each check the time since the one before it finished (the
    wall clock, runner starts and oracles included); parallel runs charge the runner's own
    call time (`seconds`), since their checks overlap."""
    records = []
    for path in reports.glob("*/checks/*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records.append(record)
    records.sort(key=lambda r: r.get("recorded_at", 0))
    by_kind, by_submission, count = defaultdict(float), defaultdict(float), defaultdict(int)
    last = started
    for r in records:
        at = r.get("recorded_at", last)
        seconds = (at - last) if sequential else float(r.get("seconds") or 0)
        last = at
        kind = f"{r.get('part')}::{r.get('check')}" + (f"[{r['tier']}]" if r.get("tier") else "")
        by_kind[kind] += seconds
        count[kind] += 1
        by_submission[r.get("submission", "?")] += seconds
    outcomes = defaultdict(int)
    for r in records:
        outcomes[r.get("outcome", "?")] += 1
    return {"checks": len(records), "outcomes": dict(outcomes), "clock": "wall" if sequential else "runner",
            "by_kind": {k: [round(v, 1), count[k]] for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "by_submission": {k: round(v, 1) for k, v in sorted(by_submission.items(), key=lambda kv: -kv[1])}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("single", "class"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--grader", type=Path, default=ROOT)
        p.add_argument("--limit", type=float, default=540.0, help="stop the run after this many seconds")
        p.add_argument("--label", default="")
        p.add_argument("--workers", default="auto", help="pytest-xdist's -n")
        p.add_argument("--seed", type=int, help="the grader's --seed (default: a fresh secret one)")
        p.add_argument("--fresh-caches", action="store_true",
                       help="compile into new, empty caches of this run's own (Triton, inductor, the kept kernels)")
        if name == "single":
            p.add_argument("--cold", action="store_true", help="empty the kept Triton cache first")
    sub.add_parser("startup").add_argument("--out", type=Path, required=True)
    table = sub.add_parser("table")
    table.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args()

    if args.what == "table":
        print_table(args.runs)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "startup":
        (args.out / "startup.json").write_text(json.dumps({"gpus": gpu_names(), "steps": startup(args.out)}))
        return 0
    grader = args.grader.resolve()
    env = fresh_caches(args.out) if args.fresh_caches else {}
    if args.what == "single":
        if args.cold:
            shutil.rmtree(triton_cache_dir(), ignore_errors=True)
        # The grader's own copy: only its bundled reference may link into its reference/.
        result = grade(grader, [str(grader / "submissions" / "reference")], args.workers, args.out, args.limit,
                       args.seed, env)
        result["scenario"] = f"single -n {args.workers}" + (" cold" if args.cold else " warm")
    else:
        impls = [str(grader / "submissions" / "reference"), str(grader / "submissions" / "examples" / "*")]
        result = grade(grader, impls, args.workers, args.out, args.limit, args.seed, env)
        result["scenario"] = f"class -n {args.workers}"
    if args.fresh_caches:
        result["scenario"] = result["scenario"].removesuffix(" warm") + " fresh caches"
    result["label"] = args.label or grader.name
    result["gpus"] = gpu_names()
    (args.out / "speed.json").write_text(json.dumps(result, indent=1))
    print_table([args.out])
    return 0


STARTUP_STEPS = {
    "python -c pass": "pass",
    "import torch": "import torch",
    "import torch, triton; a CUDA op": (
        "import torch, triton; torch.cuda.is_available() and torch.ones(1, device='cuda').sum().item()"),
    "the sandbox probe (fresh grader process)": (
        "import tempfile; from fa2_adapters.harness import sandbox; "
        "print(sandbox.isolation(tempfile.gettempdir(), 0)['mode'])"),
    "a reference runner: start until ready": (
        "from pathlib import Path; from fa2_adapters.harness.discover import load_submission; "
        "from fa2_adapters.harness.client import SubmissionRunner; "
        "r = SubmissionRunner(load_submission(Path('submissions/reference'))); r.start(); r.close()"),
}


def startup(out: Path, repeats: int = 3) -> dict:
    """What each process start costs, alone on the machine: the medians of `repeats` fresh
    interpreters per step (a runner start includes its probe: subtract the step above it)."""
    steps = {}
    for name, code in STARTUP_STEPS.items():
        times = []
        for _ in range(repeats):
            start = time.monotonic()
            subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
            times.append(time.monotonic() - start)
        steps[name] = round(sorted(times)[len(times) // 2], 2)
        print(f"  {steps[name]:6.2f} s  {name}", flush=True)
    return steps


def gpu_names() -> list:
    try:
        import torch
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def print_table(runs: list) -> None:
    results = [json.loads((Path(r) / "speed.json").read_text()) for r in runs]
    print("\n| run | grader | GPUs | wall s | CPU busy | GPU busy s | checks | outcomes | stopped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        gpus = f"{len(r['gpus'])}x {r['gpus'][0]}" if r.get("gpus") else "cpu"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        use = r.get("utilization") or {}
        cpu = f"{use['cpu_busy']:.0%} of {use['cpus']}" if use.get("cpu_busy") is not None else "-"
        gpu_busy = " + ".join(f"{b:.0f}" for b in use.get("gpu_busy_s", [])) or "-"
        print(f"| {r['scenario']} | {r['label']} | {gpus} | {r['wall_s']} | {cpu} | {gpu_busy} | {r['checks']} | "
              f"{outcomes} | {'yes, at the limit' if r['stopped'] else 'no'} |")
    for r in results:
        if r.get("runner_starts"):
            print(f"\n{r['scenario']}: runner starts {r['runner_starts']}")
        workers = r.get("workers") or {}
        if workers:
            last = max(workers, key=lambda w: workers[w]["last"])
            busy = sum(w["busy"] for w in workers.values())
            print(f"{r['scenario']}: {len(workers)} workers, busy {busy:.0f} s in all; the last to finish, {last}, "
                  f"at {workers[last]['last']} s, ran (group: first start, last stop, busy s):")
            for group, span in workers[last]["groups"].items():
                print(f"    {group}: {span}")
    for r in results:
        print(f"\n{r['scenario']} ({r['label']}): slowest check kinds, seconds ({r['clock']} clock), count")
        for kind, (seconds, count) in list(r["by_kind"].items())[:12]:
            print(f"  {seconds:8.1f}  {count:4d}  {kind}")


if __name__ == "__main__":
    sys.exit(main())
