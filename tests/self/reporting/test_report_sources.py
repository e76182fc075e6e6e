"""The report builder on where each check's requirement comes from (the official tests, the
handout, beyond the handout): sources, advice shown apart, notes, and the class table's filters."""
import csv
import json
import re

from grading.results.gradescope import status_of
from reporting import build_reports
from reporting.page_model import load_all
from tests.self.reporting.pages import (
    NAMES,
    PART_COLUMNS,
    PARTS,
    SPLIT_COLUMNS,
    copy_fixtures,
    fixture_json,
    table_rows,
)


def strip_sources(results: dict) -> dict:
    """results.json without sources: no source, advice, precision or notes."""
    results["extra_data"].pop("notes", None)
    for part in results["extra_data"]["parts"].values():
        part.pop("advice_score", None)
        part.pop("advice_max_score", None)
    for test in results["tests"]:
        for key in ("source", "advice", "precision"):
            test.pop(key, None)
    return results


def test_every_check_shows_its_source(staff):
    reports, _ = staff
    page = (reports / "bob" / "index.html").read_text()
    data = fixture_json("bob")
    # Each failed card names its source once, and again only for a check whose source differs.
    assert ('<div class="source">source: handout, optimizer_state_sharding: add_param_group may '
            '&#39;be called during training&#39;</div>') in page
    advice_failed = page[page.index('<h2 id="advice">'):page.rindex("Passed checks")]
    # bob's 12 robustness failures are two cards (forward, backward) of six checks sharing a source
    assert advice_failed.count("source: beyond the handout: odd lengths, odd head dims, 4-D and strided") == 2
    # Every passed check lists its source under its name.
    passed = [t for t in data["tests"] if status_of(t) == "passed"]
    for test in passed:
        at = page.index(f"<code>{test['name']}</code>")
        assert page.index('<div class="source">source: ', at) < page.index("</li>", at)
    assert ("source: official tests: test_flash_forward_pass_pytorch (CPU, fp32, B=4, N=128, d=64, "
            "atol=rtol=1e-2)") in page
    # Skipped checks too.
    erin = (reports / "erin" / "index.html").read_text()
    skipped = erin[erin.index("Not graded here: needs a GPU (4)"):]
    assert skipped.count("source: beyond the handout: a time budget") == 4


def test_advice_checks_have_their_own_section(staff):
    reports, _ = staff
    page = (reports / "bob" / "index.html").read_text()
    requirements, advice = page.split('<h2 id="advice">Advice (beyond the handout)</h2>')
    assert '<h2 id="requirements">Course requirements</h2>' in requirements
    assert "What the official tests and the handout ask for: 56 / 58.5 points." in requirements
    assert ("These checks are best practices the handout does not ask for, worth few points "
            "(5.6 / 7.3 here).") in advice
    assert "Parameters added with add_param_group after construction are not sharded" in requirements
    assert "Parameters added with add_param_group" not in advice
    assert "The output is wrong in the last, partial query tile" in advice
    assert "The backward takes 3.2× the reference time" in advice
    for test in fixture_json("bob")["tests"]:  # each check in the section its source says
        assert (test["name"] in advice) == test["advice"] or status_of(test) == "failed"
    # The score table shows each part's requirements with its advice apart.
    assert '<td class="pts">13 / 13 <span class="muted advice">(+0.7 / 1.9 advice)</span></td>' in page
    assert '<td class="pts">1.5 / 2 <span class="muted advice">advice</span></td>' in page  # timing: all advice
    assert '<td class="pts">5 / 5</td>' in page  # memory: no advice


def test_tf32_checks_say_so(staff):
    reports, _ = staff
    page = (reports / "bob" / "index.html").read_text()
    at = page.index("<code>bob::flash_triton::forward[fp32-128x128-d64-full]</code>")
    item = page[page.rindex("<li>", 0, at):page.index("</li>", at)]
    assert '<span class="badge precision" title="Passed only under the TF32 rule' in item
    assert ">TF32</span>" in item
    assert "Passed under the TF32 rule: the kernel computes its fp32 matmuls in TF32" in item
    assert page.count(">TF32</span>") == 1
    assert ">TF32</span>" not in (reports / "alice" / "index.html").read_text()


def test_notes_are_findings_at_the_top(staff):
    reports, _ = staff
    for name in ("dave", "erin"):
        page = (reports / name / "index.html").read_text()
        notes = fixture_json(name)["extra_data"]["notes"]
        for note in notes:
            escaped = note.replace(chr(39), "&#39;")
            banner = f'<div class="banner act note"><strong>Action needed:</strong> {escaped}</div>'
            assert banner in page
            assert page.index(banner) < page.index('<div class="score">')  # near the top
    assert 'class="banner act' not in (reports / "alice" / "index.html").read_text()
    dave = (reports / "dave" / "index.html").read_text()
    assert dave.index("Could not be graded:") < dave.index("Action needed:")
    # The class page marks submissions with notes, the notes as the marker's title.
    html = (reports / "index.html").read_text()
    rows = {a["data-name"]: c for a, c in table_rows(html, "class-table")}
    assert "⚠ note" in rows["dave"][0][1] and "⚠ notes" in rows["erin"][0][1]
    assert "⚠" not in rows["alice"][0][1]
    assert ('<span class="badge note" title="The submission declares jaxtyping (pyproject.toml), which this '
            'grader&#39;s Python lacks.') in html
    assert "2 with notes to act on" in html


def test_class_table_shows_advice_apart(staff):
    reports, _ = staff
    html = (reports / "index.html").read_text()
    rows = {a["data-name"]: c for a, c in table_rows(html, "class-table")}
    triton, timing, memory = (2 + PARTS.index(p) for p in ("flash_triton", "timing", "memory"))
    assert rows["bob"][triton][1] == "13/13(+0.7/1.9 advice)"
    assert rows["bob"][triton][0]["title"] == "Triton FA2: 92% (requirements 13 / 13, advice 0.7 / 1.9)"
    assert rows["bob"][triton][0]["data-sort"] == str(round(13.7 / 14.9, 4))  # sorts by the whole part
    assert rows["bob"][timing][1] == "1.5/2advice"
    assert rows["bob"][memory][1] == "5/5"
    assert "then in brackets the advice" in html


BELOW_FULL_MARKS = ["bob", "carol", "dave", "erin"]  # alice has full marks; dave is ungradable, so not final


def test_class_table_carries_what_its_filters_need(staff):
    """The filters (applied by sort.js, see test_report_browser.py) read data-below / data-final
    on each row and data-part / data-below on each part cell. Their controls come hidden: without
    JavaScript there is nothing to click, and no row is hidden."""
    reports, _ = staff
    html = (reports / "index.html").read_text()
    assert '<div id="class-filters" class="filters" hidden>' in html
    assert '<input type="checkbox" id="filter-failing"> only submissions below full marks, or not final' in html
    assert re.findall(r'<option value="(\w*)">', html) == ["", *PARTS]  # every part, then each part alone
    for key in PARTS:
        assert f'<th data-col="part-{key}" data-part="{key}" class="num">' in html
    rows = {a["data-name"]: (a, c) for a, c in table_rows(html, "class-table")}
    assert not any("hidden" in a or any("hidden" in cell for cell, _ in c) for a, c in rows.values())
    assert [n for n, (a, _) in rows.items() if a["data-below"] == "yes"] == BELOW_FULL_MARKS
    assert [n for n, (a, _) in rows.items() if a["data-final"] == "no"] == ["dave"]
    ddp, timing = 2 + PARTS.index("ddp"), 2 + PARTS.index("timing")
    assert all(c[ddp][0]["data-part"] == "ddp" and c[timing][0]["data-part"] == "timing" for _, c in rows.values())
    assert [n for n, (_, c) in rows.items() if c[ddp][0]["data-below"] == "yes"] == ["carol", "dave", "erin"]
    # erin's timing is not scored (skipped without a GPU): not below, whatever it sorts as
    assert [n for n, (_, c) in rows.items() if c[timing][0]["data-below"] == "yes"] == ["bob", "carol", "dave"]


def test_full_marks_up_to_rounding_are_not_below(tmp_path):
    """A total summed in floating point a hair under its max shows as full marks: it is not below."""
    reports = copy_fixtures(tmp_path / "reports")
    data = fixture_json("alice")
    data["score"] = data["max_score"] - 1e-9
    (reports / "alice" / "results.json").write_text(json.dumps(data))
    build_reports(reports)
    rows = {a["data-name"]: a for a, _ in table_rows((reports / "index.html").read_text(), "class-table")}
    assert rows["alice"]["data-below"] == "no"
    assert rows["bob"]["data-below"] == "yes"


def test_student_view_splits_only_the_visible_checks(student):
    page = (student / "bob" / "index.html").read_text()
    visible = [t for t in fixture_json("bob")["tests"] if t["visibility"] == "visible"]
    advice = [t for t in visible if t["advice"]]
    score = sum(t["score"] for t in advice)
    max_score = sum(t["max_score"] for t in advice)
    assert f"worth few points ({score:g} / {max_score:g} here)." in page
    # Triton FA2's visible advice: inputs_unchanged only (robustness and causal_skips_tiles are hidden).
    assert '<td class="pts">13 / 13 <span class="muted advice">(+0.25 / 0.25 advice)</span></td>' in page


def test_results_without_sources_build_as_before(tmp_path):
    """Older results.json files have no source, advice, precision, notes or advice shares."""
    reports = copy_fixtures(tmp_path / "reports")
    for name in NAMES:
        path = reports / name / "results.json"
        path.write_text(json.dumps(strip_sources(json.loads(path.read_text()))))
    build_reports(reports)
    subs = {s.name: s for s in load_all(reports)}
    assert all(not c.source and not c.advice and not c.precision for s in subs.values() for c in s.checks)
    assert all(s.notes == [] and all(p.advice_score is None for p in s.parts) for s in subs.values())
    page = (reports / "bob" / "index.html").read_text()
    for absent in ("Course requirements", "Advice (beyond the handout)", "source: ", ">TF32<",
                   "Action needed:", "advice)"):
        assert absent not in page
    failed_at, passed_at = page.index("<h2>Failed checks (14)</h2>"), page.index("Passed checks (52)")
    assert failed_at < page.index("<h3>Triton FA2 ", failed_at) < passed_at
    html = (reports / "index.html").read_text()
    assert "⚠" not in html and "advice" not in html
    rows = {a["data-name"]: c for a, c in table_rows(html, "class-table")}
    assert rows["bob"][2 + PARTS.index("flash_triton")][1] == "13.7/14.9"
    with open(reports / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["name", "student", "student_id", "email", *PART_COLUMNS, "total", "max", "state", "seed",
                             *SPLIT_COLUMNS, "notes"]
    assert all(r[column] == "" for r in rows for column in SPLIT_COLUMNS)  # unknown: the files do not say
    assert all(r["notes"] == "" for r in rows)


def test_mixed_old_and_new_results_in_one_class(tmp_path):
    """One submission graded before sources existed: blank advice columns, its page as before."""
    reports = copy_fixtures(tmp_path / "reports")
    path = reports / "carol" / "results.json"
    path.write_text(json.dumps(strip_sources(json.loads(path.read_text()))))
    build_reports(reports)
    with open(reports / "grades.csv", newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert rows["carol"]["flash_triton"] == "12.7"
    assert rows["carol"]["flash_triton_requirements"] == rows["carol"]["flash_triton_advice"] == ""
    assert rows["bob"]["flash_triton_advice"] == "0.7"
    assert "Course requirements" not in (reports / "carol" / "index.html").read_text()
    assert "Course requirements" in (reports / "bob" / "index.html").read_text()


def test_malformed_source_fields_do_not_break_the_page(tmp_path):
    reports = tmp_path / "reports"
    (reports / "odd").mkdir(parents=True)
    (reports / "odd" / "results.json").write_text(json.dumps({"tests": [
        {"submission": "odd", "part": "flash_triton", "check": "forward", "case": "fp32-128x128-d64-full",
         "outcome": "passed", "score": 1, "max_score": 1,
         "source": ["not", "text"], "advice": "yes", "precision": 32},
        {"submission": "odd", "part": "flash_triton", "check": "backward", "case": "fp32-128x128-d64-full",
         "outcome": "failed", "output": "dq is wrong.", "source": None, "advice": True},
    ], "extra_data": {"notes": {"not": "a list"},
                      "parts": {"flash_triton": {"score": 1, "max_score": 2, "advice_score": "x",
                                                 "advice_max_score": None}}}}))
    build_reports(reports)
    sub = load_all(reports)[0]
    assert sub.notes == []
    first, second = sub.checks
    assert (first.advice, first.precision) == (False, "32")  # "yes" is not a bool: the source decides
    assert second.advice is True  # no source, but said
    assert sub.part("flash_triton").has_advice is False  # advice_max_score unusable: nothing shown apart
    page = (reports / "odd" / "index.html").read_text()
    assert "Advice (beyond the handout)" in page and 'title="judged at 32 precision">32</span>' in page
    csv_text = (reports / "grades.csv").read_text()
    assert csv_text.splitlines()[0].endswith(",state,seed,flash_triton_requirements,flash_triton_advice,notes")
