"""bench/compare_verdicts.py --checks: two runs' check files compared, requirement and advice apart,
an advice check a time limit cut apart from one that answered differently."""
import json

import pytest

from bench.compare_verdicts import CUT, check_records, compare_checks, keep, main


def record(name, outcome, advice=False, output="", submission="alice"):
    return {"name": f"{submission}::{name}", "submission": submission, "outcome": outcome, "advice": advice,
            "output": output}


def reports(folder, records):
    for i, r in enumerate(records):
        path = folder / r["submission"] / "checks" / f"{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r))
    return folder


def test_only_what_both_recorded_of_bs_submissions_is_compared_and_cuts_count_apart(tmp_path):
    a = check_records(reports(tmp_path / "a", [
        record("forward[x]", "passed"), record("backward[x]", "passed"),
        record("forward[odd]", "passed", advice=True), record("forward[odd2]", "failed", advice=True),
        record("forward[x]", "failed", submission="bob")]))  # bob: not graded by B
    b = check_records(reports(tmp_path / "b", [
        record("forward[x]", "passed"), record("backward[x]", "failed", output="dq is wrong"),
        record("forward[odd]", "timeout", advice=True, output=CUT + " of 300 s was spent"),
        record("forward[odd2]", "passed", advice=True)]))
    counts, lines = compare_checks(a, b)
    assert counts == {"requirement": 2, "advice": 2, "requirement differ (answered)": 1,
                      "advice differ (cut by a time limit)": 1, "advice differ (answered)": 1}
    assert [line.split("\n")[0] for line in lines] == ["requirement: alice::backward[x]: passed -> failed",
                                                        "advice: alice::forward[odd2]: failed -> passed"]


def test_a_requirement_that_moved_fails_the_comparison(tmp_path, monkeypatch):
    a = reports(tmp_path / "a", [record("forward[x]", "passed"), record("forward[odd]", "passed", advice=True)])
    same = reports(tmp_path / "same", [record("forward[x]", "passed"), record("forward[odd]", "failed", advice=True)])
    moved = reports(tmp_path / "moved", [record("forward[x]", "failed")])
    monkeypatch.setattr("sys.argv", ["compare_verdicts.py", "--checks", str(a), str(same)])
    assert main() == 0
    monkeypatch.setattr("sys.argv", ["compare_verdicts.py", "--checks", str(a), str(moved)])
    assert main() == 1


def test_kept_verdicts_compare_as_the_check_files_they_came_from(tmp_path):
    """A run's reports go with its device call; the verdicts kept beside its speed.json are enough to
    compare a later run against it, cuts and kinds included."""
    a = reports(tmp_path / "a", [record("forward[x]", "passed"), record("backward[x]", "failed", output="dq is wrong"),
                                 record("forward[odd]", "timeout", advice=True, output=CUT + " of 300 s was spent")])
    b = reports(tmp_path / "b", [record("forward[x]", "failed"), record("backward[x]", "failed"),
                                 record("forward[odd]", "passed", advice=True)])
    assert keep(a, tmp_path / "a.json.gz") == 3
    kept, files = (compare_checks(check_records(x), check_records(b)) for x in (tmp_path / "a.json.gz", a))
    assert kept[0] == files[0] == {"requirement": 2, "advice": 1, "requirement differ (answered)": 1,
                                   "advice differ (cut by a time limit)": 1}
    assert [line.split("\n")[0] for line in kept[1]] == [line.split("\n")[0] for line in files[1]] == [
        "requirement: alice::forward[x]: passed -> failed"]


def test_an_older_graders_results_json_is_refused_not_misread(tmp_path, monkeypatch):
    """An older grader's results.json (before the check records: a Gradescope entry, its status and
    its extra_data) must not read as a class of failures: the comparison stops and names --checks."""
    old = {"name": "alice::flash_pytorch::forward[x]", "score": 1.0, "max_score": 1.0, "status": "passed",
           "extra_data": {"outcome": "passed"}}
    for folder, entry in (("old", old), ("new", {**record("flash_pytorch::forward[x]", "passed"), "score": 1.0})):
        (tmp_path / folder / "alice").mkdir(parents=True)
        (tmp_path / folder / "alice" / "results.json").write_text(json.dumps({"tests": [entry]}))
    monkeypatch.setattr("sys.argv", ["compare_verdicts.py", str(tmp_path / "new"), str(tmp_path / "new")])
    assert main() == 0
    monkeypatch.setattr("sys.argv", ["compare_verdicts.py", str(tmp_path / "old"), str(tmp_path / "new")])
    with pytest.raises(SystemExit, match="older grader .* --checks"):
        main()
