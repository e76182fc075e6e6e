"""bench/grade_corpus.py: the official attention tests set against the grader's course-tier checks
of the same cases, test by test."""
import json

from bench.grade_corpus import official_agreement, summarize


def results(folder, name, tests):
    path = folder / name / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"tests": tests, "score": 1, "max_score": 2}))


def course(name, part, check, case, outcome):
    """A course-tier check's results.json entry, as the grader writes it."""
    return {"submission": name, "part": part, "check": check, "case": case, "tier": "course", "advice": False,
            "name": f"{name}::{part}::{check}[{case}]", "outcome": outcome, "diagnosis": "", "output": ""}


def test_each_official_test_meets_the_course_check_of_its_case(tmp_path):
    results(tmp_path, "alice", [course("alice", "flash_triton", "forward", "fp32-128x128-d64-causal", "passed"),
                                course("alice", "flash_triton", "forward", "fp32-128x128-d64-full", "failed"),
                                course("alice", "flash_pytorch", "backward", "fp32-128x128-d64-full", "passed")])
    official = {"alice": {"test_flash_forward_pass_triton[True]": "passed",
                          "test_flash_forward_pass_triton[False]": "passed",
                          "test_flash_backward_pytorch": "passed",
                          "test_flash_backward_triton[True]": "skipped"}}
    assert official_agreement(official, summarize(tmp_path)).splitlines() == [
        "official tests against the grader's course-tier checks, test by test: 2 of 3 agree",
        "  alice test_flash_forward_pass_triton[False]: official passed, the grader's not passed"]
