"""How far a timing budget's ratio moves between class runs, and which side's reading moves it.

    python bench/timing_stability.py RUN [RUN ...] [--slot triton]

RUN is a folder with bench/grade_speed.py's speed.json (notes/runs/* keeps those of past runs).
Issue 53 asks that each submission's ratio agree within 5% between two runs for at least 90% of
the submissions, none moving over 10%. For every pair of runs this prints how many of the
submissions timed in both meet that, from the stretches the runs recorded
(`student_stretches_ms`, `reference_stretches_ms`), under the grader's estimator (each side's
fastest stretch in its own window, timed_window.fastest) and beside it:
- the student's fastest stretch alone, which no reference reading moves: the most any choice of
  the reference's figure could give;
- the student's over the run's median of the reference's per-window readings: what a reference
  figure taken over the whole class would give (it is not known when a window is judged, so it
  is a bound, not an estimator the grader could use as it stands).
Then each window's reference reading over that run median, split by whether it was the first
window the worker's kept reference runner timed (workers' groups in speed.json give the order):
where the reference's reading goes wrong.

Runs from a grader that records the reference runner's own view of its stretches
(`reference_own_stretches`, fa2_sandbox/runner/stretch_clock.py) also get, for every reference
stretch more than 5% over its run's median, what the record says held it: the phase messages'
way to the grader, launches the CPU bounded, a launching thread that waited for a core, or the
GPU itself.

Runs from a grader that records what the student's autotuners chose in the warm-up (`student_chose`,
fa2_sandbox/runner/steady_autotune.py) also get, for every submission whose own fastest stretch moved
more than 5% between two runs, whether the choices were the same: a submission that chose another
config is timing another kernel.

Only windows that timed both sides in full count (no stopped pass, no failed side). The bundled
triton_backward_python_loop is left out: its window holds one reference round and its ratio is
in the thousands.
"""
import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grading.checks.timed_window import fastest  # noqa: E402  (the grader's own estimator)

WITHIN, NONE_OVER = 0.05, 0.10  # issue 53, requirement 6
SKIP = ("triton_backward_python_loop",)


def load(folder: Path, slot: str) -> dict:
    """{"label", "windows": {submission: timing row}, "first": {submission: bool}} of one run."""
    run = json.loads((folder / "speed.json").read_text())
    windows = {}
    for name, row in (run.get("timing") or {}).items():
        submission, check = name.split("::")
        if check != f"flash_{slot}" or submission in SKIP or row.get("stopped_after_s") is not None:
            continue
        if row.get("student_stretches_ms") and row.get("reference_stretches_ms"):
            windows[submission] = row
    return {"label": run.get("label") or folder.name, "windows": windows, "first": first_windows(run)}


def first_windows(run: dict) -> dict:
    """Submission -> whether its window of any slot was the first its worker's kept reference timed."""
    first = {}
    timing = run.get("timing") or {}
    for worker, facts in (run.get("workers") or {}).items():
        if worker == "main":  # the controller's view of every group, not a worker
            continue
        groups = sorted(facts.get("groups", {}).items(), key=lambda item: item[1][0])
        timed = 0
        for group, _ in groups:
            submission, track = group.split("/", 1)
            if not track.startswith("timing-"):
                continue
            slot = track.split("-", 1)[1]
            if (timing.get(f"{submission}::flash_{slot}") or {}).get("reference_stretches_ms"):
                first[(submission, slot)] = timed == 0
                timed += 1
    return first


def ratio_window(row: dict, run: dict) -> float:
    return fastest(row["student_stretches_ms"]) / fastest(row["reference_stretches_ms"])


def ratio_student_alone(row: dict, run: dict) -> float:
    return fastest(row["student_stretches_ms"])


def ratio_run_median(row: dict, run: dict) -> float:
    return fastest(row["student_stretches_ms"]) / reference_median(run)


def reference_median(run: dict) -> float:
    return statistics.median(fastest(row["reference_stretches_ms"]) for row in run["windows"].values())


ESTIMATORS = {"the grader's (fastest over fastest, same window)": ratio_window,
              "the student's fastest alone": ratio_student_alone,
              "over the run's median reference": ratio_run_median}


def pair_line(a: dict, b: dict, estimator) -> tuple:
    """(submissions in both, within WITHIN, largest move) of one estimator on one pair of runs."""
    both = sorted(set(a["windows"]) & set(b["windows"]))
    moves = [abs(estimator(b["windows"][s], b) / estimator(a["windows"][s], a) - 1) for s in both]
    return len(both), sum(m <= WITHIN for m in moves), max(moves, default=0.0)


def print_pairs(runs: list) -> None:
    print("| runs | timed in both | " + " | ".join(ESTIMATORS) + " |")
    print("|---" * (2 + len(ESTIMATORS)) + "|")
    totals = {name: [0, 0, 0] for name in ESTIMATORS}  # submissions, within, pairs meeting the goal
    for a, b in itertools.combinations(runs, 2):
        cells, count = [], 0
        for name, estimator in ESTIMATORS.items():
            count, within, worst = pair_line(a, b, estimator)
            if not count:
                break
            met = within >= 0.9 * count and worst <= NONE_OVER
            totals[name][0] += count
            totals[name][1] += within
            totals[name][2] += met
            cells.append(f"{within} within 5%, worst {worst:.1%}{' (met)' if met else ''}")
        if count:
            print(f"| {a['label']} / {b['label']} | {count} | " + " | ".join(cells) + " |")
    pairs = len(list(itertools.combinations(runs, 2)))
    print("\nover all pairs: " + "; ".join(
        f"{name}: {t[1]} of {t[0]} within 5% ({t[1] / max(t[0], 1):.1%}), the goal met in {t[2]} of {pairs} pairs"
        for name, t in totals.items()))


def print_reference(runs: list, slot: str) -> None:
    """Each window's reference reading over its run's median, first windows of a worker apart."""
    kinds = {True: [], False: []}
    for run in runs:
        median = reference_median(run)
        for submission, row in run["windows"].items():
            first = run["first"].get((submission, slot))
            if first is None:
                continue
            kinds[first].append((fastest(row["reference_stretches_ms"]) / median, run["label"], submission))
    for first, rows in kinds.items():
        if not rows:
            continue
        off = sorted((r for r in rows if abs(r[0] - 1) > WITHIN), reverse=True)
        print(f"\nthe reference's reading over its run's median, {'first' if first else 'later'} windows of a "
              f"worker's kept reference: {len(rows)} windows, median {statistics.median(r[0] for r in rows):.3f}, "
              f"{len(off)} more than 5% off" + (": " + ", ".join(f"{x:.2f} ({label} {s})" for x, label, s in off)
                                                if off else ""))


def cause(outside: float, own: dict) -> str:
    """What held a reference stretch the harness read as `outside` ms a pass, by its own record."""
    if own["own_ms"] < outside / (1 + WITHIN):
        return "the messages' way"
    if own["cpu_ms"] < 0.5 * own["enqueue_ms"]:
        return "a thread waiting for a core"
    if own["enqueue_ms"] > 0.8 * own["own_ms"]:
        return "launches bound by the CPU"
    return "the GPU" if own.get("gpu_ms") is not None else "not the launches"


def print_causes(runs: list) -> None:
    for run in runs:
        median = reference_median(run)
        slow = []
        for submission, row in run["windows"].items():
            own = row.get("reference_own_stretches") or []
            if len(own) != len(row["reference_stretches_ms"]):
                continue
            for i, (outside, mine) in enumerate(zip(row["reference_stretches_ms"], own)):
                if outside > (1 + WITHIN) * median:
                    slow.append(f"{submission} stretch {i + 1}: {outside:.2f} ms outside, own {mine['own_ms']:.2f}, "
                                f"launches {mine['enqueue_ms']:.2f} (CPU {mine['cpu_ms']:.2f}), GPU "
                                f"{mine['gpu_ms']} -> {cause(outside, mine)}")
        if slow:
            print(f"\n{run['label']}: reference stretches over 5% above the run's median {median:.3f} ms, "
                  f"by the reference's own record:\n    " + "\n    ".join(slow))


def choices_said(chose: list) -> str:
    """Two runs' `student_chose` of one submission, in words."""
    if None in chose:
        return "no record of its choices"
    if chose[0] == chose[1]:
        return "chose the same configs"
    other = {c["kernel"]: c["config"] for c in chose[1]}
    return "chose other configs: " + "; ".join(f"{c['kernel']} {c['config']} / {other.get(c['kernel'], '-')}"
                                               for c in chose[0] if c not in chose[1])


def print_choices(runs: list) -> None:
    """Each submission whose own fastest stretch moved over WITHIN between two runs, with its choices."""
    for a, b in itertools.combinations(runs, 2):
        lines = []
        for s in sorted(set(a["windows"]) & set(b["windows"])):
            rows = a["windows"][s], b["windows"][s]
            move = ratio_student_alone(rows[1], b) / ratio_student_alone(rows[0], a) - 1
            if abs(move) > WITHIN:
                lines.append(f"{s}: {move:+.1%}, {choices_said([row.get('student_chose') for row in rows])}")
        if lines:
            print(f"\n{a['label']} / {b['label']}: the student's fastest stretch moved over 5%:\n    "
                  + "\n    ".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--slot", default="triton", choices=["triton", "pytorch"])
    args = parser.parse_args(argv)
    runs = [run for run in (load(folder, args.slot) for folder in args.runs) if run["windows"]]
    if len(runs) < 2:
        print("needs two runs with timed windows of that slot", file=sys.stderr)
        return 2
    print_pairs(runs)
    print_reference(runs, args.slot)
    print_causes(runs)
    print_choices(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
