"""Who submitted (submission.yaml, Gradescope's submission_metadata) and the two CSVs built from
results.json: grades.csv (staff) and gradescope_scores.csv (Gradescope's score upload)."""
import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.discover import IDENTITY_CHARS, load_submission
from grading.results import scoring, store
from reporting import build_reports
from reporting.build import GRADESCOPE_COLUMNS


def submission(root: Path, **files) -> object:
    """A gradable folder holding `files` ({"submission.yaml": text, ...}), as discovery reads it."""
    root.mkdir(parents=True)
    (root / "adapters.py").write_text("")
    for name, content in files.items():
        path = root / name.replace("__", ".")
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return load_submission(root)


# -- discovery: the students' names, ids and emails -------------------------------------------
def test_submission_yaml_gives_the_student_id_and_email_as_written(tmp_path):
    sub = submission(tmp_path / "alice", submission__yaml="student: Alice Liddell\nstudent_id: 012345\n"
                                                          "email: alice@example.edu\n")
    assert (sub.student, sub.student_id, sub.email) == ("Alice Liddell", "012345", "alice@example.edu")
    assert sub.students == [{"name": "Alice Liddell", "sid": "012345", "email": "alice@example.edu"}]
    assert sub.problem is None and sub.notes == []


GROUP_YML = """\
:users:
- :name: Bob Mortimer
  :sid: '1001'
  :email: bob@example.edu
  :id: 77
- :name: Carol Danvers
  :email: carol@example.edu
"""


def test_gradescope_metadata_wins_over_submission_yaml_and_names_a_group(tmp_path):
    sub = submission(tmp_path / "bob", submission__yaml="student: Someone Else\nstudent_id: '9'\n",
                     submission_metadata__yml=GROUP_YML)
    assert sub.students == [{"name": "Bob Mortimer", "sid": "1001", "email": "bob@example.edu"},
                            {"name": "Carol Danvers", "sid": None, "email": "carol@example.edu"}]
    assert (sub.student, sub.student_id, sub.email) == ("Bob Mortimer, Carol Danvers", "1001",
                                                        "bob@example.edu, carol@example.edu")


def test_the_autograders_json_and_the_exports_yml_beside_the_folders(tmp_path):
    # What an autograder gets (Gradescope's docs): JSON, users with name, email and account id.
    sub = submission(tmp_path / "dee", submission_metadata__json=json.dumps(
        {"id": 1, "users": [{"email": "dee@example.edu", "id": 1234, "name": "Dee"}], "previous_submissions": []}))
    assert sub.students == [{"name": "Dee", "sid": None, "email": "dee@example.edu"}]
    # "Export Submissions": one file beside the submission folders, a record per folder.
    export = tmp_path / "export"
    export.mkdir()
    (export / "submission_metadata.yml").write_text(
        "submission_11:\n  :submitters:\n  - :name: Eve\n    :sid: '11'\n    :email: eve@example.edu\n"
        "  :created_at: 2025-04-01 10:00:00.000000000 -07:00\n  :score: 3.0\n"
        "submission_12:\n  :submitters:\n  - :name: Finn\n")
    assert submission(export / "submission_11").students == [{"name": "Eve", "sid": "11", "email": "eve@example.edu"}]
    assert submission(export / "submission_13").students == []  # not in the export: no one, no guess


@pytest.mark.parametrize("text", [
    "{{{: not yaml", "- just\n- a list\n", ":users: [1, [2], {':name': [x]}]\n", "!!python/object:os.system {}\n",
    ":users:\n- :name: !ruby/string 'Ann'\n  :email: " + "a" * 10_000 + "\n", b"\xff\xfe\x00 binary",
    "[" * 5000,
])
def test_malformed_metadata_is_a_note_never_a_crash_or_ungradable(tmp_path, text):
    sub = submission(tmp_path / "x", submission__yaml="student: Xavier\n", submission_metadata__yml=text)
    assert sub.problem is None and sub.adapters_file == "adapters.py"
    assert all(len(value or "") <= IDENTITY_CHARS for s in sub.students for value in s.values())
    if sub.student != "Ann":  # the one readable file: its names, the email clipped
        assert sub.student == "Xavier" and any("submission_metadata.yml" in n for n in sub.notes)
    else:
        assert sub.email == "a" * IDENTITY_CHARS and any("clipped" in n for n in sub.notes)


def test_a_bad_submission_yaml_is_a_note_not_an_ungradable_submission(tmp_path):
    sub = submission(tmp_path / "y", submission__yaml="student: [not, text]\nemail: {a: b}\nstudent_id: yes\n")
    assert sub.students == [] and sub.problem is None
    assert {n.split(" is ")[0] for n in sub.notes} == {"submission.yaml: student", "submission.yaml: email",
                                                       "submission.yaml: student_id"}
    sub = submission(tmp_path / "z", submission__yaml="student: : :\n\t- nope")
    assert sub.problem is None and sub.students == [] and "not valid YAML" in sub.notes[0]


def test_the_identity_travels_through_info_json_into_results_json(tmp_path):
    """controller.py writes these into info.json; assemble copies them into extra_data."""
    sub = submission(tmp_path / "subs" / "bob", submission_metadata__yml=GROUP_YML)
    reports = tmp_path / "reports"
    store.write_info(reports, sub.name, {"student": sub.student, "student_id": sub.student_id,
                                                "email": sub.email, "students": sub.students})
    rubric = SimpleNamespace(parts={}, groups=[], points=lambda group: 0.0, weights=lambda excused: {})
    extra = scoring.assemble(reports, sub.name, rubric, expected=[], modules=set())["extra_data"]
    assert (extra["student"], extra["student_id"], extra["email"]) == (sub.student, sub.student_id, sub.email)
    assert extra["students"] == sub.students


# -- the CSVs ----------------------------------------------------------------------------------
def results(score=10.0, max_score=20.0, parts=None, incomplete=False, **extra) -> dict:
    parts = parts or {"flash_pytorch": {"label": "PyTorch FA2", "score": 6.0, "max_score": 10.0},
                      "ddp": {"label": "DDP", "score": 4.0, "max_score": 10.0}}
    return {"score": score, "max_score": max_score, "tests": [],
            "extra_data": {"seed": 1, "parts": parts, "incomplete": incomplete, "notes": [], **extra}}


def build(tmp_path, capsys, **subs) -> tuple[dict, list, str]:
    """Build from {name: results.json dict}, as build-reports does by hand: grades.csv rows by name,
    gradescope_scores.csv rows, and what the build printed on stderr."""
    reports = tmp_path / "reports"
    for name, data in subs.items():
        (reports / name).mkdir(parents=True)
        (reports / name / "results.json").write_text(json.dumps(data))
    build_reports(reports, warn=True)
    with open(reports / "grades.csv", newline="") as f:
        grades = {r["name"]: r for r in csv.DictReader(f)}
    with open(reports / "gradescope_scores.csv", newline="") as f:
        scores = list(csv.reader(f))
    return grades, scores, capsys.readouterr().err


def test_grades_csv_has_identity_and_a_maximum_per_part(tmp_path, capsys):
    grades, scores, err = build(tmp_path, capsys, alice=results(
        student="Alice Liddell", student_id="012345", email="alice@example.edu"))
    assert list(grades["alice"]) == ["name", "student", "student_id", "email", "flash_pytorch", "flash_pytorch_max",
                                     "ddp", "ddp_max", "total", "max", "state", "seed",
                                     "flash_pytorch_requirements", "flash_pytorch_advice", "ddp_requirements",
                                     "ddp_advice", "notes"]
    assert list(grades["alice"].values()) == ["alice", "Alice Liddell", "012345", "alice@example.edu",
                                              "6", "10", "4", "10", "10", "20", "final", "1", "", "", "", "", ""]
    assert scores == [GRADESCOPE_COLUMNS, ["Alice Liddell", "012345", "alice@example.edu", "10"]]
    assert err == ""  # nothing to warn about


def test_a_part_not_graded_or_absent_is_blank_not_zero(tmp_path, capsys):
    cpu = results(parts={"flash_pytorch": {"score": 6.0, "max_score": 10.0},
                         "ddp": {"score": 0.0, "max_score": 10.0, "graded": False}},
                  provisional=True, student="Bo", email="bo@example.edu")
    short = results(parts={"flash_pytorch": {"score": 6.0, "max_score": 10.0}}, score=6.0, max_score=10.0,
                    student="Cy", email="cy@example.edu")
    grades, scores, err = build(tmp_path, capsys, bo=cpu, cy=short)
    assert [grades["bo"][k] for k in ("flash_pytorch", "flash_pytorch_max", "ddp", "ddp_max")] == ["6", "10", "", ""]
    assert [grades["cy"][k] for k in ("ddp", "ddp_max")] == ["", ""]  # the part is not in its results
    # A provisional total (checks not graded on this machine count 0) is not for upload.
    assert scores[1:] == [["Bo", "", "bo@example.edu", ""], ["Cy", "", "cy@example.edu", "6"]]
    assert "total left blank for bo: not final" in err


def test_an_incomplete_total_is_marked_in_grades_csv_and_blank_for_gradescope(tmp_path, capsys):
    grades, scores, err = build(tmp_path, capsys, dan=results(incomplete=True, student="Dan", student_id="7"))
    assert grades["dan"]["total"] == "10" and grades["dan"]["state"] == "incomplete"
    assert scores[1] == ["Dan", "7", "", ""]
    assert "build-reports: warning: gradescope_scores.csv: total left blank for dan: not final" in err


def test_a_group_gives_one_gradescope_row_per_member(tmp_path, capsys):
    students = [{"name": "Bob Mortimer", "sid": "1001", "email": "bob@example.edu"},
                {"name": "Carol Danvers", "sid": None, "email": "carol@example.edu"}]
    grades, scores, err = build(tmp_path, capsys, bob=results(
        student="Bob Mortimer, Carol Danvers", student_id="1001", email="bob@example.edu, carol@example.edu",
        students=students))
    assert (grades["bob"]["student"], grades["bob"]["student_id"]) == ("Bob Mortimer, Carol Danvers", "1001")
    assert grades["bob"]["email"] == "bob@example.edu, carol@example.edu"
    assert scores[1:] == [["Bob Mortimer", "1001", "bob@example.edu", "10"],
                          ["Carol Danvers", "", "carol@example.edu", "10"]]
    assert err == ""


def test_rows_gradescope_cannot_match_are_written_and_named_in_a_warning(tmp_path, capsys):
    grades, scores, err = build(tmp_path, capsys, erin=results(), fay=results(student="Fay"),
                                gus=results(student="Gus", email="GUS@example.edu"),
                                gus2=results(student="Gus", email="gus@example.edu"))
    assert scores[1:3] == [["erin", "", "", "10"], ["Fay", "", "", "10"]]  # no name known: the folder's
    assert "no email or SID for erin, fay:" in err
    assert "gus@example.edu is in 2 submissions (gus, gus2)" in err


def test_malformed_identity_in_results_json_does_not_break_the_build(tmp_path, capsys):
    grades, scores, _ = build(tmp_path, capsys, odd=results(
        student=["a"], student_id={"x": 1}, email=3, students=[None, "x", {"name": ["y"], "sid": 5}, {}]),
        odd2=results(students={"not": "a list"}, student="=HYPERLINK(\"http://evil\")"))
    assert grades["odd"]["student_id"] == "5" and scores[1][1] == "5"
    assert grades["odd2"]["student"] == "'=HYPERLINK(\"http://evil\")"  # never a formula in a spreadsheet


def test_both_csvs_are_byte_identical_on_rebuild(tmp_path, capsys):
    build(tmp_path, capsys, alice=results(student="Alice", email="a@example.edu"), bob=results(incomplete=True))
    reports = tmp_path / "reports"
    first = {name: (reports / name).read_bytes() for name in ("grades.csv", "gradescope_scores.csv")}
    build_reports(reports)
    assert first == {name: (reports / name).read_bytes() for name in first}
    assert list(csv.reader(io.StringIO(first["gradescope_scores.csv"].decode())))[0] == GRADESCOPE_COLUMNS


def test_a_grading_run_builds_quietly_and_the_class_page_says_what_is_not_ready_to_upload(tmp_path, capsys):
    """The rows Gradescope cannot take are said on the class page; stderr stays quiet unless asked."""
    reports = tmp_path / "reports"
    (reports / "erin").mkdir(parents=True)
    (reports / "erin" / "results.json").write_text(json.dumps(results(provisional=True)))
    build_reports(reports)
    assert capsys.readouterr().err == ""
    page = (reports / "index.html").read_text()
    assert "no email or SID for erin" in page and "total left blank for erin: not final" in page


def test_grades_csv_loads_as_numbers_with_csv_and_pandas(tmp_path, capsys):
    """Every score column is a plain number (blank where unknown), the state a column of its own,
    and every part, FSDP too, has its requirement and advice columns."""
    pandas = pytest.importorskip("pandas")
    parts = {"flash_pytorch": {"label": "PyTorch FA2", "score": 6.5, "max_score": 10.0, "advice_score": 0.5,
                               "advice_max_score": 1.0},
             "fsdp": {"label": "FSDP", "score": 4.144, "max_score": 8.0, "advice_score": 0.0, "advice_max_score": 0.0},
             "timing": {"label": "Timing", "score": 0.0, "max_score": 1.5, "graded": False}}
    build(tmp_path, capsys, amy=results(score=10.644, max_score=19.5, parts=parts, provisional=True),
          ben=results(score=0.0, max_score=19.5, parts=parts, ungradable="tests/adapters.py failed to import"),
          cat=results(score=10.644, max_score=19.5, parts=parts, incomplete=True),
          dee=results(score=19.5, max_score=19.5, parts={k: {**v, "graded": True} for k, v in parts.items()}))
    path = tmp_path / "reports" / "grades.csv"
    numbers = ["total", "max", "seed"] + [f"{p}{suffix}" for p in parts
                                          for suffix in ("", "_max", "_requirements", "_advice")]
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in numbers:
            assert row[column] == "" or float(row[column]) == float(row[column]), (row["name"], column)
    assert [row["state"] for row in rows] == ["provisional", "ungradable", "incomplete", "final"]
    assert (rows[0]["fsdp"], rows[0]["fsdp_requirements"], rows[0]["fsdp_advice"]) == ("4.14", "4.14", "0")
    assert (rows[0]["flash_pytorch_requirements"], rows[0]["flash_pytorch_advice"]) == ("6", "0.5")
    assert rows[0]["timing"] == rows[0]["timing_requirements"] == ""  # not graded here: unknown, not 0
    table = pandas.read_csv(path)
    assert all(pandas.api.types.is_numeric_dtype(table[column]) for column in numbers), table.dtypes
    assert table["total"].tolist() == [10.64, 0.0, 10.64, 19.5]
    assert set(table["state"]) <= {"final", "provisional", "incomplete", "ungradable"}
