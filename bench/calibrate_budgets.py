"""Calibrate the rubric's timing budgets on a GPU: 20 timing measurements, as the suite makes them.

    python bench/calibrate_budgets.py [--runs 20]

For each slot it measures, with the suite's own runner operations (each pass timed from the
outside on inputs of its own, grading/checks/timed_window.py), the ratio student / reference for
  - the reference against a second runner of itself: a budget must never fail it;
  - submissions/slow/tiles16 (correct, 16x16 tiles): a budget must fail it every time,
and prints the spread and, for candidate budgets, how many of the runs each would fail.
"""
import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fa2_sandbox.harness.client import SubmissionRunner  # noqa: E402
from fa2_sandbox.harness.discover import load_submission  # noqa: E402
from fa2_sandbox.wire import requests  # noqa: E402
from fa2_sandbox.wire.cases import FlashCase  # noqa: E402
from grading.checks import timed_window as tw  # noqa: E402
from grading.rubric import Rubric  # noqa: E402


def pass_ms(runner, slot, case, seed, passes) -> float:
    """A pass's milliseconds over `passes` timed passes of one runner, alone on the GPU: the fastest
    of its stretches, as the suite reads a side's time (timed_window.fastest)."""
    runner.call(requests.PrepareTiming(slot, case, seed, passes), 600)
    reply = runner.call(requests.TimePasses(case, passes, tw.stretches(passes, 3)), 600)
    if not reply.ok:
        raise SystemExit(f"{runner.submission.name} failed: {reply.status} {reply.message}")
    return tw.fastest(tw.pass_times_ms(reply.phases))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slots", nargs="+", default=["triton", "pytorch"])
    args = parser.parse_args()
    rubric = Rubric()
    rows = []
    for slot in args.slots:
        budget = rubric.budgets[f"flash_{slot}"]
        case = FlashCase(batch=(budget["batch"],), n_queries=budget["n"], n_keys=budget["n"],
                         head_dim=budget["d"], dtype=budget["dtype"], is_causal=budget["causal"])
        runners = {name: SubmissionRunner(load_submission(ROOT / "submissions" / path))
                   for name, path in (("reference", "reference"), ("reference-again", "reference"),
                                      ("tiles16", "slow/tiles16"))}
        ratios = {"reference": [], "tiles16": []}
        try:
            for runner in runners.values():
                runner.call(requests.WarmTiming(slot, case, 99), 600)
            for run in range(args.runs):
                times = {name: pass_ms(runner, slot, case, 100 + 100 * run, tw.MAX_PASSES)
                         for name, runner in runners.items()}
                ratios["reference"].append(times["reference-again"] / times["reference"])
                ratios["tiles16"].append(times["tiles16"] / times["reference"])
                print(f"{slot} run {run + 1:2d}: reference {times['reference']:.3f} ms, again "
                      f"{times['reference-again']:.3f} ms, tiles16 {times['tiles16']:.3f} ms", flush=True)
        finally:
            for runner in runners.values():
                runner.close()
        rows.append((slot, case.id, budget["ratio"], ratios))

    print(f"\n{'slot':8s} {'case':28s} {'who':10s} {'min':>6s} {'median':>7s} {'max':>6s}"
          "   runs over 1.5x / 2x / 3x / 5x")
    for slot, case_id, current, ratios in rows:
        for who, values in ratios.items():
            over = " / ".join(str(sum(v > b for v in values)) for b in (1.5, 2, 3, 5))
            print(f"{slot:8s} {case_id:28s} {who:10s} {min(values):6.2f} {statistics.median(values):7.2f} "
                  f"{max(values):6.2f}   {over}   (budget now {current}x)")


if __name__ == "__main__":
    main()
