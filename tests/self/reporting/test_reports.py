"""The report builder on the fake class in fixtures/results (see fixtures/make_results.py, which
writes them through the grader's own record type, check files and assemble)."""
import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.results.gradescope import status_of
from grading.results.record import CheckRecord, read_class, write_class
from reporting import build_reports, main, plots
from reporting.classstats import case_families, check_families, family_rates
from reporting.page_model import load_all
from tests.self.fixtures import make_results
from tests.self.reporting.pages import (
    FIXTURES,
    NAMES,
    PART_COLUMNS,
    PARTS,
    SPLIT_COLUMNS,
    copy_fixtures,
    fixture_json,
    table_rows,
)


def test_writes_a_page_per_submission_the_class_page_and_the_csv(staff):
    reports, written = staff
    expected = {reports / n / "index.html" for n in NAMES} | {reports / "index.html", reports / "grades.csv",
                                                              reports / "gradescope_scores.csv"}
    assert set(written) == expected
    assert all(p.stat().st_size > 0 for p in written)


def test_class_page_has_one_row_per_submission_linking_to_its_page(staff):
    reports, _ = staff
    rows = table_rows((reports / "index.html").read_text(), "class-table")
    assert [attrs["data-name"] for attrs, _ in rows] == NAMES
    for (attrs, cells) in rows:
        assert cells[1][0]["data-sort"] == str(fixture_json(attrs["data-name"])["score"])
    html = (reports / "index.html").read_text()
    for name in NAMES:
        assert f'href="{name}/index.html"' in html


def test_ungradable_submission_has_a_row_saying_why(staff):
    reports, _ = staff
    rows = {attrs["data-name"]: (attrs, cells) for attrs, cells in table_rows((reports / "index.html").read_text(),
                                                                              "class-table")}
    attrs, cells = rows["dave"]
    assert "ungradable" in attrs["class"]
    sentence = ("tests/adapters.py failed to import: ModuleNotFoundError: No module named 'jaxtyping' "
                "(tests/adapters.py, line 5)")
    assert cells[-2][1] == f"Not graded: {sentence}"
    page = (reports / "dave" / "index.html").read_text()
    assert f"Could not be graded:</strong> {sentence}" in page.replace("&#39;", "'")
    # One cause, one message: not also provisional, no part "not scored", every check the same sentence.
    assert "Provisional" not in page and "not scored" not in page
    dave = next(s for s in load_all(reports) if s.name == "dave")
    assert {c.diagnosis for c in dave.checks} == {sentence} and not dave.provisional
    assert all(p.max_score > 0 for p in dave.parts)


def test_the_runner_output_shows_what_the_code_printed_and_says_which_lines_are_torchs(staff):
    reports, _ = staff
    page = (reports / "alice" / "index.html").read_text()
    panel = page[page.index('<details id="runner-output">'):]
    panel = panel[:panel.index("</details>")]
    own, torch_lines = panel.split('<pre class="torch-lines">')
    assert "autotune: BLOCK_Q=64" in own and "c10d" not in own and "runner ready" not in own
    assert "From torch or Triton, not your code" in own and "[c10d] The hostname" in torch_lines
    assert "runner ready in 2.4 s" in torch_lines.split('<pre class="grader-lines">')[1]


def test_top_diagnosis_is_the_first_attempted_failure(staff):
    reports, _ = staff
    rows = {attrs["data-name"]: cells for attrs, cells in table_rows((reports / "index.html").read_text(),
                                                                     "class-table")}
    assert rows["alice"][-2][1] == "All checks passed."
    assert rows["erin"][-2][1].startswith("The forward saves 3 tensors of shape (batch, N_q)")
    # advice (beyond the handout) comes after the course's requirements
    first_failed = next(t for t in fixture_json("bob")["tests"] if status_of(t) == "failed"
                        and not t.get("advice"))
    assert rows["bob"][-2][1] == first_failed["diagnosis"]


def test_top_diagnosis_passes_over_not_attempted(tmp_path):
    """A part left as the template's stub comes before the bug in a part that was attempted."""
    reports = copy_fixtures(tmp_path / "reports")
    results = fixture_json("bob")
    stub = {**results["tests"][0], "part": "flash_pytorch", "check": "forward", "case": "fp32-128x128-d64-full",
            "score": 0, "output": "not attempted", "outcome": "not_attempted",
            "diagnosis": "not attempted: get_flashattention_autograd_function_pytorch raised NotImplementedError"}
    results["tests"].insert(0, stub)
    (reports / "bob" / "results.json").write_text(json.dumps(results))
    build_reports(reports)
    rows = {attrs["data-name"]: cells for attrs, cells in table_rows((reports / "index.html").read_text(),
                                                                     "class-table")}
    first_attempted = next(t for t in results["tests"] if status_of(t) == "failed"
                           and t["outcome"] != "not_attempted" and not t.get("advice"))
    assert rows["bob"][-2][1] == first_attempted["diagnosis"]


def test_part_cells_are_coloured_by_fraction(staff):
    reports, _ = staff
    rows = {attrs["data-name"]: cells for attrs, cells in table_rows((reports / "index.html").read_text(),
                                                                     "class-table")}
    ddp = 2 + PARTS.index("ddp")  # after the name and score cells
    assert rows["alice"][ddp][0]["style"] == f"background: {plots.heat_colour_fraction(1.0)}"
    assert rows["erin"][ddp][0]["style"] == f"background: {plots.heat_colour_fraction(0.0)}"
    assert rows["erin"][ddp][1] == "0/12.5(+0/0.5 advice)"
    timing = 2 + PARTS.index("timing")
    assert rows["erin"][timing][1] == "—"  # not graded on a CPU machine: unknown, not zero


def test_grades_csv_has_a_column_per_part_total_max_and_seed(staff):
    reports, _ = staff
    with open(reports / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["name", "student", "student_id", "email", *PART_COLUMNS, "total", "max", "state",
                             "seed", *SPLIT_COLUMNS, "notes"]
    assert [r["name"] for r in rows] == NAMES
    for row in rows:
        data = fixture_json(row["name"])
        extra = data["extra_data"]
        assert float(row["total"]) == data["score"] and float(row["max"]) == data["max_score"]
        assert row["state"] == ("ungradable" if extra.get("ungradable") else
                                "provisional" if extra.get("provisional") else "final")
        assert row["seed"] == str(extra["seed"])
        assert row["student"] == (extra["student"] or "")
        assert row["student_id"] == row["email"] == ""  # the fixtures name no ids
        for part in PARTS:  # the csv shows points to the hundredth, and a part not graded here as blanks
            if extra["parts"][part].get("graded") is False:
                assert row[part] == row[f"{part}_max"] == ""
                continue
            assert float(row[part]) == pytest.approx(extra["parts"][part]["score"], abs=0.005)
            assert float(row[f"{part}_max"]) == pytest.approx(extra["parts"][part]["max_score"], abs=0.005)
        for part in PARTS:
            info = extra["parts"][part]
            if info.get("graded") is False:
                assert row[f"{part}_advice"] == row[f"{part}_requirements"] == ""
                continue
            assert float(row[f"{part}_advice"]) == pytest.approx(info["advice_score"], abs=0.005)
            assert float(row[f"{part}_requirements"]) == pytest.approx(info["score"] - info["advice_score"])
        assert row["notes"] == " ".join(extra["notes"])
    bob = rows[NAMES.index("bob")]
    assert (bob["flash_triton"], bob["flash_triton_requirements"], bob["flash_triton_advice"]) == ("13.7", "13", "0.7")
    assert rows[NAMES.index("dave")]["notes"].startswith("The submission declares jaxtyping (pyproject.toml)")
    assert rows[NAMES.index("alice")]["notes"] == ""


def test_fixtures_are_what_the_grader_writes_today(tmp_path):
    """The fixtures come from the grader's writer (make_results.py): when the writer changes, they
    are stale, and this says so before the report tests pass on files no grader writes."""
    written = make_results.write_fixtures(tmp_path)
    assert [p.parent.name for p in written] == NAMES
    for path in written:
        assert path.read_text() == (FIXTURES / path.parent.name / "results.json").read_text(), (
            f"{path.parent.name}: rewrite the fixtures with python -m tests.self.fixtures.make_results")


def test_a_record_reads_back_from_results_json_as_it_was_written():
    record = CheckRecord(submission="bob", part="flash_triton", check="backward", case="bf16-113x203-d64-causal",
                         case_fields={"batch": [4], "n_queries": 113, "n_keys": 203, "head_dim": 64,
                                      "dtype": "bfloat16", "is_causal": True, "noncontiguous": False,
                                      "score_scale": 1.0, "score_shift": 0.0},
                         tier="robustness", group="flash_triton.backward.robustness", source="beyond the handout: x",
                         advice=True, outcome="failed", diagnosis="dq is wrong.", output="dq is wrong.\nevidence",
                         seconds=1.5, verdicts={"dq": {"ok": False, "max_bound": 0.01}}, heatmap={"values": [[1.0]]},
                         retried_after="KeyError", check_id="t::x[bob]", score=0.0, max_score=0.1,
                         visibility="after_due_date")
    test = json.loads(json.dumps(record.to_scored_json()))
    assert test["name"] == "bob::flash_triton::backward[bf16-113x203-d64-causal]"
    # results.json's entry is the check file's JSON plus the score fields, read with the same codec
    assert test == {**record.to_json(), "score": 0.0, "max_score": 0.1, "visibility": "after_due_date"}
    back = CheckRecord.from_json(test)
    assert back == record
    assert (back.state, back.evidence, back.bound_for("dq")) == ("failed", "evidence", 0.01)
    assert CheckRecord.from_json(json.loads(json.dumps(record.to_json()))) == CheckRecord(
        **{**vars(record), "score": 0.0, "max_score": 0.0, "visibility": "visible"})  # no scores in check files
    broken = CheckRecord(submission="bob", part="ddp", check="broadcast", outcome="grader_error",
                         diagnosis="not graded: x", output="Traceback ...")
    test = broken.to_scored_json()
    assert status_of(test) is None and test["diagnosis"] == "not graded: x"
    assert CheckRecord.from_json(test).output == "Traceback ..."  # the traceback, for staff


def test_a_record_reads_from_any_json_without_raising():
    """results.json is untrusted: a value of the wrong type reads as the field's default."""
    junk = {"part": ["not", "text"], "verdicts": "v", "heatmap": 1, "timing": [1], "seconds": "slow",
            "score": None, "advice": "yes", "case_fields": [1], "attempts": "a", "stand_in": "yes",
            "precision": 32, "see_also": "", "recorded_at": "now"}
    for data in (None, [], "x", {}, junk):
        r = CheckRecord.from_json(data, submission="s", default_visibility="hidden")
        assert (r.verdicts, r.heatmap, r.timing, r.attempts, r.see_also, r.recorded_at) == (None,) * 6
        assert (r.case_fields, r.seconds, r.score, r.stand_in, r.advice) == ({}, 0.0, 0.0, False, False)
        assert (r.submission, r.visibility, r.outcome) == ("s", "hidden", "error")
        assert status_of(r.to_json()) == "failed"  # an entry that says nothing passes nothing
    assert CheckRecord.from_json(junk).precision == "32" and CheckRecord.from_json({}).part == "other"
    grader_error = CheckRecord.from_json({"outcome": "grader_error", "output": "Traceback ...\n"})
    assert grader_error.diagnosis.startswith("not graded: the grader itself failed")  # not the traceback
    assert grader_error.output == "Traceback ..."


def test_families_come_from_the_case_fields_and_else_from_the_case_ids(tmp_path):
    subs = load_all(FIXTURES)
    flash = [c for s in subs for c in s.checks if c.case_fields]
    assert flash and all(check_families(c) == case_families(c.case) for c in flash)
    reports = copy_fixtures(tmp_path / "reports")
    for name in NAMES:  # checks whose case is only a name
        path = reports / name / "results.json"
        data = json.loads(path.read_text())
        for test in data["tests"]:
            test.pop("case_fields", None)
        path.write_text(json.dumps(data))
    old = load_all(reports)
    assert not any(c.case_fields for s in old for c in s.checks)
    assert [vars(r) for r in family_rates(old)] == [vars(r) for r in family_rates(subs)]


def test_rebuilding_gives_identical_files(tmp_path):
    reports = copy_fixtures(tmp_path / "reports")
    first = {p: p.read_bytes() for p in build_reports(reports)}
    second = {p: p.read_bytes() for p in build_reports(reports)}
    assert first == second


NONE_SKIPPED = ("Skipped checks: they do not apply to this submission, or could not be measured on it; their points "
                "go to the part's other checks (0)")


def test_failed_checks_come_first_grouped_by_part_with_their_evidence(staff):
    reports, _ = staff
    page = (reports / "bob" / "index.html").read_text()
    # Course requirements first, then advice; in each, failed checks by part, then passed, then skipped.
    marks = ["<h2 id=\"requirements\">Course requirements</h2>", "<h3>Failed checks (1)</h3>",
             "<h4>Sharded optimizer ", "Passed checks (26)", NONE_SKIPPED,
             "<h2 id=\"advice\">Advice (beyond the handout)</h2>", "<h3>Failed checks (13)</h3>",
             "<h4>Triton FA2 ", "<h4>Timing ", "Passed checks (26)", NONE_SKIPPED]
    at = 0
    for mark in marks:
        at = page.index(mark, at)
    assert "<details>\n  <summary>Passed checks" in page  # passed checks are collapsed
    assert "· 1 failed · 5 / 7.5 pts</span></h4>" in page  # the part's requirement points
    assert "· 12 failed · 0.7 / 1.9 pts</span></h4>" in page  # the part's advice points
    assert '<p class="diag">dK and dV are wrong only for keys in the last, partial key tile' in page
    assert '<table class="verdicts">' in page and "0.314" in page and "5.10e-5" in page
    assert 'aria-label="heatmap of dk error per tile"' in page
    assert 'aria-label="timing chart"' in page
    assert 'aria-label="memory chart"' in page  # the passed memory check, inside its <details>
    assert "<pre>case fp32-113x203-d64-full, tiles 64x64" in page


def test_each_diagnosis_is_shown_once_per_part(staff):
    reports, _ = staff
    page = (reports / "erin" / "index.html").read_text()
    requirements, advice = page.split('<h2 id="advice">')
    # once among the requirements, once for the advice check (bucket100mb) of the same part
    assert requirements.count("not attempted: get_ddp_individual_parameters raised NotImplementedError") == 1
    assert advice.count("not attempted: get_ddp_individual_parameters raised NotImplementedError") == 1
    assert page.count("individual_parameters[toy_model-2ranks]") == 1
    assert page.count("bucketed[bucket10mb-2ranks]") == 1
    assert advice.count("bucketed[bucket100mb-2ranks]") == 1


def test_skipped_checks_show_their_reason_and_environment_is_shown(staff):
    reports, _ = staff
    page = (reports / "erin" / "index.html").read_text()
    memory = page[page.index("Not graded here: needs a GPU (2)"):page.index('<h2 id="advice">')]  # the handout's
    assert memory.count("not graded here: it needs a CUDA GPU") == 2
    timing = page[page.index("Not graded here: needs a GPU (4)"):]  # beyond the handout
    assert timing.count("not graded here: it needs a CUDA GPU") == 4
    assert "yes (TRITON_INTERPRET=1" in page and "<dd>cpu</dd>" in page and "<dd>7</dd>" in page
    # timing, with nothing scorable on a CPU: its points stay in the maximum, the total is provisional
    assert "not graded here (0 / " in page and 'id="provisional"' in page


def test_a_provisional_page_says_first_what_a_gpu_will_still_grade(staff):
    reports, _ = staff
    page = (reports / "erin" / "index.html").read_text()
    waiting = [t for t in fixture_json("erin")["tests"] if t["outcome"] == "not_graded_here"]
    start = page.index('id="provisional"')
    banner = page[start:page.index("</div>", start)]
    assert start < page.index('<div class="top">')  # before the score and every list of checks

    def points(tests):
        return f"{sum(t['max_score'] for t in tests):.2f}".rstrip("0").rstrip(".")

    assert f"a GPU will still grade {len(waiting)} checks worth {points(waiting)} points" in banner
    parts = {"timing": "Timing", "memory": "Memory"}  # in the rubric's order
    assert {t["part"] for t in waiting} == set(parts)
    for part, label in parts.items():
        mine = [t for t in waiting if t["part"] == part]
        assert (f'<li><strong>{label}</strong>: {len(mine)} checks, {points(mine)} points '
                f'<span class="why">· it needs a CUDA GPU</span></li>') in banner
    assert banner.index("<strong>Memory</strong>") > banner.index("<strong>Timing</strong>")  # the parts' order
    # results.json's output, the first thing Gradescope shows, says the same part by part
    by_part = "; ".join(f"{label}: {len(mine)} checks, {sum(t['max_score'] for t in mine):.4g} points"
                        for part, label in parts.items()
                        if (mine := [t for t in waiting if t["part"] == part]))
    assert fixture_json("erin")["output"].startswith(f"provisional: {len(waiting)} checks worth {points(waiting)} "
                                                     f"points need a GPU and were not graded here ({by_part}); ")


def test_untrusted_text_is_escaped(staff):
    reports, _ = staff
    page = (reports / "carol" / "index.html").read_text()
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "<script" not in page and "<img" not in page and "<h1>FULL MARKS" not in page
    html = (reports / "index.html").read_text()
    assert html.count("<script") == 1  # our sort code, nothing else


def test_injected_names_are_escaped_everywhere(tmp_path):
    reports = tmp_path / "reports"
    data = fixture_json("bob")
    data["extra_data"]["student"] = '"><script>alert(1)</script>'
    data["tests"][0]["heatmap"] = {"tensor": "<b>dq</b>", "values": [[1.0, float("nan")]]}
    data["tests"][0]["source"] = "official tests: <script>alert(2)</script>"
    data["extra_data"]["notes"] = ['pyproject.toml declares "><script>alert(3)</script>']
    (reports / "x&y").mkdir(parents=True)
    (reports / "x&y" / "results.json").write_text(json.dumps(data))
    build_reports(reports)
    for page in (reports / "index.html", reports / "x&y" / "index.html"):
        text = page.read_text()
        assert "<script>alert" not in text and "<b>dq" not in text
        assert "&lt;script&gt;alert(3)&lt;/script&gt;" in text  # the note, as text (a title on the class page)
    assert 'href="x%26y/index.html"' in (reports / "index.html").read_text()


def test_student_view_drops_hidden_checks_and_rescores(staff, student):
    staff_reports, _ = staff
    data = fixture_json("bob")
    visible = [t for t in data["tests"] if t["visibility"] == "visible"]
    hidden = [t for t in data["tests"] if t["visibility"] != "visible"]
    assert hidden and {t["visibility"] for t in hidden} == {"hidden", "after_due_date"}
    page = (student / "bob" / "index.html").read_text()
    full = (staff_reports / "bob" / "index.html").read_text()
    for test in hidden:
        check = f"{test['check']}[{test['case']}]" if test["case"] else test["check"]
        assert check not in page and check in full
    score = sum(t["score"] for t in visible)
    max_score = sum(t["max_score"] for t in visible)
    assert f'<div class="score">{score:g} <small>/ {max_score:g} points' in page
    assert "Student view: the score counts only the checks shown on this page." in page
    assert f"{len(hidden)} further checks will be graded and shown later." in page
    assert "class report" not in page  # no link to the class page, which shows everyone
    assert "Runner output" not in page  # stdout_visibility is "hidden" in the fixtures
    # Staff documents keep every check.
    assert (student / "grades.csv").read_text() == (staff_reports / "grades.csv").read_text()


def test_unreadable_results_json_still_gets_a_row(tmp_path):
    reports = copy_fixtures(tmp_path / "reports")
    (reports / "zoe").mkdir()
    (reports / "zoe" / "results.json").write_text('{"score": 12, "tests": [')  # killed mid-write
    build_reports(reports)
    rows = {a["data-name"]: c for a, c in table_rows((reports / "index.html").read_text(), "class-table")}
    assert rows["zoe"][-2][1].startswith("Not graded: results.json could not be read:")
    assert "zoe," + "," * (3 + len(PART_COLUMNS)) + "0,0,incomplete," in (reports / "grades.csv").read_text()


def test_pass_rates_by_check_and_case_family(staff):
    reports, _ = staff
    subs = load_all(reports)
    rates = {r.label: r for r in family_rates(subs)}
    odd = rates["Triton FA2 / robustness / odd sequence lengths"]
    assert (odd.failed, odd.ran, odd.failed_names) == (2, 4, ["bob", "carol"])  # dave is ungradable
    assert rates["PyTorch FA2 / robustness / odd sequence lengths"].failed == 0
    html = (reports / "index.html").read_text()
    for table in ("family-rates", "check-rates"):
        fractions = [float(cells[1][0]["data-sort"]) for _, cells in table_rows(html, table)]
        assert fractions and fractions == sorted(fractions, reverse=True)  # worst pass rate first
    assert "of the class fails Triton FA2 / robustness /" in html
    assert 'aria-label="score histogram"' in html


@pytest.mark.parametrize("case, families", [
    ("fp32-128x128-d64-full", ["fp32"]),
    ("bf16-113x203-d64-causal", ["bf16", "odd sequence lengths", "N_q ≠ N_k", "causal"]),
    ("fp32-65x130-d96-causal-4d-strided", ["fp32", "odd sequence lengths", "N_q ≠ N_k", "causal",
                                           "head dim not a power of two", "4-D inputs", "strided inputs"]),
    ("fp32-128x128-d64-full-x8", ["fp32", "large scores"]),
    ("toy_model-2ranks", []),
    ("", []),
])
def test_case_families(case, families):
    assert case_families(case) == families


def test_plots_survive_bad_data():
    assert plots.heatmap_svg({}) is None
    assert plots.heatmap_svg({"values": [[]]}) is None
    assert plots.timing_svg({}) is None
    assert plots.memory_svg({"n": [1024, "x"]}) is None
    assert plots.memory_svg({"n": [1024, 2048], "peak_bytes": [None, None]}) is None
    svg = plots.heatmap_svg({"tensor": "dq", "values": [[0.0, float("inf")], [None, 1e-3]]}, bound=1e-4)
    assert svg.startswith("<svg") and "NaN / inf" in svg
    assert plots.heatmap_svg({"values": [[0.0, 0.0]]}).count("no non-zero error") == 1
    assert "budget" not in plots.timing_svg({"student_ms": 2.0})
    assert plots.fmt(float("nan")) == "NaN" and plots.fmt(1.5e-5) == "1.50e-5" and plots.fmt(0.0521) == "0.0521"


def test_heatmap_outlines_the_tiles_over_the_bound():
    svg = plots.heatmap_svg({"tensor": "dk", "row_starts": [0, 64], "col_starts": [0, 64],
                             "values": [[1e-6, 0.3], [2e-6, 0.2]]}, bound=5e-5)
    cells = re.findall(r"<rect [^>]*stroke=\"(#111|#fff)\"[^>]*><title>([^<]*)</title>", svg)
    assert [stroke for stroke, _ in cells] == ["#fff", "#111", "#fff", "#111"]
    assert "bound 5.00e-5" in svg


def test_cli(tmp_path, capsys):
    reports = copy_fixtures(tmp_path / "reports")
    assert main(["--reports", str(reports), "--student-view"]) == 0
    assert "5 submission pages" in capsys.readouterr().out
    assert main(["--reports", str(tmp_path / "missing")]) == 2
    proc = subprocess.run([sys.executable, "-m", "reporting", "--reports", str(reports)],
                          capture_output=True, text=True, cwd=Path(__file__).parents[3])
    assert proc.returncode == 0, proc.stderr


def test_sparse_and_malformed_results_still_render(tmp_path):
    """Only a few keys, plus junk where numbers and evidence should be."""
    reports = tmp_path / "reports"
    (reports / "min").mkdir(parents=True)
    (reports / "min" / "results.json").write_text(json.dumps({"score": 3, "tests": [
        {"submission": "min", "part": "flash_pytorch", "check": "forward", "case": "fp32-17x17-d16-full",
         "outcome": "failed", "output": "o is wrong.\nevidence line", "seconds": "slow", "score": "x",
         "verdicts": {"o": {"max_err": "big"}, "dq": "junk"}, "heatmap": {"values": [[1, "a"]]},
         "timing": {"student_ms": "fast"}, "memory": {"n": [1], "peak_bytes": ["x"]}, "attempts": "one",
         "case_fields": [1], "see_also": 7, "advice": "yes"},
        {"outcome": "passed"},
        {"part": ["not", "text"], "verdicts": [1], "heatmap": "map", "timing": 3, "stand_in": "yes"},
        "not a test",
    ], "extra_data": {"environment": {"device": None}, "parts": {"flash_pytorch": "odd"}}}))
    build_reports(reports)
    page = (reports / "min" / "index.html").read_text()
    assert '<p class="diag">o is wrong.</p>' in page and "<pre>evidence line</pre>" in page
    assert "<td>big</td>" in page and 'aria-label="heatmap of error per tile"' in page
    assert "<dd>—</dd>" in page
    rows = {a["data-name"]: c for a, c in table_rows((reports / "index.html").read_text(), "class-table")}
    assert rows["min"][1][0]["data-sort"] == "3.0"


def test_isolation_is_said_in_words_never_silently(tmp_path):
    """A runner that held the student's code with the grader's own rights is named on its page and
    counted in red on the class page; one that was confined is named too; an older file says —."""
    reports = tmp_path / "reports"
    shutil.copytree(FIXTURES, reports)
    notes = {"alice": {"mode": "namespace", "note": "runner isolated: its own uid, a root of its own"},
             "bob": {"mode": "none", "note": "runner NOT isolated: the grader is not root, so it can read and "
                                             "write what the grader's user can"}}
    for name, isolation in notes.items():
        path = reports / name / "results.json"
        data = json.loads(path.read_text())
        data["extra_data"]["isolation"] = isolation
        path.write_text(json.dumps(data))
    build_reports(reports)
    assert "<dd>runner isolated: its own uid, a root of its own</dd>" in (reports / "alice" / "index.html").read_text()
    assert '<dd class="text-bad">runner NOT isolated: the grader is not root' in \
        (reports / "bob" / "index.html").read_text()
    assert "<dt>isolation</dt><dd>—</dd>" in (reports / "carol" / "index.html").read_text()
    assert "1 graded with their code NOT isolated" in (reports / "index.html").read_text()


def test_the_class_is_what_class_json_lists_and_keep_others_adds_the_rest(tmp_path, capsys):
    """A grading run writes DIR/class.json (grading/results/record.py write_class); the pages list
    its submissions only, name the others as left out, and `build-reports --keep-others` lists them
    all without grading. A folder without class.json (an older grader's) is every submission."""
    reports = copy_fixtures(tmp_path / "reports")
    write_class(reports, ["alice", "bob"], skipped=["class/handouts"])
    build_reports(reports)
    html = (reports / "index.html").read_text()
    assert [a["data-name"] for a, _ in table_rows(html, "class-table")] == ["alice", "bob"]
    assert "<title>Class report · 2 submissions</title>" in html
    assert "3 submissions graded into this folder by earlier runs (carol, dave, erin)" in html
    assert "Not graded: 1 folder" in html and "class/handouts" in html
    with open(reports / "grades.csv", newline="") as f:
        assert [r["name"] for r in csv.DictReader(f)] == ["alice", "bob"]
    assert main(["--reports", str(reports), "--keep-others"]) == 0
    assert "5 submission pages" in capsys.readouterr().out
    html = (reports / "index.html").read_text()
    assert [a["data-name"] for a, _ in table_rows(html, "class-table")] == NAMES and 'id="left-out"' not in html
    assert read_class(reports) == {"submissions": NAMES, "skipped": ["class/handouts"]}
