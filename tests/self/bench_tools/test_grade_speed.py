"""bench/grade_speed.py: a submission counts as finished once its results.json is written."""
import json

from bench.grade_speed import breakdown


def test_a_submission_with_a_check_still_to_come_is_not_listed_as_finished(tmp_path):
    """A run stopped with a check still running: its submission's last record is not when it
    finished (in a class run, one listed "finished at 392 s" had 63 checks to come)."""
    for name, at in (("alice", 10.0), ("bob", 20.0)):
        (tmp_path / name / "checks").mkdir(parents=True)
        record = {"submission": name, "part": "flash_pytorch", "check": "forward", "tier": "course",
                  "outcome": "passed", "seconds": 1.0, "recorded_at": 1000.0 + at}
        (tmp_path / name / "checks" / "flash_pytorch_forward.json").write_text(json.dumps(record))
    (tmp_path / "alice" / "results.json").write_text("{}")  # written once every check of alice is done
    summary = breakdown(tmp_path, started=1000.0, sequential=False)
    assert summary["finished_s"] == {"alice": 10.0}
    assert summary["unfinished_last_record_s"] == {"bob": 20.0}
