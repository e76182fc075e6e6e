"""What Gradescope gets: one test per rubric group (grading/results/gradescope.py), valid against its
specification, and partial credit when the autograder's time limit kills a run.

- The grouped file: numbered in course order, adding up to the total, a failing group listing
  its failed cases with their diagnoses, no status where checks were not graded, Markdown in a
  student's text escaped, and every field of Gradescope's results.json specification valid.
- `python -m grading.results --reports DIR` assembles check files with no results.json.
- run_autograder, with a stand-in for pytest that records checks and is then killed by the time
  limit (a real grading run takes minutes): the student gets the checks recorded, marked incomplete.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from grading.results import gradescope, scoring, store
from grading.results.gradescope import status_of
from grading.results.record import GRADER_ERROR, CheckRecord, grader_error_diagnosis
from grading.rubric import Rubric
from tests.self.fixtures.make_results import rubric_text

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "self" / "fixtures" / "results"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "results.json").is_file())
MOD = "grading.checks.test_flash"  # a record names its check by module and test (grading/check.py check_id)

# Gradescope's results.json, as https://gradescope-autograders.readthedocs.io/en/latest/specs/ lists
# it ("Output format", "Controlling Test Case Visibility", "Test case status", "Output String
# Formatting") and .../leaderboards/. Its fields only: a misspelt key would be dropped by Gradescope
# without a word, so it fails here. One addition: the top-level max_score (results.json has always
# carried it; the spec has none at the top level, Gradescope totals the tests' max_score).
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
NUMBER = {"type": "number"}
TEST = {"type": "object", "additionalProperties": False, "properties": {
    "score": NUMBER, "max_score": NUMBER, "status": {"enum": ["passed", "failed"]},
    "name": {"type": "string"}, "name_format": FORMAT, "number": {"type": "string"},
    "output": {"type": "string"}, "output_format": FORMAT,
    "tags": {"type": "array", "items": {"type": "string"}}, "visibility": VISIBILITY,
    "extra_data": {"type": "object"}}}
LEADER = {"type": "object", "additionalProperties": False, "required": ["name", "value"], "properties": {
    "name": {"type": "string"}, "value": {"type": ["number", "string"]}, "order": {"enum": ["asc", "desc"]}}}
SPEC = {"type": "object", "additionalProperties": False, "required": ["score", "tests"], "properties": {
    "score": NUMBER, "max_score": NUMBER, "execution_time": NUMBER, "output": {"type": "string"},
    "output_format": FORMAT, "test_output_format": FORMAT, "test_name_format": FORMAT,
    "visibility": VISIBILITY, "stdout_visibility": VISIBILITY, "extra_data": {"type": "object"},
    "tests": {"type": "array", "items": TEST}, "leaderboard": {"type": "array", "items": LEADER}}}


@pytest.fixture(scope="module")
def fixture_rubric(tmp_path_factory):
    """The rubric the fixtures were assembled with (tests/self/fixtures/make_results.py)."""
    text = rubric_text()
    path = tmp_path_factory.mktemp("rubric") / "rubric.yaml"
    path.write_text(text)
    return Rubric(path, known_groups=tuple(yaml.safe_load(text)["groups"]))


@pytest.fixture(scope="module")
def results():
    return {name: json.loads((FIXTURES / name / "results.json").read_text()) for name in NAMES}


@pytest.fixture(scope="module")
def grouped(results, fixture_rubric):
    return {name: gradescope.grouped(results[name], fixture_rubric) for name in NAMES}


def test_one_test_per_group_numbered_in_course_order(grouped, results, fixture_rubric):
    for name, out in grouped.items():
        groups = [t["extra_data"]["group"] for t in out["tests"]]
        assert groups and sorted(groups) == sorted(set(fixture_rubric.groups)), name  # each group once
        numbers = [tuple(map(int, t["number"].split("."))) for t in out["tests"]]
        assert numbers == sorted(set(numbers)), name  # unique and in order
        # Parts numbered in results.json's order (the rubric's), groups in the rubric's order.
        parts = list(results[name]["extra_data"]["parts"])
        assert [parts[n - 1] for n, _ in numbers] == [g.split(".")[0] for g in groups]
        order = list(fixture_rubric.groups)
        assert groups == sorted(groups, key=lambda g: (parts.index(g.split(".")[0]), order.index(g)))
    first = grouped["bob"]["tests"][0]
    assert (first["number"], first["name"]) == ("1.1", "PyTorch FA2 — forward, official tests")


def test_group_scores_add_up_to_the_total(grouped, results, fixture_rubric):
    for name, out in grouped.items():
        # the total in hundredths, as every page shows it; the groups' points to four places
        assert sum(t["score"] for t in out["tests"]) == pytest.approx(results[name]["score"], abs=0.005), name
        assert sum(t["max_score"] for t in out["tests"]) == pytest.approx(results[name]["max_score"], abs=0.005)
        assert (out["score"], out["max_score"]) == (results[name]["score"], results[name]["max_score"])
        for t in out["tests"]:
            assert t["max_score"] == pytest.approx(fixture_rubric.points(t["extra_data"]["group"]))


def test_a_failing_group_lists_its_failed_cases_with_their_diagnoses(grouped, results):
    test = next(t for t in grouped["bob"]["tests"] if t["extra_data"]["group"] == "flash_triton.forward.robustness")
    assert test["status"] == "failed" and test["output_format"] == "md" and test["visibility"] == "after_due_date"
    assert test["output"].startswith("**1 of 7 checks passed.**")
    failed = [t for t in results["bob"]["tests"]
              if "::flash_triton::forward[" in t["name"] and t["tier"] == "robustness"
              and status_of(t) == "failed"]
    diagnoses = {t["diagnosis"] for t in failed}
    assert len(failed) == 6 and len(diagnoses) == 1  # one diagnosis, said once, with the six cases
    line = next(line for line in test["output"].splitlines() if line.startswith("- "))
    assert all(f"`{t['case']}`" in line for t in failed)
    assert line.endswith(gradescope.escape(diagnoses.pop()))
    assert {c["outcome"] for c in test["extra_data"]["checks"]} == {"passed", "failed"}
    assert test["extra_data"]["advice"] is True and "robustness" in test["tags"]
    # A group that passed says so, and carries its checks for staff, without the heatmaps.
    passed = next(t for t in grouped["bob"]["tests"] if t["extra_data"]["group"] == "flash_pytorch.forward.course")
    assert passed["status"] == "passed" and passed["output"] == "**All 2 checks passed.**"
    assert "heatmap" not in json.dumps(grouped["bob"]["tests"])


def test_long_outputs_are_capped(fixture_rubric):
    records = [CheckRecord("s", "flash_pytorch", "forward", case=f"c{i}", tier="course", outcome="failed",
                           diagnosis=f"reason {i // 2}", score=0.0, max_score=0.1) for i in range(80)]
    output = gradescope.group_output(records)
    assert len(output.splitlines()) <= gradescope.MAX_LINES + 5
    assert "`c0`, `c1`: reason 0" in output
    assert f"...and {80 - 2 * gradescope.MAX_LINES} more checks" in output
    many = gradescope.group_output(records[:1] * 9)
    assert f"and {9 - gradescope.MAX_CASES} more: reason 0" in many


def test_groups_with_unsettled_checks_have_no_status(tmp_path, grouped):
    # Needs a GPU (erin was graded on a CPU): no status, the reason said.
    erin = {t["extra_data"]["group"]: t for t in grouped["erin"]["tests"]}
    assert "status" not in erin["memory.peak_scaling.course"]
    assert "not graded here: it needs a CUDA GPU" in erin["memory.peak_scaling.course"]["output"]
    assert grouped["erin"]["output"].startswith("provisional: 6 checks")
    # A grader error, written and assembled as the plugin does: assemble writes gradescope.json too.
    rubric = Rubric()
    for case, outcome in (("a", "passed"), ("b", GRADER_ERROR)):
        store.write_check(tmp_path, CheckRecord(
            "alice", "flash_pytorch", "forward", case=case, tier="course", group="flash_pytorch.forward.course",
            outcome=outcome, check_id=f"{MOD}::test_forward[alice-pytorch-{case}]",
            diagnosis=grader_error_diagnosis(["KeyError: 'o'"]) if outcome == GRADER_ERROR else ""))
    scoring.assemble(tmp_path, "alice", rubric, expected=None, modules=None)
    out = json.loads((tmp_path / "alice" / "gradescope.json").read_text())
    test = next(t for t in out["tests"] if t["extra_data"]["group"] == "flash_pytorch.forward.course")
    assert "status" not in test and "1 not graded yet" in test["output"]
    assert "the grader itself failed" in test["output"]
    assert out["output"].startswith("incomplete: 1 of 2 checks graded")


def test_markdown_in_student_text_is_escaped(fixture_rubric):
    hostile = "raised `x` *boom* _u_ [link](http://x) <img src=x onerror=alert(1)> | ~~s~~ # & \\ \n## title"
    assert gradescope.escape(hostile) == (
        r"raised \`x\` \*boom\* \_u\_ \[link\](http://x) &lt;img src=x onerror=alert(1)&gt; \| \~\~s\~\~ \# &amp; "
        r"\\ \#\# title")
    results = {"score": 0, "max_score": 1, "output": "<b>all</b> *good*", "tests": [
        {"submission": "s", "part": "flash_pytorch", "check": "forward", "case": "c", "tier": "course",
         "score": 0, "max_score": 1, "outcome": "error", "diagnosis": hostile}]}
    out = gradescope.grouped(results, fixture_rubric)
    test = next(t for t in out["tests"] if t.get("status") == "failed")
    assert "<img" not in test["output"] and "`x`" not in test["output"] and "\n## title" not in test["output"]
    assert gradescope.escape(hostile) in test["output"]
    assert out["output"] == "&lt;b&gt;all&lt;/b&gt; \\*good\\*"


def test_leaderboard_from_the_triton_timing_budget(fixture_rubric):
    timing = {"student_ms": 12.3456, "reference_ms": 10.0, "ratio": 1.23456, "budget": 3.0}
    test = {"submission": "s", "part": "timing", "check": "flash_triton", "case": "bf16-4096x4096-d64-causal",
            "tier": "timing", "score": 1, "max_score": 1, "outcome": "passed", "timing": timing}
    out = gradescope.grouped({"score": 1, "max_score": 1, "tests": [test]}, fixture_rubric)
    assert out["leaderboard"] == [{"name": "Triton fwd+bwd ms", "value": 12.346, "order": "asc"},
                                  {"name": "time / reference", "value": 1.235, "order": "asc"}]
    test["outcome"] = "not_graded_here"  # a CPU run: no figures, no leaderboard
    assert "leaderboard" not in gradescope.grouped({"score": 0, "tests": [test]}, fixture_rubric)


def test_valid_against_gradescope_results_specification(grouped, fixture_rubric):
    jsonschema = pytest.importorskip("jsonschema")  # a test-only need
    timing = {"submission": "s", "part": "timing", "check": "flash_triton", "tier": "timing", "outcome": "passed",
              "timing": {"student_ms": 5.0, "ratio": 1.1}}
    with_board = gradescope.grouped({"score": 1, "tests": [timing]}, fixture_rubric)
    assert "leaderboard" in with_board
    for out in [*grouped.values(), with_board, gradescope.grouped({}, Rubric())]:
        jsonschema.validate(out, SPEC)
        json.dumps(out, allow_nan=False)  # plain JSON: no NaN or Infinity
    with pytest.raises(jsonschema.ValidationError):  # the schema does catch a wrong value
        jsonschema.validate({**grouped["bob"], "visibility": "after_deadline"}, SPEC)


def test_results_json_is_the_check_files_json_plus_the_score(tmp_path):
    """results.json (an entry per check: the pages' and grades.csv's input) holds each check file's
    JSON plus score, max_score and visibility, in one format; Gradescope's shape (status, tags,
    extra_data) is in gradescope.json alone."""
    write_partial_run(tmp_path)
    rubric = Rubric()
    scoring.assemble(tmp_path, "alice", rubric)
    files = [json.loads(p.read_text()) for p in (tmp_path / "alice" / "checks").glob("*.json")]
    # what the rubric says of the check's group, as a real check file holds it already
    files = {f["name"]: {**f, "source": rubric.source(f["group"]), "advice": rubric.advice(f["group"])} for f in files}
    entries = json.loads((tmp_path / "alice" / "results.json").read_text())["tests"]
    assert sorted(t["name"] for t in entries) == sorted(files)
    for entry in entries:
        assert {k: v for k, v in entry.items() if k not in ("score", "max_score", "visibility")} == files[entry["name"]]
        assert entry["visibility"] == "visible" and entry["max_score"] > 0
        assert not {"status", "tags", "extra_data"} & entry.keys()
    exported = json.loads((tmp_path / "alice" / "gradescope.json").read_text())["tests"]
    assert exported and all({"extra_data", "tags", "output_format"} <= t.keys() for t in exported)


# -- partial credit after a killed run --------------------------------------------------------------

def write_partial_run(reports: Path, submission="alice", recorded=("a", "b", "c"), expected=("a", "b", "c", "d")):
    """What a run killed mid-way leaves: collected.json and a check file per finished check, no results."""
    check_id = lambda case: f"{MOD}::test_forward[{submission}-pytorch-{case}]"
    store.update_collected(reports, submission, [check_id(c) for c in expected], {MOD})
    for case in recorded:
        store.write_check(reports, CheckRecord(
            submission, "flash_pytorch", "forward", case=case, tier="course", group="flash_pytorch.forward.course",
            outcome="failed" if case == "c" else "passed", diagnosis="wrong" if case == "c" else "",
            check_id=check_id(case)))


def test_results_command_assembles_check_files(tmp_path):
    write_partial_run(tmp_path)
    assert not (tmp_path / "alice" / "results.json").exists()
    run = subprocess.run([sys.executable, "-m", "grading.results", "--reports", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "alice:" in run.stdout and "incomplete: 3 of 4 checks graded" in run.stdout
    results = json.loads((tmp_path / "alice" / "results.json").read_text())
    out = json.loads((tmp_path / "alice" / "gradescope.json").read_text())
    assert out["score"] == results["score"] > 0 and out["output"].startswith("incomplete: 3 of 4 checks graded")
    empty = subprocess.run([sys.executable, "-m", "grading.results", "--reports", str(tmp_path / "none")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert empty.returncode == 1  # nothing recorded: run_autograder falls back to its own results.json


# Stands in for the Python run_autograder calls: `-m pytest` leaves what a killed run leaves (the
# check files in $PREPARED) and hangs until the time limit kills it; anything else (the
# grading.results command, the final copy) is the real Python.
FAKE_PYTHON = textwrap.dedent('''\
    #!/usr/bin/env bash
    if [[ "$1 $2" == "-m pytest" ]]; then
        for arg in "$@"; do [[ $arg == --reports=* ]] && reports=${arg#--reports=}; done
        cp -r "$PREPARED/." "$reports/"
        exec sleep 60
    fi
    exec "$REAL_PYTHON" "$@"
    ''')


@pytest.mark.parametrize("recorded", [True, False])
def test_run_autograder_gives_partial_credit_on_a_timeout(tmp_path, recorded):
    ag = tmp_path / "autograder"
    (ag / "source").mkdir(parents=True)
    (ag / "source" / "grader").symlink_to(ROOT)
    (ag / "submission").mkdir()
    (ag / "submission" / "adapters.py").write_text("")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    if recorded:
        write_partial_run(prepared, "submission")  # run_autograder grades its copy, named "submission"
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {**os.environ, "AUTOGRADER_ROOT": str(ag), "GRADER_PYTHON": str(fake), "REAL_PYTHON": sys.executable,
           "PREPARED": str(prepared), "GRADER_TIME_LIMIT": "2", "TMPDIR": str(tmp_path)}
    subprocess.run([str(ROOT / "integrations" / "gradescope" / "run_autograder")], env=env, cwd=tmp_path,
                   capture_output=True, text=True, timeout=180, check=True)
    out = json.loads((ag / "results" / "results.json").read_text())
    if not recorded:  # nothing to assemble: the fallback, a valid file saying why
        assert out["tests"] == [] and out["score"] == 0 and "did not finish within 2 s" in out["output"]
        return
    assert out["output"].startswith("**Grading stopped at the autograder's time limit (2 s)**")
    assert "incomplete: 3 of 4 checks graded" in out["output"]
    assert out["score"] > 0 and len(out["tests"]) == len(Rubric().groups)  # grouped, with what was earned
    pytest.importorskip("jsonschema").validate(out, SPEC)


# -- the same maximum for every submission ---------------------------------------------------------

def write_class_member(reports: Path, submission: str, skipped: set, failed: set = frozenset()) -> dict:
    """One check per rubric group, passed unless in `failed`, skipped ("could not be measured", or
    not applying) if in `skipped`; assembled with the default rubric."""
    rubric = Rubric()
    check_ids = []
    for group in rubric.groups:
        part, check, *tier = group.split(".")
        check_id = f"grading.checks.test_{part}::test_{check}[{submission}-{group}]"
        check_ids.append(check_id)
        outcome = "skipped" if group in skipped else "failed" if group in failed else "passed"
        store.write_check(reports, CheckRecord(submission, part, check, case=group, tier=(tier or [""])[0],
                                                      group=group, outcome=outcome, check_id=check_id))
    store.update_collected(reports, submission, check_ids, set())
    return scoring.assemble(reports, submission, rubric)


def test_every_submission_is_graded_out_of_the_same_total(tmp_path):
    """A group that does not apply (2025 vs 2026 template, a replay of the template's stub) or could
    not be measured (state_sharded with no readable state) shares its points with its part's other
    groups: the maximum never moves, and an excused check costs nothing."""
    rubric = Rubric()
    fsdp = {g for g in rubric.groups if g.startswith("fsdp.")}
    variants = {"all": set(), "t2026": {"ddp.bucketing"}, "t2025": fsdp,
                "excused": {"ddp.bucketing", "flash_triton.replay", "sharded_optimizer.state_sharded"}}
    for name, skipped in variants.items():
        results = write_class_member(tmp_path, name, skipped)
        out = gradescope.grouped(results, rubric)
        assert results["max_score"] == out["max_score"] == pytest.approx(rubric.total()), name
        assert results["score"] == pytest.approx(rubric.total()), name  # all measured checks passed: full marks
        assert sum(t["max_score"] for t in out["tests"]) == pytest.approx(rubric.total(), abs=1e-3), name
        assert all(t["max_score"] == 0 for t in out["tests"] if t["extra_data"]["group"] in skipped)
    # a failed replay costs its points; one that could not be measured costs nothing
    t2026 = write_class_member(tmp_path, "f2026", {"ddp.bucketing"}, {"flash_triton.replay"})
    excused = write_class_member(tmp_path, "f_excused", {"ddp.bucketing", "flash_triton.replay"})
    assert t2026["score"] == pytest.approx(rubric.total() - 2)
    assert excused["score"] == pytest.approx(rubric.total())


def test_run_autograder_says_why_an_upload_with_no_adapters_file_is_not_graded(tmp_path):
    """The grader stops such an upload before grading (exit status 4, grading/session.py); the
    student reads its sentence, the upload named as such rather than by the autograder's copy."""
    ag = tmp_path / "autograder"
    (ag / "source").mkdir(parents=True)
    (ag / "source" / "grader").symlink_to(ROOT)
    (ag / "submission" / "my-repo").mkdir(parents=True)
    (ag / "submission" / "my-repo" / "README.md").write_text("no adapters here")
    env = {**os.environ, "AUTOGRADER_ROOT": str(ag), "GRADER_PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    subprocess.run([str(ROOT / "integrations" / "gradescope" / "run_autograder")], env=env, cwd=tmp_path,
                   capture_output=True, text=True, timeout=180, check=True)
    out = json.loads((ag / "results" / "results.json").read_text())
    assert out["tests"] == [] and out["output"].startswith(
        "The autograder could not grade this submission: the upload: the folder holds neither tests/adapters.py "
        "nor adapters.py; expected a submission folder (a course repo) with its adapters file there.")


def test_the_provisional_line_counts_one_check_in_the_singular():
    """One check that needs a GPU reads '1 check worth 1.5 points needs', not '1 checks ... need'."""
    parts = {"timing": {"label": "Timing"}, "memory": {"label": "Memory"}}
    one = [CheckRecord(submission="s", part="timing", check="flash_pytorch", max_score=1.5)]
    assert scoring.provisional_line(one, parts) == (
        "provisional: 1 check worth 1.5 points needs a GPU and was not graded here (Timing: 1 check, 1.5 points); "
        "it counts 0 until the submission is graded on a GPU.")
    two = one + [CheckRecord(submission="s", part="memory", check="forward", max_score=2)]
    assert scoring.provisional_line(two, parts) == (
        "provisional: 2 checks worth 3.5 points need a GPU and were not graded here (Timing: 1 check, 1.5 points; "
        "Memory: 1 check, 2 points); they count 0 until the submission is graded on a GPU.")
