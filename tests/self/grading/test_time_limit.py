"""--time-limit, a per-submission limit as Gradescope's (grading/time_limit.py): once a submission's
checks have taken the limit, an advice check whose turn comes later is cut, earning nothing and
keeping its points in its group; a requirement check is never cut, and another submission's time
is its own (issue 40)."""
import json
import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path

from grading.results.gradescope import status_of
from grading.time_limit import SpentTime

ROOT = Path(__file__).resolve().parents[3]

SLOW_ADAPTERS = '''
import time

SLEPT = []


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.flash_pytorch import FlashAttentionPytorch

    class SlowFlashAttention(FlashAttentionPytorch):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            if not SLEPT:  # its first forward only
                SLEPT.append(time.sleep({seconds}))
            return FlashAttentionPytorch.forward(ctx, q, k, v, is_causal)

    return SlowFlashAttention
'''


def _add_many(folder, submission, count):
    spent = SpentTime(folder)
    for _ in range(count):
        spent.add(submission, 0.25)


def test_the_time_of_a_submission_adds_up_across_processes(tmp_path):
    workers = [multiprocessing.Process(target=_add_many, args=(tmp_path, "alice", 400)) for _ in range(4)]
    for worker in workers:
        worker.start()
    _add_many(tmp_path, "bob", 3)
    for worker in workers:
        worker.join()
    assert SpentTime(tmp_path).of("alice") == 400.0 and SpentTime(tmp_path).of("bob") == 0.75
    assert SpentTime(tmp_path).of("carol") == 0.0


def test_only_the_checks_before_one_count_for_its_cut(tmp_path):
    """A check's cut counts the time of its submission's checks before it in the run's order: under
    xdist a later check that a worker ran first (a slow kernel's part started early) cuts nothing
    before it, as in one process that runs them in order."""
    spent = SpentTime(tmp_path)
    spent.add("alice", 250.0, position=40)  # the d128 part, last in the order, finished first
    spent.add("alice", 30.0, position=3)
    spent.add("alice", 1.5, position=3)  # its teardown
    spent.add("bob", 500.0, position=1)
    assert spent.of("alice", before=3) == 0.0 and spent.of("alice", before=4) == 31.5
    assert spent.of("alice", before=41) == spent.of("alice") == 281.5
    assert spent.of("carol", before=5) == 0.0


def test_a_spent_time_limit_cuts_a_slow_submissions_advice_checks_and_only_its_own(tmp_path):
    # The first forward of `slow` sleeps 20 s: its first case alone outlasts the limit of 15 s; the
    # reference's checks take a few seconds in all. Smallest case first: the 17x17 cases (robustness:
    # advice), the course case (a requirement of the official tests), the 113x203 cases (advice).
    slow = tmp_path / "slow"
    (slow / "tests").mkdir(parents=True)
    shutil.copytree(ROOT / "reference", slow / "cs336_systems")
    (slow / "tests" / "adapters.py").write_text(SLOW_ADAPTERS.format(seconds=20))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--impl", str(ROOT / "submissions" / "reference"), "--impl", str(slow),
                           "--reports", str(tmp_path / "r"), "--seed", "7", "--time-limit", "15",
                           "-k", "test_forward and pytorch and fp32 and (128x128 or 17x17 or 113x203)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)

    def tests_of(name):
        results = json.loads((tmp_path / "r" / name / "results.json").read_text())
        return {t["name"]: t for t in results["tests"] if status_of(t)}

    reference, slowly = tests_of("reference"), tests_of("slow")
    assert len(reference) == len(slowly) == 5, proc.stdout[-3000:]
    assert all(status_of(t) == "passed" for t in reference.values()), proc.stdout[-3000:]
    first = slowly["slow::flash_pytorch::forward[fp32-17x17-d64-full]"]
    course = slowly["slow::flash_pytorch::forward[fp32-128x128-d64-full]"]
    assert status_of(first) == "passed" and status_of(course) == "passed" and course["score"] == course["max_score"]
    cut = [t for name, t in slowly.items() if "17x17-d64-causal" in name or "113x203" in name]
    assert len(cut) == 3
    for t in cut:
        assert status_of(t) == "failed" and t["score"] == 0 and t["max_score"] > 0  # its points stay in its group
        assert t["output"].startswith("cut: this submission's time limit of 15 s was spent (its checks before this "
                                      "one had taken ")
        assert "never a requirement or a timing check" in t["output"]
