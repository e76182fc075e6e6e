"""Do two grading runs agree, check by check? For a speed change, which must not move a verdict.

    python bench/compare_verdicts.py REPORTS_A REPORTS_B
    python bench/compare_verdicts.py --checks REPORTS_A REPORTS_B

Reads every submission's results.json in both reports folders and prints each check whose status
or score differs, then one line of totals. Run both with the same --seed (bench/grade_speed.py
--seed): the inputs are drawn from it, and a buggy example's verdict on an edge case can depend
on them. Timing checks (advice, measured on a shared GPU) are listed apart: their verdicts may
move from run to run. Exits 1 if any other check differs.

`--checks` reads the check files instead (DIR/<submission>/checks/*.json, written as each check
ends), or a run's verdicts kept in a file (`--keep REPORTS FILE.json.gz` writes one; bench/grade_speed.py
keeps each run's as verdicts.json.gz beside its speed.json, so that a later session compares against a
run whose reports are gone), so that runs stopped at a limit compare too, on the checks both recorded, of the
submissions B graded. It counts requirement and advice checks apart, and an advice check that one
run's --time-limit cut (grading/time_limit.py) apart from one that answered differently; it lists
every requirement check that differs and every advice check that differs for another reason, and
exits 1 if a requirement check differs.
"""
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grading.results.gradescope import status_of  # noqa: E402

CUT = "cut: this submission's time limit"


def verdicts(reports: Path) -> dict:
    """check name -> (Gradescope's status, score), over every submission in `reports`. Reads
    results.json as this grader writes it (each entry a check record plus its score); one of a
    grader older than that stops the comparison: regrade, or compare the check files (--checks)."""
    found = {}
    for path in sorted(reports.glob("*/results.json")):
        for test in json.loads(path.read_text())["tests"]:
            if "outcome" not in test:  # read as this grader's, its every check would read "failed"
                raise SystemExit(f"{path} was written by an older grader (its checks have no outcome): "
                                 f"compare the check files instead, with --checks")
            found[test["name"]] = (status_of(test), test.get("score"))
    return found


def differences(a: dict, b: dict) -> dict:
    """name -> (a's value, b's value) for every name whose values differ (None where one lacks it)."""
    return {name: (a.get(name), b.get(name)) for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)}


def check_records(reports: Path) -> dict:
    """check name -> its record (grading/results/record.py), from the check files; or, from a file of
    kept verdicts, the part of each record compare_checks reads."""
    if reports.is_file():
        return json.loads(gzip.decompress(reports.read_bytes()))
    found = {}
    for path in reports.glob("*/checks/*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[record["name"]] = record
    return found


def keep(reports: Path, path: Path) -> int:
    """Write the verdicts of the check files under `reports` to `path` (gzipped JSON): each check's
    submission, outcome and kind, and whether a time limit cut it: a class run's fit in a few tens of kB."""
    kept = {name: {"submission": r["submission"], "outcome": r["outcome"], "advice": bool(r.get("advice")),
                   "output": CUT if (r.get("output") or "").startswith(CUT) else ""}
            for name, r in check_records(reports).items()}
    path.write_bytes(gzip.compress(json.dumps(kept, sort_keys=True).encode(), mtime=0))
    return len(kept)


def compare_checks(a: dict, b: dict) -> tuple[Counter, list]:
    """(counts, lines): the checks of B's submissions that both runs recorded, compared by outcome."""
    graded = {r["submission"] for r in b.values()}
    both = sorted(name for name in set(a) & set(b) if a[name]["submission"] in graded)
    counts, lines = Counter(), []
    for name in both:
        x, y = a[name], b[name]
        kind = "advice" if x.get("advice") else "requirement"
        counts[kind] += 1
        if x["outcome"] == y["outcome"]:
            continue
        why = "cut by a time limit" if any((r.get("output") or "").startswith(CUT) for r in (x, y)) else "answered"
        counts[f"{kind} differ ({why})"] += 1
        if kind == "requirement" or why == "answered":
            lines.append(f"{kind}: {name}: {x['outcome']} -> {y['outcome']}\n    A: {(x.get('output') or '')[:160]!r}"
                         f"\n    B: {(y.get('output') or '')[:160]!r}")
    return counts, lines


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] == "--keep":
        print(f"{keep(Path(args[1]), Path(args[2]))} checks' verdicts kept in {args[2]}")
        return 0
    if args and args[0] == "--checks":
        a, b = check_records(Path(args[1])), check_records(Path(args[2]))
        counts, lines = compare_checks(a, b)
        print("\n".join(lines))
        print(f"{len(a)} and {len(b)} check files; " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return 1 if any(k.startswith("requirement differ") for k in counts) else 0
    a, b = verdicts(Path(args[0])), verdicts(Path(args[1]))
    moved = differences(a, b)
    timing = {name for name in moved if "::timing::" in name}
    for name, (before, after) in moved.items():
        print(f"{'(timing) ' if name in timing else ''}{name}: {before} -> {after}")
    print(f"{len(a)} and {len(b)} checks; {len(moved) - len(timing)} differ, and {len(timing)} timing checks")
    return 1 if len(moved) > len(timing) else 0


if __name__ == "__main__":
    sys.exit(main())
