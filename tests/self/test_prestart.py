"""A worker starts its next group's runner ahead (tests/grading/prestart.py)."""
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

from fa2_adapters.harness.client import SubmissionRunner
from fa2_adapters.harness.discover import load_submission
from fa2_adapters.harness.scratch import PROJECT_ROOT
from fa2_adapters.wire.cases import FlashCase
from tests.grading import prestart

SUITE = """
import pytest

@pytest.mark.parametrize("i", range(3))
@pytest.mark.xdist_group("a")
def test_a(i):
    pass

@pytest.mark.parametrize("i", range(2))
@pytest.mark.xdist_group("b")
def test_b(i):
    pass
"""

CONFTEST = """
import json, os
from tests.grading.prestart import upcoming_items

def pytest_runtest_setup(item):
    seen = [i.name for i in upcoming_items(item.config)]
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps([item.name, seen]) + "\\n")
"""


def test_a_worker_sees_the_tests_xdist_sent_it(tmp_path):
    """Against the installed pytest-xdist: if it renames what upcoming_items reads, this fails
    (and the grader only loses the head start: runners then start on first use)."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    seen = tmp_path / "seen.jsonl"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "1", "--dist", "loadgroup",
                          "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
                         cwd=tmp_path, env={**_env(), "SEEN": str(seen)}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in seen.read_text().splitlines()]
    names = [name for name, _ in rows]
    assert sorted(names) == ["test_a[0]", "test_a[1]", "test_a[2]", "test_b[0]", "test_b[1]"]
    for position, (name, upcoming) in enumerate(rows):
        # what this worker runs after this test, in order: what it has been sent so far
        assert upcoming == names[position + 1:position + 1 + len(upcoming)], rows
    assert rows[0][1], "the first test saw nothing queued after it"
    assert rows[-1][1] == []


def test_outside_a_worker_nothing_is_upcoming(pytestconfig):
    assert prestart.upcoming_items(pytestconfig) == []


def _env():
    import os
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}


class FakeRunner:
    def __init__(self, imports=True):
        self.imports, self.threads = imports, []

    def import_failure(self):
        self.threads.append(threading.current_thread().name)
        return None if self.imports else "import error"

    def warm_up(self):
        self.threads.append(threading.current_thread().name)


def test_the_starter_starts_in_one_thread_of_its_own_and_warms_up_only_what_imports():
    starter = prestart.Starter()
    good, broken = FakeRunner(), FakeRunner(imports=False)
    starter.start("g", good)
    starter.start("b", broken)
    starter.wait("g")
    starter.wait("b")
    starter.close()
    assert len(good.threads) == 2 and len(broken.threads) == 1  # a runner that does not import is not warmed
    assert {*good.threads, *broken.threads} == {good.threads[0]} != {threading.current_thread().name}
    assert not starter.busy("g")


def test_a_runner_started_ahead_serves_the_calls_of_another_thread():
    """The runner dies with the thread that started it (PR_SET_PDEATHSIG): the starter's thread
    lives on, so a call from the test's thread after the start still finds it."""
    reference = load_submission(PROJECT_ROOT / "submissions" / "reference")
    runner = SubmissionRunner(reference, env={"TRITON_INTERPRET": "1"})
    starter = prestart.Starter()
    try:
        starter.start("reference", runner)
        starter.wait("reference")
        pid = runner.process.pid
        case = FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16)
        reply = runner.call({"op": "flash", "slot": "pytorch", "case": case.to_json(), "seed": 1, "device": "cpu"}, 300)
        assert reply.ok, reply.message
        assert runner.process is not None and runner.process.pid == pid  # the same runner, not a restart
        assert "CUDA warmed up in" in runner.log_tail()
    finally:
        starter.close()
        runner.close()


class Recorder:
    """A runner that only says what was done to it, and in which thread."""

    def __init__(self, log, group):
        self.log, self.group, self.up = log, group, False

    def _note(self, what):
        ahead = threading.current_thread().name.startswith("runner-prestart")
        self.log.append((what, self.group) + (("ahead",) if ahead else ()))

    def import_failure(self):
        if not self.up:
            self.up = True
            self._note("start")
        return None

    def warm_up(self):
        self._note("warm up")

    def close(self):
        self._note("close")


def test_a_worker_starts_the_next_groups_runner_once_its_own_is_up(monkeypatch, tmp_path):
    """Grading's bookkeeping, with xdist's queue and the runners faked: a group's runner starts
    on first use, the next group's then starts ahead (and warms up), except beside a timing
    check, and a group's runner is closed when the group after it begins."""
    from tests.grading import plugin

    options = {"--rubric": str(PROJECT_ROOT / "tests" / "grading" / "rubric.yaml"), "--reports": str(tmp_path),
               "--seed": 1, "--impl": [str(PROJECT_ROOT / "submissions" / "reference")]}
    grading = plugin.Grading(SimpleNamespace(getoption=options.get))
    grading._starter, log = prestart.Starter(), []
    monkeypatch.setattr(grading, "_new_runner", lambda submission, shard: Recorder(log, shard))
    reference = grading.submissions[0]
    tests = [SimpleNamespace(callspec=SimpleNamespace(params={"submission": reference}), grading_shard=shard)
             for shard in ("a", "a", "b", "timing-t", "c")]
    queue = list(tests)
    monkeypatch.setattr(prestart, "upcoming_items", lambda config: queue)

    def run(test):
        queue.remove(test)
        grading.shard = test.grading_shard
        grading.runner(reference)
        for group in list(grading._starter._starting):  # let the start begun ahead finish too
            grading._starter.wait(group)
        return [entry for entry in log if entry not in seen]

    seen = []
    steps = []
    for test in tests:
        steps.append(run(test))
        seen = list(log)
    assert steps[0] == [("start", "a"), ("start", "b", "ahead"), ("warm up", "b", "ahead")]
    assert steps[1] == []  # the same group: nothing new
    assert steps[2] == [("close", "a"), ("start", "timing-t", "ahead"), ("warm up", "timing-t", "ahead")]
    assert steps[3] == [("close", "b")]  # nothing starts beside a timing check
    assert steps[4] == [("close", "timing-t"), ("start", "c")]  # so "c" starts on first use
    grading.close()
    assert log[-1] == ("close", "c")
