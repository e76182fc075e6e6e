"""Scoring: the current check records of one submission, scored with the rubric, into results.json
(each check's record as its check file holds it, plus its score) and the grouped gradescope.json,
which is what Gradescope gets (grading/results/gradescope.py).

`python -m grading.results --reports DIR` assembles every submission's check files after a run was
killed before its end (run_autograder's time limit).
"""
from collections import Counter
from pathlib import Path

from fa2_sandbox.wire.outcomes import GRADER_ERROR, NOT_GRADED_HERE, PASSED, SKIPPED
from grading.results import gradescope, store
from grading.results.record import points
from grading.rubric import Rubric


def _function(check_id: str) -> str:
    """"grading.checks.test_flash::test_forward[alice-...]" -> "grading.checks.test_flash::test_forward"."""
    return check_id.split("[", 1)[0]


def assemble(reports: Path, submission: str, rubric: Rubric, expected=None, modules=None, groups=None) -> dict:
    """Score every current check of one submission and write reports/<submission>/results.json.

    expected / modules: the tests a full run holds and the modules collected whole (see
    current_records); groups: {test id: rubric group} of the collected tests; by default what
    <submission>/collected.json says. An expected test with no record counts as not graded, and
    so does a check the grader itself failed on: then the submission is incomplete, and its
    output says so first.
    """
    folder = reports / submission
    if expected is None:
        expected, modules = store.load_collected(reports, submission)
        groups = store.collected_groups(reports, submission)
    records = store.current_records(folder, expected, modules)
    info = store.read_info(reports, submission)

    recorded = {r.check_id for r in records}
    never_run = sorted(set(expected or ()) - recorded)
    unrun = unrun_by_group(never_run, groups or {}, records)
    weights, group_sizes, skipped_groups = _group_weights(records, unrun, rubric)
    parts = _parts_with_unrecorded_points(rubric, weights, unrun, group_sizes, skipped_groups)
    tests, ungraded = _score_records(records, rubric, weights, group_sizes, parts)
    for part in parts.values():  # a part none of whose checks could be graded here: blank, not 0
        part["graded"] = not part["not_graded_here"] or part["checks"] > part["not_graded_here"]
    ungraded += [{"name": None, "check_id": n, "reason": "never run: no result was recorded for this check"}
                 for n in never_run]
    total = len(records) + len(never_run)
    graded = total - len(ungraded)
    incomplete = bool(ungraded) or total == 0
    not_here = [r for r in records if r.outcome == NOT_GRADED_HERE]

    check_seconds = round(sum(r.seconds or 0 for r in records), 2)  # the checks' own times, summed
    score = sum(p["score"] for p in parts.values())
    max_score = sum(p["max_score"] for p in parts.values())
    provisional = bool(not_here) and not info.get("ungradable")  # ungradable says all there is to say
    summary = _checks_line(records, info)
    if provisional:
        summary = provisional_line(not_here, parts) + " " + summary
    if incomplete:
        summary = _incomplete_line(ungraded, never_run, graded, total) + " " + summary
    if info.get("interrupted"):  # the run itself ended early (a Slurm task's time limit, say): grading/slurm.py
        summary = f"{info['interrupted']}. {summary}"
    results = {
        # Rounded as every page and line shows them (record.points): Gradescope shows this number.
        "score": round(score, 2), "max_score": round(max_score, 2),
        # Gradescope's: the submission's wall clock in its last grading run, where the run measured it.
        "execution_time": check_seconds if info.get("wall_seconds") is None else info["wall_seconds"],
        "output": summary, "visibility": "visible", "stdout_visibility": "hidden",
        "extra_data": {"submission": submission, "student": info.get("student"), "seed": info.get("seed"),
                       **{k: info[k] for k in ("student_id", "email", "students") if info.get(k)},
                       "environment": info.get("environment", {}), "parts": parts,
                       "ungradable": info.get("ungradable"), "notes": info.get("notes", []),
                       "runner_log_tail": info.get("runner_log_tail", ""),
                       "isolation": info.get("isolation"), "interrupted": info.get("interrupted"),
                       "group_points": {g: round(w, 6) for g, w in weights.items()},
                       "wall_seconds": info.get("wall_seconds"), "check_seconds": check_seconds,
                       "never_run_by_group": dict(sorted(unrun.items())),
                       "incomplete": incomplete, "provisional": provisional, "not_graded_here": len(not_here),
                       "checks_graded": graded, "checks_expected": total,
                       "ungraded": ungraded},
        "tests": tests,
    }
    store.write_json(folder / "results.json", results)
    store.write_json(folder / "gradescope.json", gradescope.grouped(results, rubric))
    return results


def _group_weights(records: list, unrun: Counter, rubric: Rubric) -> tuple:
    """(points of each group, checks of each group that apply, groups none of whose checks apply).

    The maximum is the rubric's total, the same for every submission (Rubric.weights): a group none
    of whose checks apply (all skipped: ddp.bucketing for a 2026-template submission, FSDP for a
    2025 one, a replay of the template's stub) shares its points out over the others. A group's
    points are split evenly over its checks that apply; a check not graded here (it needs a GPU) or
    one the grader failed on keeps its share of the maximum and scores 0 until it is graded, so the
    total is provisional or incomplete, not smaller."""
    applying = [r for r in records if r.outcome != SKIPPED]
    group_sizes = Counter(r.group for r in applying) + unrun
    skipped_groups = {r.group for r in records} - set(group_sizes)
    return rubric.weights(skipped_groups), group_sizes, skipped_groups


def _new_part(label: str) -> dict:
    """A part with nothing scored yet. Every part says its advice share, 0 where it has no advice
    (grades.csv's columns)."""
    return {"label": label, "score": 0.0, "max_score": 0.0, "advice_score": 0.0, "advice_max_score": 0.0,
            "checks": 0, "not_graded_here": 0}


def _parts_with_unrecorded_points(rubric: Rubric, weights: dict, unrun: Counter, group_sizes: Counter,
                                  skipped_groups: set) -> dict:
    """The rubric's parts, in its order (the pages'), whose maxima already hold the points no
    recorded check holds: a whole group's when none of its checks was recorded, else the share of
    its checks that never ran."""
    parts = {key: _new_part(label) for key, label in rubric.parts.items()}
    for group in rubric.groups:
        if group in skipped_groups:
            continue
        waiting = weights[group] * (unrun[group] / group_sizes[group] if group in group_sizes else 1.0)
        if waiting:
            part = parts.setdefault(group.split(".")[0], _new_part(group.split(".")[0]))
            part["max_score"] += waiting
            if rubric.advice(group):
                part["advice_score"] = part.get("advice_score", 0.0)
                part["advice_max_score"] = part.get("advice_max_score", 0.0) + waiting
    return parts


def _score_records(records: list, rubric: Rubric, weights: dict, group_sizes: Counter, parts: dict) -> tuple:
    """Score each record and add it to its part's sums: (the records' scored JSON, in the pages'
    order, and an entry for each check the grader itself failed on)."""
    tests = []
    ungraded = []
    for r in sorted(records, key=lambda r: (r.part, r.check, r.tier or "", r.name)):
        skipped = r.outcome == SKIPPED
        # Scoring: this rubric says where the check comes from, who sees it and what it is worth.
        r.source, r.advice, r.visibility = rubric.source(r.group), rubric.advice(r.group), rubric.visibility(r.group)
        r.max_score = 0.0 if skipped else weights.get(r.group, 0.0) / group_sizes[r.group]
        r.score = r.max_score if r.outcome == PASSED else 0.0
        if r.part in parts or not r.stand_in:  # a stand-in's part is no part of the rubric
            part = parts.setdefault(r.part, _new_part(r.part))
            part["score"] += r.score
            part["max_score"] += r.max_score
            part["checks"] += 0 if skipped else 1
            part["not_graded_here"] += r.outcome == NOT_GRADED_HERE
            if r.advice:  # of which advice (beyond the handout), reported apart
                part["advice_score"] = part.get("advice_score", 0.0) + r.score
                part["advice_max_score"] = part.get("advice_max_score", 0.0) + r.max_score
        if r.outcome == GRADER_ERROR:
            ungraded.append({"name": r.name, "check_id": r.check_id,
                             "reason": "the grader itself failed: " + ("; then ".join(r.attempts or [])
                                                                        or "unknown error")})
        tests.append(r.to_scored_json())
    return tests, ungraded


def _checks_line(records: list, info: dict) -> str:
    """The end of results.json's output: how many checks failed, or why the submission is ungradable."""
    # A grader error or a check not graded here is neither a pass nor a fail, as on Gradescope (gradescope.status)
    scored = [r for r in records if r.row.settled]
    failed = [r for r in scored if not r.passed]
    checks = f"{len(scored)} check{'s' * (len(scored) != 1)}"
    return info.get("ungradable") or (f"{len(failed)} of {checks} failed." if failed
                                      else f"All {checks} passed." if len(scored) != 1 else "The one check passed.")


def _incomplete_line(ungraded: list, never_run: list, graded: int, total: int) -> str:
    """What results.json's output says first of a submission some of whose checks were not graded."""
    why = []
    if grader_failed := sum(1 for u in ungraded if u["name"]):
        why.append(f"{grader_failed} not graded because the grader itself failed")
    if never_run:
        why.append(f"{len(never_run)} never run")
    return (f"incomplete: {graded} of {counted(total, 'check')} graded"
            + (f" ({', '.join(why)})" if why else "")
            + "; the total is not final and will change when the rest are graded.")


def counted(count: int, noun: str) -> str:
    """'1 check', '2 checks': a count with its noun in the number it takes."""
    return f"{count} {noun}{'s' if count != 1 else ''}"


def provisional_line(not_here: list, parts: dict) -> str:
    """What results.json's output says first of a submission with checks that need a GPU: how many,
    worth how many points, part by part."""
    waiting = sum(r.max_score for r in not_here)
    checks, part_points = Counter(r.part for r in not_here), Counter()
    for r in not_here:
        part_points[r.part] += r.max_score
    by_part = "; ".join(f"{parts[key]['label']}: {counted(checks[key], 'check')}, {points(part_points[key])} points"
                        for key in parts if checks[key])
    need = "needs" if len(not_here) == 1 else "need"
    them = "it counts" if len(not_here) == 1 else "they count"
    return (f"provisional: {counted(len(not_here), 'check')} worth {points(waiting)} points {need} a GPU and "
            f"{'was' if len(not_here) == 1 else 'were'} not graded here ({by_part}); {them} 0 until the "
            f"submission is graded on a GPU.")


def unrun_by_group(never_run: list, groups: dict, records: list) -> Counter:
    """How many tests that never ran each group holds. A test's group is known at collection
    (`groups`, from collected.json), so a group all of whose checks were recorded gets its final
    score whatever else never ran. Where an older grader's collected.json does not say, the test
    is counted in every group its test function's recorded checks belong to: its group's recorded
    checks then never share out points that it may yet earn (partial credit errs low, never high)."""
    groups_of_function = {}
    for r in records:
        if r.outcome != SKIPPED:
            groups_of_function.setdefault(_function(r.check_id or ""), set()).add(r.group)
    return Counter(g for n in never_run
                   for g in ([groups[n]] if n in groups else groups_of_function.get(_function(n), ())))


def main(argv=None) -> int:
    """Assemble every submission under --reports from its check files: what a run killed before its
    end (run_autograder's time limit) had recorded, each check file being written as its check ends.
    Prints each submission's results.json output; exits 1 when no submission had a check file."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m grading.results", description=main.__doc__)
    parser.add_argument("--reports", type=Path, required=True, help="the reports folder of the run")
    parser.add_argument("--rubric", type=Path, default=None, help="the run's rubric (default: the default rubric)")
    args = parser.parse_args(argv)
    rubric = Rubric(args.rubric)
    folders = sorted(d for d in args.reports.glob("*/checks") if d.is_dir())
    for checks in folders:
        results = assemble(args.reports, checks.parent.name, rubric)
        print(f"{checks.parent.name}: {results['score']:g} / {results['max_score']:g}: {results['output']}")
    return 0 if folders else 1
