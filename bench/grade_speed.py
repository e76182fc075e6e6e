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
A call returns only a few files from $OUT: tar the runs' speed.json, verdicts.json.gz, timeline.json and pytest.log.

`single` grades the bundled reference submission alone (the full default rubric, `-n WORKERS`:
on a GPU its checks spread over the workers in tracks, grading/tracks.py);
`--cold` first empties the grader's persistent Triton cache, so compiling and autotuning are
counted. `class` grades the bundled class (the reference and submissions/examples) with
`-n WORKERS`. Each writes the grader's reports and a `speed.json`: the wall time of the whole
run, and the time of every check from the check records (`recorded_at`, written as each check
finishes) by check kind and by submission. A run stopped at `--limit` seconds still counts
what finished, marked as stopped; and how busy the CPUs and GPUs were (bench/utilization.py:
a run whose CPUs are busy throughout is CPU-bound, and more GPUs will not speed it up). `table`
prints one row per run, the runner starts, the worker that finished
last (with bench/timeline.py's record of which test ran where and when) and the slowest check
kinds. `startup` times the process starts every track pays, alone on the machine.

`corpus` grades the public course repos built into corpus/ (../shared/corpus: fetch each, then its
build.sh), the class that is the yardstick for speed, with `--repos` for a part of it and `--also`
for bundled examples beside it. Every run ends with its CPU account (bench/cpu_account.py): each
submission's core-seconds split by phase (the runner's start and imports, compiling, an autotuner
timing its configs, the student's calls, the grader's op watch, waiting for the GPU, the runner's
own work, what a call cut off by a timeout used, the distributed ranks, the runners' other
children, the grader worker's oracles and judging), its wall span and its longest check, then what
no submission owns, the sum held against the busy core-seconds /proc/stat counted, and the Triton
kernels each submission's runners took from one another between calls. `table RUN_A RUN_B` also sets the
accounts side by side, for the submissions both runs finished: a speed change's CPU, measured.
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

from bench import compare_verdicts  # noqa: E402
from bench.cpu_account import account, print_account, print_comparison  # noqa: E402
from bench.utilization import Utilization  # noqa: E402
from fa2_sandbox.wire.outcomes import CRASH, GRADER_ERROR, IMPORT_ERROR  # noqa: E402
from grading.results.record import CheckRecord  # noqa: E402
from grading.time_limit import is_cut  # noqa: E402


def triton_cache_dir() -> Path:
    """Where the grader keeps compiled kernels between runs (fa2_sandbox/harness/kernel_cache.py)."""
    from fa2_sandbox.harness.kernel_cache import cache_root
    return cache_root() / "triton"


def fresh_caches(out: Path) -> dict:
    """Empty caches of this run's own, for every compiler the grader and its runners use: two runs
    compare from the same cold start, whatever ran on the machine before."""
    caches = out / "caches"
    shutil.rmtree(caches, ignore_errors=True)
    # Not TORCHINDUCTOR_CACHE_DIR: runners keep that variable (scratch.py ENV_KEEP) but cannot reach
    # a folder of the grader's (notes/grading-speed.md, "Fresh caches without the inductor's"); a
    # runner's inductor folder is in its scratch folder, and what is kept of it between runners
    # is under GRADER_CACHE_DIR (kernel_cache.kept_inductor_cache), fresh here.
    names = {"GRADER_CACHE_DIR": "grader", "TRITON_CACHE_DIR": "triton", "XDG_CACHE_HOME": "xdg"}
    return {variable: str(caches / name) for variable, name in names.items()}


def grade(grader: Path, impls: list, workers: str, out: Path, limit: float, seed: int | None = None,
          env: dict | None = None, select: str = "", time_limit: float | None = None) -> dict:
    reports = out / "reports"
    shutil.rmtree(reports, ignore_errors=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.timeline",
               f"--reports={reports}", "-n", workers, *[f"--impl={i}" for i in impls]]
    if seed is not None:  # the same inputs as another run, so their verdicts compare check by check
        command.append(f"--seed={seed}")
    if select:
        command += ["-k", select]
    if time_limit is not None:  # each submission's (grading/time_limit.py)
        command.append(f"--time-limit={time_limit:g}")
    print("+", " ".join(command), flush=True)
    # GRADER_CPU_LOG: each runner's CPU by activity, for the account (bench/cpu_account.py)
    env = {**os.environ, **(env or {}), "FA2_TIMELINE": str(out / "timeline.json"), "PYTHONPATH": str(ROOT),
           "GRADER_CPU_LOG": str(out / "cpu.jsonl")}
    (out / "timeline.json").unlink(missing_ok=True)
    (out / "cpu.jsonl").unlink(missing_ok=True)
    start = time.monotonic()
    stopped = False
    with (out / "pytest.log").open("w") as log, Utilization() as use:
        try:
            status = subprocess.run(command, cwd=grader, stdout=log, stderr=subprocess.STDOUT, timeout=limit,
                                    env=env).returncode
        except subprocess.TimeoutExpired:
            status, stopped = None, True
    wall = time.monotonic() - start
    log = [line.strip() for line in (out / "pytest.log").read_text(errors="replace").splitlines()]
    phases = [line for line in log if line.startswith("wall clock")]  # the grader's own split (grading/durations.py)
    windows = [line for line in log if line.startswith("timing windows:")]
    return {"command": " ".join(command[1:]), "wall_s": round(wall, 1), "status": status, "stopped": stopped,
            "started": time.time() - wall, "phases": phases[-1] if phases else None,
            "windows_line": windows[-1] if windows else None,
            **breakdown(reports, time.time() - wall, workers == "0"),
            "runner_starts": runner_starts(reports), "workers": workers_summary(out / "timeline.json"),
            "utilization": (summary := use.summary()),
            "cpu_account": account(use.processes, out / "cpu.jsonl", out / "timeline.json", summary["busy_core_s"])}


def idle_sdpa_ms(rubric_file: Path) -> dict:
    """SDPA's forward+backward at each timing budget's case, on the GPU before the run: the idle
    time every timing row's SDPA peer is held against. {} without a GPU."""
    import torch
    import yaml
    from triton.testing import do_bench

    from fa2_sandbox.wire.cases import FlashCase, make_inputs
    if not torch.cuda.is_available():
        return {}
    times = {}
    for slot, b in yaml.safe_load(rubric_file.read_text())["budgets"].items():
        case = FlashCase(batch=(b["batch"],), n_queries=b["n"], n_keys=b["n"], head_dim=b["d"], dtype=b["dtype"],
                         is_causal=b["causal"])
        q, k, v, do = (t.unsqueeze(0) for t in make_inputs(case, 0, "cuda"))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        # A second of warm-up: the clocks of a GPU that has idled rise only under load, and with
        # do_bench's default warm-up the small case read slower here than in the run
        # (notes/grading-speed.md, "The idle SDPA for the small case").
        times[slot] = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=case.is_causal).backward(do), warmup=1000, rep=1000, return_mode="median")
    return times


def runner_starts(reports: Path) -> dict:
    """How many runners started and how long each took to be ready, from the runners' logs
    ("runner ready in X s", fa2_sandbox/harness/client.py)."""
    seconds = []
    for path in reports.glob("*/info.json"):  # written as checks come in: a run stopped early has them too
        logs = json.loads(path.read_text()).get("runner_logs") or {}  # each track's runner's
        seconds += [float(m) for log in logs.values() for m in re.findall(r"runner ready in ([0-9.]+) s", log)]
    seconds.sort()
    return {"count": len(seconds), "total_s": round(sum(seconds), 1),
            "median_s": seconds[len(seconds) // 2] if seconds else None, "max_s": max(seconds, default=None)}


def workers_summary(path: Path) -> dict:
    """Each worker's first start, last stop and busy seconds (from bench/timeline.py), relative to
    the first test's start; and, for the worker that finished last, its groups in order."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]  # bench/timeline.py
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
    # What a crowded GPU shows as: a student's out-of-memory crash, or the grader's own error.
    out_of_memory = [f"{r.get('submission')}::{r.get('part')}::{r.get('check')}[{r.get('case')}]: "
                     f"{(r.get('output') or '')[:160]}" for r in records
                     if r.get("outcome") == CRASH and "out of" in (r.get("output") or "") and "memory" in
                     (r.get("output") or "")]
    grader_errors = [f"{r.get('submission')}::{r.get('part')}::{r.get('check')}[{r.get('case')}]: "
                     f"{(r.get('output') or '')[:160]}" for r in records if r.get("outcome") == GRADER_ERROR]
    timing = {f"{r.get('submission')}::{r.get('check')}": r["timing"] for r in records if r.get("timing")}
    cut = defaultdict(int)  # submission -> advice checks its --time-limit cut (grading/time_limit.py)
    for r in records:
        if is_cut(CheckRecord.from_json(r)):
            cut[r.get("submission", "?")] += 1
    import_errors = {}  # submission -> why its adapters did not import: the first such record's
    for r in records:
        if r.get("outcome") == IMPORT_ERROR:
            import_errors.setdefault(r.get("submission", "?"), (r.get("output") or "")[:300])
    times = sorted(r["recorded_at"] - started for r in records if r.get("recorded_at"))
    # A submission is finished once its results.json is written (all its checks done); one still
    # short of checks at a stop is listed apart, with when its last check was recorded.
    done = {path.parent.name for path in reports.glob("*/results.json")}
    finished, unfinished = defaultdict(float), defaultdict(float)  # submission -> its last record, from the start
    for r in records:
        if r.get("recorded_at"):
            name = r.get("submission", "?")
            table = finished if name in done else unfinished
            table[name] = max(table[name], r["recorded_at"] - started)
    # Each timing window: how long it waited once both sides were warm (for its turn, then for the
    # kernels in flight), how many runners it paused and how long it measured (test_timing.py).
    windows = {f"{r.get('submission')}::{r.get('check')}": r["timing"]["window"] for r in records
               if isinstance(r.get("timing"), dict) and isinstance(r["timing"].get("window"), dict)}
    return {"checks": len(records), "outcomes": dict(outcomes), "clock": "wall" if sequential else "runner",
            "first_record_s": round(times[0], 1) if times else None,
            "ninety_percent_s": round(times[int(0.9 * (len(times) - 1))], 1) if times else None,
            "last_record_s": round(times[-1], 1) if times else None,
            "finished_s": {k: round(v, 1) for k, v in sorted(finished.items(), key=lambda kv: kv[1])},
            "unfinished_last_record_s": {k: round(v, 1) for k, v in sorted(unfinished.items(), key=lambda kv: kv[1])},
            "windows": windows,
            "out_of_memory": out_of_memory, "grader_errors": grader_errors, "import_errors": import_errors,
            "timing": timing, "cut": dict(sorted(cut.items(), key=lambda kv: -kv[1])),
            "by_kind": {k: [round(v, 1), count[k]] for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "by_submission": {k: round(v, 1) for k, v in sorted(by_submission.items(), key=lambda kv: -kv[1])}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("single", "class", "corpus"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--grader", type=Path, default=ROOT)
        p.add_argument("--limit", type=float, default=540.0, help="stop the run after this many seconds")
        p.add_argument("--label", default="")
        p.add_argument("--workers", default="auto", help="pytest-xdist's -n")
        p.add_argument("--seed", type=int, help="the grader's --seed (default: a fresh secret one)")
        p.add_argument("-k", dest="select", default="", help="pytest's -k: a part of the rubric (default: all of it)")
        p.add_argument("--time-limit", type=float, help="the grader's --time-limit: each submission's, in seconds")
        p.add_argument("--fresh-caches", action="store_true",
                       help="compile into new, empty caches of this run's own (Triton, inductor, the kept kernels)")
        if name == "single":
            p.add_argument("--cold", action="store_true", help="empty the kept Triton cache first")
        if name == "corpus":
            p.add_argument("--repos", nargs="+", default=["*"],
                           help="folders of corpus/ to grade, as globs (default: all); a fixed part of the class")
            p.add_argument("--also", nargs="*", default=[],
                           help="submissions graded in the same class, e.g. a bundled example (paths)")
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
    rubric = next(p for p in (grader / "grading" / "rubric.yaml", grader / "tests" / "grading" / "rubric.yaml")
                  if p.exists())
    idle = idle_sdpa_ms(rubric)
    if args.what == "single":
        if args.cold:
            shutil.rmtree(triton_cache_dir(), ignore_errors=True)
        # The grader's own copy: only its bundled reference may link into its reference/.
        result = grade(grader, [str(grader / "submissions" / "reference")], args.workers, args.out, args.limit,
                       args.seed, env)
        result["scenario"] = f"single -n {args.workers}" + (" cold" if args.cold else " warm")
    elif args.what == "class":
        impls = [str(grader / "submissions" / "reference"), str(grader / "submissions" / "examples" / "*")]
        result = grade(grader, impls, args.workers, args.out, args.limit, args.seed, env)
        result["scenario"] = f"class -n {args.workers}"
    else:  # the corpus (bench/grade_corpus.py prepares it): real student repos, the throughput benchmark
        impls = [str(ROOT / "corpus" / repos) for repos in args.repos] + [str(Path(p).resolve()) for p in args.also]
        result = grade(grader, impls, args.workers, args.out, args.limit, args.seed, env, args.select,
                       args.time_limit)
        result["scenario"] = f"corpus ({' '.join(args.repos)}) -n {args.workers}" + (f" -k {args.select}"
                                                                                      if args.select else "") \
            + (f" --time-limit {args.time_limit:g}" if args.time_limit is not None else "")
    if args.fresh_caches:
        result["scenario"] = result["scenario"].removesuffix(" warm") + " fresh caches"
    result["idle_sdpa_ms"] = idle
    result["label"] = args.label or grader.name
    result["gpus"] = gpu_names()
    (args.out / "speed.json").write_text(json.dumps(result, indent=1))
    compare_verdicts.keep(args.out / "reports", args.out / "verdicts.json.gz")  # for later sessions' comparisons
    print_table([args.out])
    return 0


STARTUP_STEPS = {
    "python -c pass": "pass",
    "import torch": "import torch",
    "import torch, triton; a CUDA op": (
        "import torch, triton; torch.cuda.is_available() and torch.ones(1, device='cuda').sum().item()"),
    "the sandbox probe (fresh grader process)": (
        "import tempfile; from fa2_sandbox.harness import confinement; "
        "print(confinement.isolation(tempfile.gettempdir(), 0)['mode'])"),
    "a reference runner: start until ready": (
        "from pathlib import Path; from fa2_sandbox.harness.discover import load_submission; "
        "from fa2_sandbox.harness.client import SubmissionRunner; "
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
    print("\n| run | grader | GPUs | wall s | CPU busy | GPU busy s | GPU memory max | runner starts | checks | "
          "outcomes | out-of-memory crashes | grader errors | stopped |")
    print("|---" * 13 + "|")
    for r in results:
        gpus = f"{len(r['gpus'])}x {r['gpus'][0]}" if r.get("gpus") else "cpu"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()))
        use = r.get("utilization") or {}
        cpu = f"{use['cpu_busy']:.0%} of {use['cpus']}" if use.get("cpu_busy") is not None else "-"
        gpu_busy = " + ".join(f"{b:.0f}" for b in use.get("gpu_busy_s", [])) or "-"
        memory = " + ".join(f"{m:.1f} GiB" for m in use.get("gpu_memory_max_gib", [])) or "-"
        starts = (r.get("runner_starts") or {}).get("count", "-")
        print(f"| {r['scenario']} | {r['label']} | {gpus} | {r['wall_s']} | {cpu} | {gpu_busy} | {memory} | {starts} | "
              f"{r['checks']} | {outcomes} | {len(r.get('out_of_memory', []))} | {len(r.get('grader_errors', []))} | "
              f"{'yes, at the limit' if r['stopped'] else 'no'} |")
    for r in results:
        for line in r.get("out_of_memory", []) + r.get("grader_errors", []):
            print(f"  {r['scenario']}: {line}")
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
        print_phases(r)
    for r in results:
        if r.get("cpu_account"):
            print_account(f"{r['scenario']} ({r['label']})", r["cpu_account"])
    print_comparison([r for r in results if r.get("cpu_account")])
    print_timing(results)
    for r in results:
        print(f"\n{r['scenario']} ({r['label']}): slowest check kinds, seconds ({r['clock']} clock), count")
        for kind, (seconds, count) in list(r["by_kind"].items())[:12]:
            print(f"  {seconds:8.1f}  {count:4d}  {kind}")
        for name, why in r.get("import_errors", {}).items():
            print(f"  not imported: {name}: {why}")
        print(f"{r['scenario']}: slowest submissions, seconds ({r['clock']} clock)")
        for name, seconds in list(r["by_submission"].items())[:8]:
            print(f"  {seconds:8.1f}  {name}")


def print_phases(r: dict) -> None:
    """Where the wall clock went: the grader's phases, the share the last 10% of the checks took,
    when each submission finished, and how long the timing windows waited."""
    if r.get("phases"):
        print(f"\n{r['scenario']}: {r['phases']}")
    if r.get("last_record_s") is not None:
        tail = r["last_record_s"] - r["ninety_percent_s"]
        print(f"{r['scenario']}: first check recorded at {r['first_record_s']} s, 90% at {r['ninety_percent_s']} s, "
              f"the last at {r['last_record_s']} s: the last 10% of the checks took {tail:.0f} s, "
              f"{tail / r['wall_s']:.0%} of the wall clock ({r['wall_s']} s)")
    finished = list((r.get("finished_s") or {}).items())
    if len(finished) > 1:
        times = [t for _, t in finished]
        print(f"{r['scenario']}: submissions finished at (s): " + ", ".join(f"{n.split('__')[0]} {t:.0f}"
                                                                        for n, t in finished))
        last, before, median = times[-1], times[-2], times[len(times) // 2]
        print(f"  the last {last - before:.0f} s after the one before it, {last - median:.0f} s after the median")
    if r.get("unfinished_last_record_s"):
        print(f"{r['scenario']}: not finished (a check still to come), their last record at (s): "
              + ", ".join(f"{n.split('__')[0]} {t:.0f}" for n, t in r["unfinished_last_record_s"].items()))
    if r.get("windows_line"):
        print(f"{r['scenario']}: {r['windows_line']}")
    if r.get("cut"):
        print(f"{r['scenario']}: advice checks cut by the time limit: "
              + ", ".join(f"{name.split('__')[0]} {count}" for name, count in r["cut"].items()))
    use = r.get("utilization") or {}
    if "both_idle" in use and r.get("last_record_s") is not None:  # while checks remained
        gaps = [gap for gap in use["both_idle"] if gap[0] < r["last_record_s"]]
        longest = max((gap[1] for gap in gaps), default=0.0)
        print(f"{r['scenario']}: CPU and GPU both idle while checks remained: longest {longest:.0f} s"
              + (" (" + ", ".join(f"{s:.0f} s at {t:.0f} s" for t, s in gaps) + ")" if gaps else ""))
    if use.get("cpu_by_role"):
        total = sum(use["cpu_by_role"].values()) or 1.0
        print(f"{r['scenario']}: where the CPU went (core-seconds): " + ", ".join(
            f"{role} {s:.0f} ({s / total:.0%})" for role, s in list(use["cpu_by_role"].items())[:8]))
    if use.get("other_commands"):
        print(f"{r['scenario']}: the processes of no known role, by command line (core-seconds): " + "; ".join(
            f"{command} {s:.0f}" for command, s in use["other_commands"].items()))
    windows = r.get("windows") or {}
    if windows:
        waits = sorted(w.get("waited_s", 0) + w.get("in_flight_s", 0) for w in windows.values())
        p95 = waits[min(len(waits) - 1, int(round(0.95 * (len(waits) - 1))))]
        print(f"{r['scenario']}: {len(waits)} timing windows; from warm to measuring, seconds: median "
              f"{waits[len(waits) // 2]:.1f}, 95th percentile {p95:.1f}, max {waits[-1]:.1f}; all: "
              + " ".join(f"{w:.1f}" for w in waits))
        for name, w in sorted(windows.items()):
            raised = (f", {w['real_time_threads']:g} of {w.get('raised_threads', 0):g} timed threads in real time"
                      if "real_time_threads" in w else "")  # watchdog.ahead_of_the_others
            raised += f" (refused: {w['real_time_refused']})" if w.get("real_time_refused") else ""
            raised += f", {w['raised_sessions']:g} sessions raised" if "raised_sessions" in w else ""
            print(f"    {name}: waited {w.get('waited_s')} s, in flight {w.get('in_flight_s')} s, "
                  f"paused {w.get('paused')} runners for {w.get('held_s')} s, measured {w.get('measured_s')} s"
                  + raised)


def print_timing(results: list) -> None:
    """Each timing row's ratio to the reference in every run (how far runs agree), and its SDPA
    peer's time over SDPA's on the idle GPU before the run (how much the neighbours weighed)."""
    rows = sorted({name for r in results for name in r.get("timing", {})})
    if not rows:
        return
    print("\n| timing check | " + " | ".join(f"ratio ({r['label']})" for r in results) + " | ratio spread | " +
          " | ".join(f"SDPA / idle ({r['label']})" for r in results) + " |")
    print("|---" * (2 + 2 * len(results)) + "|")
    for name in rows:
        ratios = [r.get("timing", {}).get(name, {}).get("ratio") for r in results]
        known = [x for x in ratios if x]
        spread = f"{max(known) / min(known) - 1:.0%}" if len(known) > 1 else "-"
        slot = name.rsplit("::", 1)[-1]
        peers = []
        for r in results:
            sdpa, idle = r.get("timing", {}).get(name, {}).get("sdpa_ms"), (r.get("idle_sdpa_ms") or {}).get(slot)
            peers.append(f"{sdpa / idle:.2f}" if sdpa and idle else "-")
        cells = " | ".join(f"{x:.2f}" if x else "-" for x in ratios)
        print(f"| {name} | {cells} | {spread} | " + " | ".join(peers) + " |")


if __name__ == "__main__":
    sys.exit(main())
