"""Grade the distributed parts' requirement checks (DDP, the sharded optimizer, FSDP) of the
reference and of the bundled examples over many seeds, with the grader's own checks, and print per
check how many seeds gave the verdict its EXPECTED.yaml promises: every requirement check of the
reference passes, and each example's must_fail checks fail and its must_pass checks pass.

    python bench/distributed_sweep.py --seeds 100                     # the reference and every example
    python bench/distributed_sweep.py --seeds 100 -k fsdp             # only submissions whose name holds fsdp
    python bench/distributed_sweep.py --seeds 20 --start 1000 --impl submissions/examples/ddp_grads_summed

A verdict that holds under one seed may not hold under another: the inputs, the model's weights
and so how far apart two trainings end all come from the seed. The grader draws a seed per class
(or takes --seed), so a known-bad example must fail under every seed, and the reference pass.

Each submission gets one runner whose ranks are kept from one seed to the next (RankPool), so a
seed costs its spawns' training and this process's baselines (notes/distributed-seed-sweep.md,
"The command", says what that came to on a CPU).
Only requirement checks are swept (advice, "beyond the handout", is left out), and only the
distributed parts, where one seed costs seconds. Exits 1 if any check gave the wrong verdict
under any seed. notes/distributed-seed-sweep.md has the results.
"""
import argparse
import fnmatch
import itertools
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa2_sandbox.wire import outcomes  # noqa: E402
from grading import protocol  # noqa: E402
from grading.check import Check  # noqa: E402
from grading.checks import test_distributed, test_fsdp  # noqa: E402
from grading.declaration import declared_for  # noqa: E402
from grading.session import TrackSession, WorkerState  # noqa: E402
from grading.tracks import DISTRIBUTED  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODULES = (test_distributed, test_fsdp)
PARTS = ("ddp", "sharded_optimizer", "fsdp")


def matches(pattern: str, name: str) -> bool:
    """EXPECTED.yaml's patterns: fnmatch with * and ? only, the [ ] of a check's name literal."""
    return fnmatch.fnmatchcase(name, pattern.replace("[", "[[]"))


def tests_of(module):
    """(test name, function, params) of every test of `module`, its parametrize marks expanded."""
    for name in dir(module):
        fn = getattr(module, name)
        if not (name.startswith("test_") and callable(fn)):
            continue
        axes = []
        for mark in getattr(fn, "pytestmark", []):
            if mark.name == "parametrize":
                names = [n.strip() for n in mark.args[0].split(",")]
                axes.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in mark.args[1]])
        for combo in itertools.product(*axes):
            yield name, fn, {k: v for params in combo for k, v in params.items()}


def expectations(submission) -> tuple:
    """(must_fail, must_pass) patterns of the distributed parts; the reference: nothing fails."""
    path = submission.root / "EXPECTED.yaml"
    if not path.is_file():
        return [], [f"{part}::*" for part in PARTS]
    data = yaml.safe_load(path.read_text()) or {}
    keep = lambda patterns: [p for p in patterns or [] if p.split("::", 1)[0] in PARTS]  # noqa: E731
    return keep(data.get("must_fail")), keep(data.get("must_pass"))


def run_check(state, submission, fn, params):
    """The check a test makes, run as the plugin runs it: (outcome, its sentence, the check's name)."""
    made, declared = [], declared_for(fn, params, state.rubric)

    def check(case=""):
        made.append(Check(submission, declared, case, state.rubric))
        return made[-1]

    try:
        fn(session=TrackSession(state, DISTRIBUTED), submission=submission, check=check, **params)
    except pytest.fail.Exception:
        pass
    except pytest.skip.Exception:
        pass
    record = made[-1].record
    if record.outcome == outcomes.ERROR and not record.diagnosis:  # returned without failing: passed
        record.outcome = outcomes.PASSED
    return record.outcome, record.diagnosis or record.output, record.name.split("::", 1)[1]


def sweep(state, submission, seeds, out):
    must_fail, must_pass = expectations(submission)
    wanted = []  # (fn, params) of the requirement checks EXPECTED.yaml may speak of
    for module in MODULES:
        for test, fn, params in tests_of(module):
            declared = declared_for(fn, params, state.rubric)
            if not state.rubric.advice(declared.group) and any(
                    matches(p.split("[", 1)[0], f"{declared.part}::{declared.check}") for p in must_fail + must_pass):
                wanted.append((fn, params))
    if not wanted:
        return 0
    tally = {}  # check name -> [expected verdict, seeds as expected, {seed: sentence} otherwise]
    started = time.monotonic()
    for seed in seeds:
        state.seed = seed
        state._replies.clear()  # a new seed: new spawns; the runner and its ranks stay
        for fn, params in wanted:
            outcome, sentence, name = run_check(state, submission, fn, params)
            verdict = outcomes.FAILED if any(matches(p, name) for p in must_fail) else \
                outcomes.PASSED if any(matches(p, name) for p in must_pass) else None
            if outcome == outcomes.SKIPPED or verdict is None:
                continue  # a DDP flavour it does not define, or a case EXPECTED.yaml names none of
            row = tally.setdefault(name, [verdict, 0, {}])
            if (outcome == outcomes.PASSED) == (verdict == outcomes.PASSED):
                row[1] += 1
            else:
                row[2][seed] = f"{outcome}: {sentence[:200]}"
    wrong = 0
    for name, (verdict, good, bad) in sorted(tally.items()):
        wrong += len(bad)
        print(f"{submission.name:32s} {name:40s} must be {verdict:6s} {good:4d}/{len(seeds)} seeds",
              file=out, flush=True)
        for seed, sentence in list(bad.items())[:5]:
            print(f"    seed {seed}: {sentence}", file=out, flush=True)
    print(f"{submission.name:32s} {len(seeds)} seeds in {time.monotonic() - started:.0f} s", file=out, flush=True)
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (default 100)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--impl", action="append", default=None,
                        help="a submission or a glob (default: the reference and submissions/examples/*)")
    parser.add_argument("-k", default="", help="only submissions whose name contains this")
    args = parser.parse_args()
    impl = args.impl or [str(ROOT / "submissions" / "reference"), str(ROOT / "submissions" / "examples" / "*")]
    config = SimpleNamespace(getoption={"--rubric": None, "--impl": impl}.get, stash={})
    protocol.hand_over(config, {protocol.SEED: args.start})
    state = WorkerState(config, protocol.settings(config))
    seeds = range(args.start, args.start + args.seeds)
    print(f"seeds {args.start}..{args.start + args.seeds - 1}", flush=True)
    wrong = 0
    try:
        for submission in state.submissions:
            if args.k in submission.name:
                wrong += sweep(state, submission, seeds, sys.stdout)
    finally:
        state.close()
    print(f"{wrong} (check, seed) pairs gave the wrong verdict")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
