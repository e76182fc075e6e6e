"""Check records on disk: one file per finished check, assembled into results.json.

A check file is one grading.results.record.CheckRecord as its `to_json` gives it; scoring.assemble()
reads the current ones back, scores them with the rubric and writes each into results.json as the
same JSON plus its score fields (`to_scored_json`), which the pages read back with the same
`from_json`: one type and one format carry a check from the test that makes it to the page that
shows it. Gradescope's shape is in gradescope.json alone.

Who writes what under reports/ (one owner per file; every JSON file is written whole, to a
temporary file that then replaces it, so a reader never sees half of one):

  .seed                      the controller that first grades into the folder (secret_seed): the
                             base seed of every input, unless --seed gives one; readable by the
                             grader's user only, never by a runner.
  class.json                 the controller at session end (record.write_class), `fa2-grade slurm-finish`
                             and `build-reports --keep-others`: the class, the submissions the class
                             page, grades.csv and gradescope_scores.csv list (the run's, and with
                             --keep-others every other one already graded into the folder), and the
                             folders a glob matched that hold no adapters file.
  <sub>/checks/<check>.json  the pytest controller (controller.py, pytest_runtest_logreport), when the
                             check finishes; under xdist the worker's record travels to it on the
                             test report, as CheckRecord.to_json(). Never deleted: a check not run
                             in a session keeps its last result; assemble() decides which records
                             are current.
  <sub>/info.json            the controller alone: facts about the run (student, seed, environment,
                             notes) at session start, and the runner's facts (ungradable reason,
                             log tail) as they arrive from workers on the test reports.
  <sub>/collected.json       the controller alone: the tests a full run holds for the submission,
                             per test module, as the sessions collected them (update_collected).
                             A check is named by its module and test, "grading.checks.test_flash::
                             test_forward[...]" (grading/check.py check_id), the same from any rootdir;
                             and each test's rubric group, known before it runs.
  <sub>/results.json         the controller (assemble), when a submission's last check of the
                             session finishes, and at session end for a submission that did not
                             get there (a stopped run) or whose facts changed since; its parts in
                             the rubric's order (the pages show them in that order). Its `tests`
                             are the current check files' JSON plus score, max_score, visibility.
  <sub>/gradescope.json      assemble, right after results.json (grading/results/gradescope.py:
                             the same results, one test per rubric group), which is what
                             Gradescope gets and the only file in Gradescope's shape;
                             also `python -m grading.results --reports DIR`, which
                             assembles from the check files after a run was killed (run_autograder).
  <sub>/index.html, index.html, grades.csv
                             the controller at session end (reporting.build_reports), or
                             `python -m reporting` run by hand, never both at once; written
                             whole too (reporting/build.py _write).
  .<file>.<pid>.<thread>.tmp the writer of the file it replaces, for an instant (record.write_whole).
  screenshots/               tests/self/reporting/test_report_browser.py, for a person to look at; no
                             grading run reads or writes it.

Workers write nothing under reports/. The runner's scratch folders live outside it.

Checks are written the moment they finish, so a crashed worker loses at most the check it was
running. A check the grader itself failed on (outcome "grader_error") never scores against the
student: it is unscored and marks the submission incomplete, as does a check collected but never
recorded (a run stopped by -x or Ctrl-C, a worker that died).
"""
import json
import math
import os
import re
import secrets
import time
from dataclasses import replace
from pathlib import Path

from grading.results.record import CheckRecord, write_whole


def check_path(reports: Path, submission: str, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.split("::", 1)[-1])
    return reports / submission / "checks" / f"{safe}.json"


def plain_json(value):
    """`value` with every non-finite float as a string ("NaN", "Infinity", "-Infinity"): Python's
    json writes them as bare tokens, which strict JSON parsers refuse. The pages read either."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {key: plain_json(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def write_json(path: Path, data) -> None:
    """Write `data` whole (record.write_whole), as strict JSON."""
    write_whole(path, json.dumps(plain_json(data), indent=1, default=str, allow_nan=False))


def secret_seed(reports: Path) -> int:
    """The reports folder's base seed: drawn from the OS's randomness the first time, then read back,
    so a regrade into the same folder draws the same inputs. A submission cannot predict its inputs
    from the grader's public code, as it could a default seed written there."""
    path = Path(reports) / ".seed"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # drawn before (or by a controller starting at the same moment)
        for _ in range(50):
            text = path.read_text().strip()
            if text.isdigit():
                return int(text)
            time.sleep(0.1)  # the other controller is between its open and its write
        raise RuntimeError(f"{path} does not hold a seed: delete it, or pass --seed") from None
    seed = secrets.randbelow(2**31)
    with os.fdopen(fd, "w") as out:
        out.write(f"{seed}\n")
    return seed


def read_json(path: Path, default=None):
    """The JSON in `path`, or `default` when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_check(reports: Path, record: CheckRecord) -> None:
    record = replace(record, recorded_at=time.time())
    write_json(check_path(reports, record.submission, record.name), record.to_json())


def write_info(reports: Path, submission: str, info: dict) -> None:
    """Facts about a submission's run (environment, seed, ungradable reason, log tail), written
    whole: the controller keeps them in memory and is the only writer (see the top of this file)."""
    write_json(reports / submission / "info.json", info)


def read_info(reports: Path, submission: str) -> dict:
    info = read_json(reports / submission / "info.json", {})
    return info if isinstance(info, dict) else {}


def _module(check_id: str) -> str:
    return check_id.split("::", 1)[0]


def update_collected(reports: Path, submission: str, tests: list, whole: set, groups: dict | None = None) -> None:
    """Remember which tests a full run holds for `submission`: a module collected whole (before
    -k / --deselect: `whole`) replaces what was known of it, so a renamed case drops out; one
    collected in part (tests named by id) only adds its tests. `groups`: each test's rubric group,
    known at collection (grading/check.py declared_group), so that scoring knows the group of a
    test that never ran. Only the controller calls this."""
    path = reports / submission / "collected.json"
    known = read_json(path, {})
    modules = known.get("modules") if isinstance(known, dict) and isinstance(known.get("modules"), dict) else {}
    found = {}
    for check_id in tests:
        found.setdefault(_module(check_id), set()).add(check_id)
    for module, ids in found.items():
        old = modules.get(module) if isinstance(modules.get(module), dict) else {}
        if module in whole:
            modules[module] = {"whole": True, "tests": sorted(ids)}
        else:
            modules[module] = {"whole": bool(old.get("whole")), "tests": sorted(ids | set(old.get("tests") or []))}
    known_groups = known.get("groups") if isinstance(known, dict) and isinstance(known.get("groups"), dict) else {}
    write_json(path, {"modules": modules, "groups": {**known_groups, **(groups or {})}})


def load_collected(reports: Path, submission: str):
    """(the tests a full run holds, the modules ever collected whole), or (None, None) if unknown."""
    known = read_json(reports / submission / "collected.json")
    modules = known.get("modules") if isinstance(known, dict) else None
    if not isinstance(modules, dict):
        return None, None
    modules = {m: v for m, v in modules.items() if isinstance(v, dict)}
    expected = {t for v in modules.values() for t in v.get("tests") or [] if isinstance(t, str)}
    return expected, {m for m, v in modules.items() if v.get("whole")}


def collected_groups(reports: Path, submission: str) -> dict:
    """{test id: rubric group} of the tests collected for `submission` ({} if unknown: an older
    grader's collected.json)."""
    known = read_json(reports / submission / "collected.json")
    groups = known.get("groups") if isinstance(known, dict) else None
    return {t: g for t, g in groups.items() if isinstance(g, str)} if isinstance(groups, dict) else {}


def read_check(path: Path) -> CheckRecord | None:
    """The record in one check file, or None when it is unreadable or not a check record."""
    data = read_json(path)
    if not isinstance(data, dict) or not {"submission", "name", "outcome", "part", "check", "group"} <= data.keys():
        return None
    try:
        return CheckRecord.from_json(data)
    except (TypeError, ValueError):
        return None


def current_records(folder: Path, expected=None, modules=None) -> list:
    """The check records (CheckRecord) of one submission that count: one per test, the newest.

    expected: the test ids a full run holds for the submission (load_collected), or None when
    unknown (then every readable record counts). modules: the test modules collected whole
    (default: those of `expected`). A record counts if its test is expected, or if its module
    was never collected whole (only tests named by id); a record of a test that no longer exists
    in a module collected whole (a renamed case), or one with no test id (an older grader's),
    does not.
    """
    records = [r for r in map(read_check, sorted((folder / "checks").glob("*.json"))) if r is not None]
    if expected is not None:
        expected = set(expected)
        modules = set(modules) if modules is not None else {_module(n) for n in expected}
        records = [r for r in records if r.check_id
                   and (r.check_id in expected or _module(r.check_id) not in modules)]
    newest = {}
    for r in records:
        key = r.check_id or r.name
        if key not in newest or (r.recorded_at or 0) >= (newest[key].recorded_at or 0):
            newest[key] = r
    return list(newest.values())
