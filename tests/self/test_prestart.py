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
    starter.start("g", good, warm_up=True)
    starter.start("b", broken, warm_up=True)
    starter.wait("g")
    starter.wait("b")
    starter.close()
    assert len(good.threads) == 2 and len(broken.threads) == 1  # a runner that does not import is not warmed
    assert {*good.threads, *broken.threads} == {good.threads[0]} != {threading.current_thread().name}
    assert not starter.starting("g")


def test_a_runner_started_ahead_serves_the_calls_of_another_thread():
    """The runner dies with the thread that started it (PR_SET_PDEATHSIG): the starter's thread
    lives on, so a call from the test's thread after the start still finds it."""
    reference = load_submission(PROJECT_ROOT / "submissions" / "reference")
    runner = SubmissionRunner(reference, env={"TRITON_INTERPRET": "1"})
    starter = prestart.Starter()
    try:
        starter.start("reference", runner, warm_up=True)
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


class Recorder(FakeRunner):
    def __init__(self, log, group):
        super().__init__()
        self.log, self.group = log, group

    def import_failure(self):
        self.log.append(("start", self.group))
        return None

    def warm_up(self):
        self.log.append(("warm up", self.group))

    def close(self):
        self.log.append(("close", self.group))


def test_a_worker_starts_this_group_then_the_next_and_closes_each_when_done(monkeypatch, tmp_path):
    """Grading's bookkeeping, with xdist's queue and the runners faked: the runner of the group
    under way starts first, the next group's right after it, and a group's runner is closed when
    the group after it begins, never the one started ahead."""
    from tests.grading import plugin

    options = {"--rubric": str(PROJECT_ROOT / "tests" / "grading" / "rubric.yaml"), "--reports": str(tmp_path),
               "--seed": 1, "--impl": [str(PROJECT_ROOT / "submissions" / "reference")]}
    grading = plugin.Grading(SimpleNamespace(getoption=options.get))
    grading._starter, log = prestart.Starter(), []
    monkeypatch.setattr(grading, "_new_runner", lambda submission, shard: Recorder(log, shard))
    reference = grading.submissions[0]
    tests = [SimpleNamespace(callspec=SimpleNamespace(params={"submission": reference}), grading_shard=shard)
             for shard in ("a", "a", "b", "c")]
    queue = list(tests)
    monkeypatch.setattr(prestart, "upcoming_items", lambda config: queue)

    def run(test):
        queue.remove(test)
        grading.shard = test.grading_shard
        grading.start_runners(test)
        grading.runner(reference)
        for group in list(grading._starter._starting):  # let the start begun ahead finish too
            grading._starter.wait(group)

    run(tests[0])
    # only the runner started ahead warms up: a test waiting for its own would wait for that too
    assert log == [("start", "a"), ("start", "b"), ("warm up", "b")]
    run(tests[1])
    assert len(log) == 3  # same group: nothing new
    run(tests[2])
    assert sorted(log[3:]) == [("close", "a"), ("start", "c"), ("warm up", "c")]  # "c" starts as "a" closes
    run(tests[3])
    assert log[-1] == ("close", "b")
    grading.close()
    assert ("close", "c") in log and log.count(("close", "a")) == 1
