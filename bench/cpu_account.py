"""Where a class run's CPU went, per submission and by phase: the account of issue 53.

    with Utilization() as use:         # bench/utilization.py: its ProcessLedger, fed every second
        ...the run...
    report = account(use.processes, cpu_log, timeline, busy_core_s)

Three sources, each for what only it knows:
- /proc, every second (bench/utilization.py ProcessLedger): each process's CPU (utime + stime), its parent and what it
  is (bench/utilization.py ROLES). A child that lived and died between two samples (ptxas, gcc)
  shows as its parent's reaped time (cutime + cstime) less what was already seen of the children
  that went; that is charged to the parent as "short-lived children".
- the runners' own profiles (fa2_sandbox/runner/cpu_profile.py, GRADER_CPU_LOG): which
  submission a runner pid is, and how its CPU split between starting, compiling, the student's
  calls and the rest. A runner's /proc total is split in those proportions; what it used after
  its last reply (a call cut off by a timeout or a crash) is "after the last reply".
- bench/timeline.py: which submission each grader worker was grading when; a worker's CPU (the
  oracles, the judging, pytest's own work) and that of its children other than runners go to it.

What no submission owns (the controller, the sampler, the machine's other processes, the last
second of processes whose parent went with them) is "everything else", and the account's sum is
held against the busy core-seconds /proc/stat counted over the run.
"""
import json
from collections import defaultdict
from pathlib import Path

from bench.utilization import (
    COMPILE_WORKERS,
    COMPILERS,
    FORK_SERVER,
    RANKS,
    RUNNER,
    ProcessLedger,  # noqa: F401 (what account() reads; tests build one from here)
)
from fa2_sandbox.harness.kernel_cache import SHARED_KERNELS
from fa2_sandbox.runner import cpu_profile

COMPILE_ROLES = (COMPILE_WORKERS, COMPILERS)
# The account's columns, in the order printed.
UNPROFILED = "runner, unprofiled"  # a runner that never said hello (its import failed or hung)
OTHER_CHILDREN = "runners' other children"
COLUMNS = (cpu_profile.STARTING, cpu_profile.COMPILING, cpu_profile.AUTOTUNING, cpu_profile.STUDENT,
           cpu_profile.WATCHING, cpu_profile.WAITING, cpu_profile.OWN, "after the last reply", UNPROFILED, RANKS,
           OTHER_CHILDREN, "grader worker")


def runner_profiles(cpu_log: Path) -> tuple[dict, dict]:
    """From GRADER_CPU_LOG: runner pid -> (submission, its last totals), and grader worker pid ->
    its xdist name (gw3), which a worker's /proc environment does not hold (xdist sets it later)."""
    last, workers = {}, {}
    if cpu_log.exists():
        for line in cpu_log.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            last[row["pid"]] = (row["submission"], row["cpu"])
            if row.get("worker"):
                workers[row["worker_pid"]] = row["worker"]
    return last, workers


def worker_schedule(timeline: Path) -> dict:
    """worker -> [(start, stop, submission)] of its tests, in order (bench/timeline.py)."""
    spans = defaultdict(list)
    if timeline.exists():
        for line in timeline.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            group = row["test"].rsplit("@", 1)[-1] if "@" in row["test"] else None
            if group:
                spans[row["worker"]].append((row["start"], row["stop"], group.split("/")[0], row["test"]))
    return {w: sorted(s) for w, s in spans.items()}


def submission_at(spans: list, wall: float):
    """The submission a worker was grading at `wall`: the test running then, else the next one
    (its setup, a runner's start), else the last."""
    for start, stop, name, _ in spans:
        if wall <= stop:
            return name
    return spans[-1][2] if spans else None


def account(ledger: ProcessLedger, cpu_log: Path, timeline: Path, busy_core_s: float | None) -> dict:
    profiles, worker_names = runner_profiles(cpu_log)
    schedule = worker_schedule(timeline)
    rows = defaultdict(lambda: dict.fromkeys(COLUMNS, 0.0))
    elsewhere = defaultdict(float)  # role -> core-seconds of the run's processes no submission owns
    outside = defaultdict(float)  # role -> core-seconds of processes outside the run
    for p in ledger.procs.values():
        total = p["cpu"] + p["short_lived"]
        if not total:
            continue
        runners = p.get("ancestry", {}).get("runners", [])
        runner = next((pid for pid in runners if pid in profiles), None)  # the one whose profile is logged
        owner = profiles[runner][0] if runner is not None else None
        if owner is not None and p["role"] == RUNNER:  # the runner itself (or its launcher and init)
            split_runner(rows[owner], p["cpu"], profiles[runner][1])
            rows[owner][cpu_profile.COMPILING] += p["short_lived"]  # ptxas, gcc: reaped by the runner
        elif owner is not None:
            rows[owner][RANKS if p["role"] == RANKS else cpu_profile.COMPILING if p["role"] in COMPILE_ROLES
                        else OTHER_CHILDREN] += total
        elif p["role"] == FORK_SERVER:  # its imports, once per worker: the run's, not one submission's
            elsewhere[FORK_SERVER] += total
        elif (worker := worker_names.get(p.get("ancestry", {}).get("worker"))) in schedule:
            column = UNPROFILED if runners else "grader worker"
            for wall, delta in p["deltas"]:
                name = submission_at(schedule[worker], wall)
                if name is not None:
                    rows[name][column] += delta
                else:
                    elsewhere["grader workers between submissions"] += delta
        elif p.get("ancestry", {}).get("run"):
            elsewhere[p["role"]] += total
        else:  # the machine's other processes: the device's agent, kernel threads, this bench
            outside[p["role"]] += total
    caches = compile_caches(profiles)
    submissions = {name: {**{k: round(v, 1) for k, v in row.items()}, "total": round(sum(row.values()), 1),
                          **spans_of(schedule, name), "compile_cache": caches.get(name, {})}
                   for name, row in rows.items()}
    accounted = sum(s["total"] for s in submissions.values()) + sum(elsewhere.values()) + sum(outside.values())
    return {"submissions": dict(sorted(submissions.items(), key=lambda kv: -kv[1]["total"])),
            "everything_else": {k: round(v, 1) for k, v in sorted(elsewhere.items(), key=lambda kv: -kv[1])},
            "accounted_core_s": round(accounted, 1), "busy_core_s": round(busy_core_s, 1) if busy_core_s else None,
            "outside_the_run": {k: round(v, 1) for k, v in sorted(outside.items(), key=lambda kv: -kv[1])},
            "columns": list(COLUMNS)}


def compile_caches(profiles: dict) -> dict:
    """submission -> torch.compile's cache hits and misses summed over its runners (each runner's
    last totals, cpu_profile.CACHE_COUNTERS), and the Triton kernels they took from each other
    (SHARED_KERNELS); a submission whose runners had none of these has no entry."""
    caches = defaultdict(lambda: defaultdict(int))
    for submission, totals in profiles.values():
        for key in (*(key for _, key in cpu_profile.CACHE_COUNTERS), SHARED_KERNELS):
            if key in totals:
                caches[submission][key] += int(totals[key])
    return {name: dict(counts) for name, counts in caches.items() if any(counts.values())}


def split_runner(row: dict, measured: float, totals: dict) -> None:
    """A runner's /proc CPU, split as its profile split the CPU it had reported by its last reply."""
    reported = totals.get("process", 0.0)
    profiled = sum(totals.get(a, 0.0) for a in cpu_profile.ACTIVITIES) or 1.0
    scale = min(measured, reported) / profiled
    for activity in cpu_profile.ACTIVITIES:
        row[activity] += totals.get(activity, 0.0) * scale
    row["after the last reply"] += max(0.0, measured - reported)


def spans_of(schedule: dict, name: str) -> dict:
    """A submission's wall span (its first test's start to its last's stop) and its longest test."""
    tests = [(start, stop, test) for spans in schedule.values() for start, stop, sub, test in spans if sub == name]
    if not tests:
        return {"span_s": None, "longest_s": None, "longest": None}
    longest = max(tests, key=lambda t: t[1] - t[0])
    return {"span_s": round(max(t[1] for t in tests) - min(t[0] for t in tests), 1),
            "longest_s": round(longest[1] - longest[0], 1), "longest": longest[2].split("::")[-1].split("@")[0]}


def print_account(name: str, report: dict) -> None:
    columns = report["columns"]
    subs = report["submissions"]
    print(f"\n{name}: CPU core-seconds per submission, by phase")
    print("| submission | " + " | ".join(columns) + " | total | wall span s | longest check (s) |")
    print("|---" * (len(columns) + 4) + "|")
    sums = dict.fromkeys(columns, 0.0)
    for sub, row in subs.items():
        for c in columns:
            sums[c] += row[c]
        print(f"| {sub.split('__')[0]} | " + " | ".join(f"{row[c]:.0f}" for c in columns)
              + f" | {row['total']:.0f} | {row['span_s']} | {row['longest']} ({row['longest_s']}) |")
    total = sum(sums.values())
    print("| all | " + " | ".join(f"{sums[c]:.0f} ({sums[c] / (total or 1):.0%})" for c in columns)
          + f" | {total:.0f} | | |")
    rest = sum(report["everything_else"].values())
    busy = report["busy_core_s"]
    print(f"{name}: the run's processes that no submission owns {rest:.0f} core-s (" + ", ".join(
        f"{k} {v:.0f}" for k, v in list(report["everything_else"].items())[:6]) + "); outside the run "
        + ", ".join(f"{k} {v:.0f}" for k, v in list(report.get("outside_the_run", {}).items())[:4]))
    if busy:
        outside = sum(report.get("outside_the_run", {}).values())
        print(f"{name}: the processes seen add up to {report['accounted_core_s']:.0f} core-s, {outside:.0f} of them "
              f"outside the run; /proc/stat counted {busy:.0f} busy core-seconds: all processes "
              f"{report['accounted_core_s'] / busy:.1%} of it, the run's alone "
              f"{(report['accounted_core_s'] - outside) / busy:.1%}")
    print(f"{name}: per submission on average {total / max(1, len(subs)):.0f} core-s")
    cached = {sub.split("__")[0]: row["compile_cache"] for sub, row in subs.items() if row.get("compile_cache")}
    shared = {sub: c[SHARED_KERNELS] for sub, c in cached.items() if c.get(SHARED_KERNELS)}
    if shared:
        print(f"{name}: Triton kernels a runner took from the submission's other runners between two calls "
              "(compiled there while it ran): " + ", ".join(f"{sub} {n}" for sub, n in shared.items()))
    cached = {sub: c for sub, c in cached.items() if any(c.get(key) for _, key in cpu_profile.CACHE_COUNTERS)}
    if cached:
        print(f"{name}: torch.compile's caches, hits/misses over each submission's runners (FX graph; AOTAutograd): "
              + ", ".join(f"{sub} {c.get('fxgraph_cache_hit', 0)}/{c.get('fxgraph_cache_miss', 0)}; "
                          f"{c.get('autograd_cache_hit', 0)}/{c.get('autograd_cache_miss', 0)}"
                          for sub, c in cached.items()))


def compare_accounts(runs: list) -> list:
    """[(submission, [core-seconds in each run], change of the last against the first)] for the
    submissions every run finished (a submission cut off by a run's limit would count part of its
    work), ordered by the first run's total; change is None where the first is 0."""
    finished = set.intersection(*(set(r.get("finished_s") or {}) for r in runs)) if runs else set()
    rows = []
    for name in finished:
        totals = [r["cpu_account"]["submissions"].get(name, {}).get("total", 0.0) for r in runs]
        rows.append((name, totals, totals[-1] / totals[0] - 1 if totals[0] else None))
    return sorted(rows, key=lambda row: -row[1][0])


def print_comparison(runs: list) -> None:
    """The account of every submission finished in all `runs` (speed.json's), side by side."""
    rows = compare_accounts(runs)
    if len(runs) < 2 or not rows:
        return
    labels = [f"{r['label']}" for r in runs]
    print("\nCPU core-seconds of the submissions every run finished: " + " vs ".join(labels))
    print("| submission | " + " | ".join(labels) + " | change, last vs first |")
    print("|---" * (len(runs) + 2) + "|")
    for name, totals, change in rows:
        print(f"| {name.split('__')[0]} | " + " | ".join(f"{t:.0f}" for t in totals)
              + (f" | {change:+.0%} |" if change is not None else " | - |"))
    sums = [sum(row[1][i] for row in rows) for i in range(len(runs))]
    changes = sorted(change for _, _, change in rows if change is not None)
    median = changes[len(changes) // 2] if changes else None
    change = f"{sums[-1] / sums[0] - 1:+.0%} (median {median:+.0%})" if sums[0] and median is not None else "-"
    print(f"| all {len(rows)} | " + " | ".join(f"{t:.0f}" for t in sums) + f" | {change} |")
