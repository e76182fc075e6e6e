"""Gradescope's page for one submission: one test per rubric group, with Markdown output.

results.json has an entry per check (~180 of 0.1 to 1.33 points): the check's record as its check
file holds it plus its score, which the HTML pages, grades.csv and bench/ read. This module alone
knows Gradescope's shape (status, output, tags, extra_data, ...). Gradescope shows every test of
the file it gets as a box, so `grouped` turns one results.json into the file Gradescope gets
(scoring.assemble writes it as gradescope.json): a test per rubric group (~37), numbered in
course order, that says how many of its checks passed and why the others did not, each diagnosis
once with the cases that share it.

The fields and their values are Gradescope's autograder specification,
https://gradescope-autograders.readthedocs.io/en/latest/specs/ ("Output format", "Test case
status", "Output String Formatting"), and for `leaderboard`
https://gradescope-autograders.readthedocs.io/en/latest/leaderboards/.

results.json's entries are read through CheckRecord.from_json, which never raises on a
malformed one. `rubric` is grading/rubric.py's Rubric, passed in rather than imported:
`reporting` is the installed package and `tests` is not.
"""
from fa2_sandbox.wire.outcomes import PASSED, SKIPPED
from grading.results.record import CheckRecord, as_dict, as_number, as_text, points

# Gradescope's status of a test (its spec: "passed" or "failed", or none at all). The same two words
# as the outcomes PASSED and FAILED, but another vocabulary: a skipped check is "passed" to
# Gradescope (0 of 0), a timeout "failed".
STATUS_PASSED, STATUS_FAILED = "passed", "failed"

MAX_LINES = 25  # failed / not-graded lines per test: Gradescope collapses a long output, nobody reads it
MAX_CASES = 6  # cases named on one line; the rest are counted
# How the words of a group's key read in its test's name; any other word reads with "_" as a space.
WORDS = {"course": "official tests", "handout": "handout shapes", "no_sdpa": "no SDPA", "runs_on_cuda": "runs on CUDA",
         "uses_triton": "uses Triton", "replay": "no replayed answers"}
FORMATTING = set("\\`*_[]|~#")  # Markdown that would format a student's text (< > & become entities)


def escape(text) -> str:
    """Student-influenced text (a diagnosis may quote the submission's error message) as plain
    Markdown on one line. Gradescope sanitizes HTML in "md" output but renders what is left, so
    < > & become entities as well."""
    text = " ".join(as_text(text).split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "".join("\\" + c if c in FORMATTING else c for c in text)


def code(text: str) -> str:
    return f"`{text}`" if text and "`" not in text else escape(text)


def group_name(key: str, labels: dict, advice: bool) -> str:
    """"flash_triton.forward.robustness" -> "Triton FA2 — forward, robustness (advice)"."""
    part, *words = key.split(".")
    said = [labels.get(w) or WORDS.get(w) or w.replace("_", " ") for w in words if w]
    return f"{labels.get(part, part)} — {', '.join(said) or 'all checks'}" + (" (advice)" if advice else "")


def status(records: list) -> str | None:
    """failed if any check failed; passed if every check passed (or does not apply); None when the
    rest were not graded (a grader error, a check that needs a GPU), as the outcome's row says per
    check (fa2_sandbox/wire/outcomes.py). With no status Gradescope judges the test by its score."""
    if any(check_status(r) == STATUS_FAILED for r in records):
        return STATUS_FAILED
    return STATUS_PASSED if records and all(r.passed for r in records) else None


def check_status(r: CheckRecord) -> str | None:
    """The status of one check on its own, from whether its outcome counts as a pass, a fail, or
    neither (the outcome's row, fa2_sandbox/wire/outcomes.py)."""
    if r.row.passes is None:
        return None
    return STATUS_PASSED if r.row.passes else STATUS_FAILED


def status_of(entry: dict) -> str | None:
    """The status Gradescope would give one results.json entry (a check) on its own: passed,
    failed, or None (a grader error, a check not graded here). bench/ and the tests judge by it."""
    return check_status(CheckRecord.from_json(entry))


def reason(r: CheckRecord) -> str:
    return r.diagnosis or r.output.partition("\n")[0] or r.row.sentence


def group_output(records: list) -> str:
    """Markdown: how many checks passed, then each failure's diagnosis with the cases it covers,
    then the checks not graded and why; at most MAX_LINES of those."""
    if not records:
        return ("**Not graded yet**: no check of this group was recorded before the grading run stopped; "
                "its points count 0 until it is regraded.")
    applying = [r for r in records if r.outcome != SKIPPED]
    if not applying:
        return "Does not apply to this submission: " + escape(reason(records[0]))
    passed, n = sum(r.outcome == PASSED for r in applying), len(applying)
    waiting = sum(not r.row.settled for r in applying)
    if passed == n:
        head = "The check passed." if n == 1 else f"All {n} checks passed."
    else:
        head = f"{passed} of {n} check{'s' * (n > 1)} passed" + (f"; {waiting} not graded yet." if waiting else ".")
    lines = [f"**{head}**"]
    several_checks = len({r.check for r in records}) > 1
    label = lambda r: code(f"{r.check}[{r.case}]" if several_checks and r.case else r.case or r.check)
    shown = left = 0
    for title, rows in (("Failed", [r for r in applying if r.row.settled and r.outcome != PASSED]),
                        ("Not graded", [r for r in applying if not r.row.settled])):
        by_reason = {}  # one line per diagnosis, its cases in the order met
        for r in rows:
            by_reason.setdefault(reason(r), []).append(r)
        if rows:
            lines += ["", f"{title} ({len(rows)}):"]
        for why, same in by_reason.items():
            if shown == MAX_LINES:
                left += len(same)
                continue
            more = f" and {len(same) - MAX_CASES} more" if len(same) > MAX_CASES else ""
            lines.append(f"- {', '.join(label(r) for r in same[:MAX_CASES])}{more}: {escape(why)}")
            shown += 1
    if left:
        lines.append(f"- _...and {left} more checks, listed in the grader's HTML report (course staff have it)._")
    return "\n".join(lines)


def summary(results: dict) -> str:
    """The top-level output: results.json's sentence (which starts "incomplete: N of M checks
    graded" or "provisional: ..." when the total is not final), then a line per part."""
    lines = [escape(results.get("output"))]
    for part in as_dict(as_dict(results.get("extra_data")).get("parts")).values():
        part = as_dict(part)
        score, most = as_number(part.get("score")), as_number(part.get("max_score"))
        needs_gpu = part.get("graded") is False and as_number(part.get("not_graded_here")) > 0
        graded = " (not graded here: it needs a GPU)" if needs_gpu else ""
        lines.append(f"- {escape(part.get('label'))}: {points(score)} / {points(most)}{graded}")
    return "\n".join(lines[:1] + [""] + lines[1:]) if len(lines) > 1 else lines[0]


def leaderboard(records: list) -> list:
    """The Triton timing budget's figures, when that check ran (on a GPU only) and passed; lower is
    better. Gradescope shows them only where the assignment enables its leaderboard."""
    for r in records:
        timing = as_dict(r.timing)
        ms, ratio = as_number(timing.get("student_ms"), 0.0), as_number(timing.get("ratio"), 0.0)
        if (r.part, r.check, r.outcome) == ("timing", "flash_triton", PASSED) and ms > 0:
            return ([{"name": "Triton fwd+bwd ms", "value": round(ms, 3), "order": "asc"}]
                    + ([{"name": "time / reference", "value": round(ratio, 3), "order": "asc"}] if ratio > 0 else []))
    return []


def grouped(results: dict, rubric) -> dict:
    """Gradescope's results dict with one test per rubric group, from one results.json dict."""
    extra = as_dict(results.get("extra_data"))
    tests = [t for t in results.get("tests") or [] if isinstance(t, dict)]
    records = []
    for test in tests:
        r = CheckRecord.from_json(test, as_text(extra.get("submission")))
        r.group = r.group or rubric.group_of(r.part, r.check, r.tier).rstrip(".")
        records.append(r)

    # Groups in course order: the rubric's, then any group it does not know, in the order met.
    by_group = {key: [] for key in rubric.groups}
    for r in records:
        by_group.setdefault(r.group, []).append(r)
    # A rubric group with no check counts its points in the maximum (assemble: never recorded), so
    # it gets a test too; unless the file adds up without it (another rubric made the file).
    # Each group's points once those of groups that do not apply were shared out (Rubric.weights), as
    # assemble scored them; a results.json older than that has the rubric's own.
    shared = as_dict(extra.get("group_points"))
    points_of = {key: as_number(shared.get(key), rubric.points(key)) if shared else rubric.points(key)
                 for key in by_group}
    unrecorded = as_number(results.get("max_score")) - sum(r.max_score for r in records) > 1e-3
    # How many checks of each group never ran (scoring.assemble knows every check's group from
    # collection); a results.json older than that leaves it to the points, below.
    never_run = as_dict(extra.get("never_run_by_group")) if "never_run_by_group" in extra else None
    by_group = {key: rs for key, rs in by_group.items() if rs or (unrecorded and points_of[key] > 0)}
    # Parts as results.json lists them (the rubric's order), then any other.
    labels = {**rubric.parts, **{p: as_text(as_dict(v).get("label")) or p
                                 for p, v in as_dict(extra.get("parts")).items()}}
    parts = dict.fromkeys([*as_dict(extra.get("parts")), *rubric.parts, *(k.split(".")[0] for k in by_group)])
    parts = [p for p in parts if any(k.split(".")[0] == p for k in by_group)]  # numbered without gaps

    gradescope_tests = []
    for part_number, part in enumerate(parts, 1):
        for number, key in enumerate([k for k in by_group if k.split(".")[0] == part], 1):
            gradescope_tests.append(_group_test(f"{part_number}.{number}", key, part, by_group[key], rubric,
                                                labels, points_of[key], never_run))

    out = {"score": as_number(results.get("score")), "max_score": as_number(results.get("max_score")),
           "execution_time": as_number(results.get("execution_time")),
           "output": summary(results), "output_format": "md", "test_output_format": "md", "test_name_format": "text",
           "visibility": as_text(results.get("visibility")) or "visible",
           "stdout_visibility": as_text(results.get("stdout_visibility")) or "hidden",
           "extra_data": extra, "tests": gradescope_tests}
    if board := leaderboard(records):
        out["leaderboard"] = board
    return out


def _group_test(number: str, key: str, part: str, rs: list, rubric, labels: dict, points: float,
                never_run: dict | None) -> dict:
    """Gradescope's test of one group: its checks' scores summed, its status and their outputs.
    `points`: the group's points; `never_run`: results.json's never_run_by_group, None in an older one."""
    verdict = status(rs)
    known = key in rubric.groups or not rs
    advice = rubric.advice(key) if known else any(r.advice for r in rs)
    unrun = int(as_number(never_run.get(key))) if never_run is not None else 0
    score, most, whole = _group_score(rs, known, points, unrun, older=never_run is None)
    test = {
        "number": number,
        "name": group_name(key, labels, advice),
        "score": round(score, 4), "max_score": round(most, 4),
        # a group with checks that never ran has passed nothing yet, whatever those that ran did
        "status": verdict if whole or verdict == STATUS_FAILED else None,
        "output": group_output(rs) + ("" if whole or not rs else "\n\n_" + (
            f"{unrun} check{'s' * (unrun > 1)} of this group never ran" if unrun else
            "Some checks of this group never ran") + ": their share counts 0 until the submission is "
            "regraded._"),
        "output_format": "md",
        "tags": [part, *key.split(".")[2:3]] + (["advice"] if advice else []),
        "visibility": rubric.visibility(key) if known else rs[0].visibility,
        "extra_data": {"group": key, "part": part, "source": rubric.source(key) if known else rs[0].source,
                       "advice": advice,
                       "checks": [{"name": r.name, "outcome": r.outcome, "score": r.score,
                                   "max_score": r.max_score, "diagnosis": r.diagnosis, "case": r.case}
                                  for r in rs]},
    }
    if test["status"] is None:
        del test["status"]
    return test


def _group_score(rs: list, known: bool, points: float, unrun: int, older: bool) -> tuple:
    """(score, max score, whether every check of the group was recorded) of one group whose recorded
    checks are `rs`, `unrun` of its checks having never run."""
    score, most = sum(r.score for r in rs), sum(r.max_score for r in rs)
    whole = not unrun  # every check of the group was recorded
    if known and (most > 0 or not rs or unrun):  # the group's points, not a sum of shares rounded per check
        # ... unless some of its checks never ran (they keep their shares): then what the
        # recorded ones earned, never scaled up
        if older:  # an older results.json: its recorded checks hold less than its points
            whole = abs(most - points) <= 1e-3 * max(1, len(rs))
        score, most = (points * score / most if whole and most else score), points
    return score, most, whole
