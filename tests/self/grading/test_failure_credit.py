"""A failure never earns points: a class whose forward raises on every case scores no more than
one whose forward answers wrongly on every case, and the checks that needed the answer it never
got (the backward, memory and replay checks) say so in plain words, what happened to the case's call,
naming no other check; the page links them to the check that made the call where it is on the page.

Two submissions that differ only in their forward, graded in one run on the course case, the
memory checks and the implementation check of the PyTorch slot: the honest buggy control of
submissions/hostile (dense attention without the 1/sqrt(d) scale), and the same with a forward
that raises.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.results.gradescope import status_of
from grading.rubric import Rubric

ROOT = Path(__file__).resolve().parents[3]
CONTROL = ROOT / "submissions" / "hostile" / "control_buggy"
RAISING_FORWARD = '''
import torch


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        raise RuntimeError("this forward raises on every case")

    @staticmethod
    def backward(ctx, do):
        raise RuntimeError("never reached")
'''
COURSE = "fp32-128x128-d64-full"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("failure-credit")
    shutil.copytree(CONTROL, base / "wrong")
    shutil.copytree(CONTROL, base / "raises")
    (base / "raises" / "cs336_systems" / "attention.py").write_text(RAISING_FORWARD)
    reports = base / "reports"
    proc = subprocess.run([sys.executable, "-m", "pytest", f"--impl={base / 'wrong'}", f"--impl={base / 'raises'}",
                           f"--reports={reports}", "--seed=41", "-q", "-p", "no:cacheprovider", "-n", "0",
                           "-k", "pytorch and (128x128 or no_library or no_score_matrix)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert "grades" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    graded = {name: json.loads((reports / name / "results.json").read_text()) for name in ("wrong", "raises")}
    graded["pages"] = {name: (reports / name / "index.html").read_text() for name in ("wrong", "raises")}
    return graded


def checks(results) -> dict:
    return {t["name"].split("::", 1)[1]: t for t in results["tests"]}


def test_a_forward_that_raises_scores_no_more_than_one_that_answers_wrongly(graded):
    wrong, raises = graded["wrong"], graded["raises"]
    assert raises["score"] <= wrong["score"]
    for part in ("flash_pytorch", "memory"):
        assert raises["extra_data"]["parts"][part]["score"] <= wrong["extra_data"]["parts"][part]["score"], part
    # No group's points moved: the replay that had nothing to compare failed, it was not excused.
    rubric = Rubric()
    for results in (wrong, raises):
        assert results["extra_data"]["group_points"] == pytest.approx({g: rubric.points(g) for g in rubric.groups})
    replay = checks(raises)[f"flash_pytorch::replay[{COURSE}]"]
    assert status_of(replay) == "failed" and replay["score"] == 0 and replay["max_score"] > 0
    assert status_of(checks(wrong)[f"flash_pytorch::replay[{COURSE}]"]) == "passed"


def test_checks_that_needed_the_answer_say_so_and_link_to_the_cause_on_the_page(graded):
    tests = checks(graded["raises"])
    forward = tests[f"flash_pytorch::forward[{COURSE}]"]
    assert status_of(forward) == "failed"
    assert "raised RuntimeError: this forward raises on every case" in forward["output"]
    said = "the forward raised RuntimeError: this forward raises on every case. This check needs the case's answer"
    for name, verb in ((f"flash_pytorch::backward[{COURSE}]", "judge"), (f"flash_pytorch::replay[{COURSE}]", "compare"),
                       ("flash_pytorch::no_sdpa", "judge")):
        test = tests[next(k for k in tests if k.startswith(name))]
        diagnosis = test["diagnosis"]
        assert diagnosis.startswith(f"no answer to {verb}: {said}, so it fails with it"), diagnosis
        assert "charge" not in test["output"] and "::" not in diagnosis, diagnosis  # no grader words, no check id
        assert test["see_also"] == f"flash_pytorch::forward[{COURSE}]"
    memory = tests[next(k for k in tests if k.startswith("memory::forward[pytorch"))]
    assert memory["diagnosis"].startswith(f"no answer to measure: {said}")
    assert "charge" not in memory["output"] and "::" not in memory["diagnosis"]
    assert memory["see_also"] == "flash_pytorch::forward[fp32-1024x1024-d64-causal]"
    page = graded["pages"]["raises"]
    # The course case's forward check is on the page: the backward's card links to it.
    anchor = f"check-flash_pytorch-forward-{COURSE}"
    assert f'id="{anchor}"' in page and f'<a href="#{anchor}"><code>forward[{COURSE}]</code>' in page
    # The memory case's forward check never ran in this run (-k): its card links to nothing.
    assert "check-flash_pytorch-forward-fp32-1024x1024-d64-causal" not in page
