"""Replay a class run through the scheduler: how long it would have taken in another order.

    python bench/replay_schedule.py RUN [RUN ...] [--order KIND,KIND,...]

RUN is a folder of bench/grade_speed.py's (its timeline.json, bench/timeline.py's record of
every check's worker, start and stop). Each check keeps its recorded duration; the groups are
collected in the order tracks.HEAVY_FIRST (or --order) gives, and handed to 16 fake workers by
the real GradingScheduling, as tests/self/grading/test_scheduler.py drives it (xdist's worker
side: a worker holds its next test back, the first two of its queue are never stolen). A thief
pays a runner start (--start, 8 s by default: about a class run's median) on its first check of a group.
The scheduler runs on the replay's clock, and hears of each check's timeout or answer as the controller
told it (the run's check files, where kept): a Triton check that runs long promotes its submission and
splits its tracks as in the run (a recorded run's tail comes back: notes/grading-speed.md, "the
reference's slow stretches: a thread waiting for a core"). A check's time stays with its id, though:
where a split moves a kernel's first call to another check, the compile it paid stays where it was
recorded.

What a replay cannot know: a run stopped before its end left checks unrecorded; each group gets
the checks the largest group of its kind has, at the mean of its own recorded ones (a guess, so
compare orders on one run, never a replay with a run). A check still running at the stop is
one of them, and where it was waiting out a timeout the mean is far too short: `--timed-out NAME`
gives each Triton group of submission NAME a first unrecorded check of --timeout seconds (the
flash calls' 300 s) and the rest at once (a runner fails every larger case at once after a
timeout). CPU contention is as recorded, whatever the order, and the timing windows' pauses are
left out. On a CPU-bound class that is the replay's largest error: it ended two runs sooner
with the Triton tracks first, and run, that order recorded fewer checks than the old one
(every submission compiling and autotuning at once made each check slower; notes/grading-speed.md,
"The Triton shards first"). Use it to find an order worth a run, never in place of one.
"""
import argparse
import contextlib
import io
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "self" / "grading")]

from test_scheduler import Worker, fake_config  # noqa: E402  (the fake xdist worker)

from bench.compare_verdicts import check_records  # noqa: E402
from fa2_sandbox.wire import outcomes as reply_outcomes  # noqa: E402
from grading import scheduler as scheduling  # noqa: E402
from grading import tracks  # noqa: E402
from grading.check import CheckIdentity  # noqa: E402
from grading.matrix import flash_cases  # noqa: E402

# "<slot>-<case id>" -> the GPU matrix's case, as a check's parameters name it: a replayed check gets
# its case's size and kernel, which the scheduler's promotions and splits read.
GPU_CASES = {f"{slot}-{case.id}": case for slot in ("triton", "pytorch") for _, case in flash_cases(slot, True)}


def recorded_groups(run: Path) -> tuple[dict, dict]:
    """({group: [nodeid, ...] in the order run}, {nodeid: seconds}), the unrecorded filled in."""
    calls = [row for row in map(json.loads, (run / "timeline.json").read_text().splitlines())
             if row["when"] == "call" and row["worker"] != "main"]
    seconds = {row["test"]: row["stop"] - row["start"] for row in calls}
    groups = defaultdict(list)
    for row in sorted(calls, key=lambda row: row["start"]):
        groups[row["test"].rsplit("@", 1)[1]].append(row["test"])
    full = defaultdict(int)
    for group, ids in groups.items():
        full[track_name(group)] = max(full[track_name(group)], len(ids))
    for group, ids in groups.items():
        mean = statistics.mean(seconds[i] for i in ids)
        for k in range(full[track_name(group)] - len(ids)):
            nodeid = f"{ids[0].split('[')[0]}[unrecorded{k}]@{group}"
            ids.append(nodeid)
            seconds[nodeid] = mean
    return dict(groups), seconds


# The timeline records xdist's node ids, "<test id>@<submission>/<track>": a replay reads back from
# them what the grader's workers sent the controller as identities.

def track_name(group: str) -> str:
    return group.partition(tracks.SEPARATOR)[2]


def submission_of(group: str) -> str:
    return group.partition(tracks.SEPARATOR)[0]


def recorded_identity(nodeid: str) -> CheckIdentity:
    """A recorded check's identity: its group's submission and track, and the call it shared, its
    parameters without the submission ("test_forward[alice-pytorch-fp32-17x17-d64-full]@alice"
    -> "pytorch-fp32-17x17-d64-full"). Its case's size is not in the id: left out."""
    test, _, group = nodeid.rpartition("@")
    params = test[test.index("[") + 1:test.rindex("]")] if "[" in test else ""
    case = f"-{params}-".replace(f"-{submission_of(group)}-", "-", 1).strip("-")
    flash_case = GPU_CASES.get(case)
    return CheckIdentity(check_id=test, submission=submission_of(group), track=tracks.Track(track_name(group)),
                         case=case, case_size=flash_case.work if flash_case else None,
                         kernel=flash_case.kernel if flash_case else "")


def recorded_outcomes(run: Path) -> dict:
    """{test id: outcome} from the run's check files (reports/*/checks/*.json), where it kept them:
    a replayed timeout or answer tells the scheduler what the controller told it."""
    found = {}
    for record in check_records(run / "reports").values():
        module, _, test = record.get("check_id", "").partition("::")
        found[f"{module.replace('.', '/')}.py::{test}"] = record.get("outcome")
    return found


def timed_out(groups: dict, seconds: dict, submission: str, timeout_s: float) -> None:
    """Each Triton group of `submission`: its first unrecorded check waits out `timeout_s`, the rest
    take no time (SubmissionRunner fails every case at least as large at once)."""
    for group, ids in groups.items():
        if submission_of(group) == submission and track_name(group).startswith("triton"):
            for k, nodeid in enumerate(i for i in ids if "[unrecorded" in i):
                seconds[nodeid] = timeout_s if k == 0 else 0.0


def replay(groups: dict, seconds: dict, order: tuple, workers: int = 16, start_s: float = 8.0,
           outcomes: dict | None = None) -> tuple:
    """(the run's end, steals, the scheduler's promotion and split lines) with the groups collected in
    `order`. The scheduler's clock is the replay's: a check that runs long promotes its submission and
    splits its tracks as in the run; `outcomes` ({test id: outcome}, recorded_outcomes) says which
    checks timed out or answered."""
    keys = sorted(groups, key=lambda g: next((i for i, kind in enumerate(order)
                                              if track_name(g).startswith(kind)), len(order)))
    collection = [nodeid for group in keys for nodeid in groups[group]]
    clock = [0.0]
    sched = scheduling.GradingScheduling(fake_config(workers),
                                         identities={nodeid: recorded_identity(nodeid) for nodeid in collection},
                                         clock=lambda: clock[0], flash_timeout_s=300.0)
    outcomes = outcomes or {}
    nodes = [Worker(n, []) for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    ran, now = set(), 0.0

    def took(node, nodeid):
        group = nodeid.rsplit("@", 1)[1]
        thief = (node.gateway.id, group) not in ran and any(g == group for _, g in ran)
        ran.add((node.gateway.id, group))
        return seconds[nodeid] + (start_s if thief else 0.0)

    while True:
        for node in nodes:
            while node.asked:
                sched.remove_pending_tests_from_node(node, node.answer(node.asked.pop(0)))
        for node in nodes:
            if node.until is None and node.queue and (len(node.queue) >= 2 or node.shutting_down):
                node.took = took(node, collection[node.queue[0]])
                node.until = now + node.took
                sched.started(collection[node.queue[0]])
        busy = [node for node in nodes if node.until is not None]
        if not busy:
            return now, len(sched.steals), sched.promotions
        node = min(busy, key=lambda n: n.until)
        index, duration = node.queue.pop(0), node.took
        now, node.until = node.until, None
        clock[0] = now
        outcome = outcomes.get(collection[index].rsplit("@", 1)[0])
        if outcome == reply_outcomes.TIMEOUT:
            sched.timed_out(collection[index])
        elif outcome in (reply_outcomes.PASSED, reply_outcomes.FAILED):
            sched.answered(collection[index], duration)
        sched.mark_test_complete(node, index, duration)
        if sched.tests_finished:
            for other in sched.nodes:
                other.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--order", action="append", default=[],
                        help="track kinds, comma-separated, first to last (repeatable; default: tracks.HEAVY_FIRST)")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--start", type=float, default=8.0, help="a thief's runner start, seconds")
    parser.add_argument("--timed-out", action="append", default=[], metavar="NAME",
                        help="a submission whose unrecorded Triton checks were waiting out a timeout (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, help="that timeout, seconds")
    args = parser.parse_args()
    orders = [tuple(o.split(",")) for o in args.order] or [tracks.HEAVY_FIRST]
    print("| run | recorded work s | lower bound s | order | replayed end s | steals |\n|---|---|---|---|---|---|")
    for run in args.runs:
        groups, seconds = recorded_groups(run)
        for name in args.timed_out:
            timed_out(groups, seconds, name, args.timeout)
        work, outcomes = sum(seconds.values()), recorded_outcomes(run)
        for order in orders:
            with contextlib.redirect_stderr(io.StringIO()):  # the scheduler's log lines
                end, steals, _ = replay(groups, seconds, order, args.workers, args.start, outcomes)
            print(f"| {run.name} | {work:.0f} | {work / args.workers:.0f} | {','.join(order)} | {end:.0f} | {steals} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
