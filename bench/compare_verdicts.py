"""Do two grading runs agree, check by check? For a speed change, which must not move a verdict.

    python bench/compare_verdicts.py REPORTS_A REPORTS_B

Reads every submission's results.json in both reports folders and prints each check whose status
or score differs, then one line of totals. Run both with the same --seed (bench/grade_speed.py
--seed): the inputs are drawn from it, and a buggy example's verdict on an edge case can depend
on them. Timing checks (advice, measured on a shared GPU) are listed apart: their verdicts may
move from run to run. Exits 1 if any other check differs.
"""
import json
import sys
from pathlib import Path


def verdicts(reports: Path) -> dict:
    """check name -> (status, score), over every submission in `reports`."""
    found = {}
    for path in sorted(reports.glob("*/results.json")):
        for test in json.loads(path.read_text())["tests"]:
            found[test["name"]] = (test.get("status"), test.get("score"))
    return found


def differences(a: dict, b: dict) -> dict:
    """name -> (a's value, b's value) for every name whose values differ (None where one lacks it)."""
    return {name: (a.get(name), b.get(name)) for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)}


def main() -> int:
    a, b = verdicts(Path(sys.argv[1])), verdicts(Path(sys.argv[2]))
    moved = differences(a, b)
    timing = {name for name in moved if "::timing::" in name}
    for name, (before, after) in moved.items():
        print(f"{'(timing) ' if name in timing else ''}{name}: {before} -> {after}")
    print(f"{len(a)} and {len(b)} checks; {len(moved) - len(timing)} differ, and {len(timing)} timing checks")
    return 1 if len(moved) > len(timing) else 0


if __name__ == "__main__":
    sys.exit(main())
