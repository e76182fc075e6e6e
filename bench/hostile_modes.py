"""Grade the hostile examples (submissions/hostile) under two sandbox modes and compare, check by
check: the status and score of every check, and each example's finding lines (EXPECTED.yaml's
`finding`) in its results. Issue 14: the findings as an ordinary user's grader ("userns") must
be those of root's ("namespace").

    python bench/hostile_modes.py --out DIR [--modes namespace userns]

GRADER_SANDBOX picks the mode (confinement.isolation): "" lets root use its best, "userns" makes
even a root grader confine runners with user namespaces alone.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.compare_verdicts import differences, verdicts  # noqa: E402
from tests.self.fa2_sandbox.test_hostile import EXAMPLES, HOSTILE, MEMORY_LIMIT_GB, REFERENCE, SELECT, rubric  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SWITCH = {"namespace": "", "userns": "userns"}


def grade(mode: str, out: Path) -> tuple:
    reports = out / mode
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", f"--reports={reports}",
               f"--rubric={rubric(out / f'{mode}-rubric')}", "--seed=20261123", "-k", SELECT,
               f"--impl={REFERENCE}", *[f"--impl={HOSTILE / name}" for name in EXAMPLES]]
    env = {**os.environ, "GRADER_SANDBOX": SWITCH[mode], "GRADER_MEMORY_LIMIT_GB": MEMORY_LIMIT_GB}
    started = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    return reports, time.monotonic() - started


def outcomes(reports: Path) -> dict:
    """compare_verdicts.verdicts, and a row per submission for the isolation its runners had."""
    found = verdicts(reports)
    for path in reports.glob("*/results.json"):
        found[f"{path.parent.name}: isolation"] = (json.loads(path.read_text())["extra_data"].get("isolation")
                                                   or {}).get("mode")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", nargs=2, default=["namespace", "userns"])
    args = parser.parse_args()
    runs = {}
    for mode in args.modes:
        reports, wall = grade(mode, args.out)
        runs[mode] = outcomes(reports)
        print(f"{mode}: {len(runs[mode])} rows, {wall:.0f} s", flush=True)
    a, b = (runs[m] for m in args.modes)
    differ = differences(a, b)
    print(f"{len(differ)} differences between {args.modes[0]} and {args.modes[1]}:")
    for name, (first, second) in differ.items():
        print("  ", name, first, second)
    return 0


if __name__ == "__main__":
    sys.exit(main())
