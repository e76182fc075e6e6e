"""bench/grade_corpus.py prepare --old-commit 1a8bbb9: the grader as issue 53's requirement 2 measures
against, with the CPU account's profile hooks, still writes the account's lines."""
import json
import os
import subprocess
import sys

import pytest

from bench.grade_corpus import PROFILE, add_profile_hooks
from fa2_sandbox.harness.scratch import PROJECT_ROOT

OLD = "1a8bbb9"


def _has(commit: str) -> bool:
    return subprocess.run(["git", "-C", str(PROJECT_ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _has(OLD), reason=f"this clone lacks {OLD} (a shallow one)")
def test_the_old_graders_runner_reports_its_cpu_by_phase(tmp_path):
    grader, log = tmp_path / "grader", tmp_path / "cpu.jsonl"
    grader.mkdir()
    archive = subprocess.run(["git", "-C", str(PROJECT_ROOT), "archive", OLD], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(grader)], input=archive, check=True)
    assert not (grader / PROFILE).exists()
    add_profile_hooks(grader)

    start_one = ("from pathlib import Path; from fa2_sandbox.harness.client import SubmissionRunner; "
                 "from fa2_sandbox.harness.discover import load_submission; "
                 "r = SubmissionRunner(load_submission(Path('submissions/reference'))); r.start(); r.close()")
    env = {**os.environ, "GRADER_CPU_LOG": str(log), "PYTHONPATH": str(grader)}
    subprocess.run([sys.executable, "-c", start_one], cwd=grader, env=env, check=True, timeout=300)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and lines[0]["submission"] == "reference"
    cpu = lines[0]["cpu"]
    assert cpu["start and imports"] > 0 and cpu["process"] >= cpu["start and imports"]
