"""A runner never outlives the grader that started it (the sandbox launcher's PR_SET_PDEATHSIG).

A pytest worker killed mid-call (Ctrl-C twice, the OOM killer, a CI timeout) cannot kill its
runner itself; a submission stuck in `while True` would then spin on a core for ever."""
import os
import subprocess
import sys
import time

import pytest

from fa2_sandbox.harness.scratch import PROJECT_ROOT

HANG = PROJECT_ROOT / "submissions" / "hostile" / "hang_python_loop"
GRADER = """
import os, sys, threading, time
from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash

from pathlib import Path
runner = SubmissionRunner(load_submission(Path(sys.argv[1])), env={"TRITON_INTERPRET": "1"})
request = Flash("pytorch", FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16), seed=1)
threading.Thread(target=runner.call, args=(request, 600), daemon=True).start()
while not runner.phases.get("forward"):  # the runner is inside the student's endless loop
    time.sleep(0.1)
print(runner.process.pid, flush=True)
os._exit(0)  # the grader dies without cleaning up
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return not any(line.startswith("State:") and "Z" in line for line in status)
    except FileNotFoundError:
        return False


def test_runner_dies_with_its_grader():
    grader = subprocess.run([sys.executable, "-c", GRADER, str(HANG)], cwd=PROJECT_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert grader.returncode == 0, grader.stderr[-2000:]
    pid = int(grader.stdout.split()[-1])
    deadline = time.monotonic() + 20
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(pid):
        os.kill(pid, 9)
        raise AssertionError(f"the runner {pid} was still running 20 s after its grader died")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a process above nice 0")
def test_a_timed_runner_runs_ahead_of_the_others_for_the_window_only():
    """A timing window raises the processes it times (watchdog.ahead_of_the_others) and puts them
    back after: every thread of every process of the runner, not its first thread alone."""
    from fa2_sandbox.harness.client import SubmissionRunner
    from fa2_sandbox.harness.discover import load_submission
    from fa2_sandbox.harness.watchdog import TIMED_NICE, ahead_of_the_others, runner_pids

    def nices(identity):
        return {os.getpriority(os.PRIO_PROCESS, int(tid))
                for pid in runner_pids(identity) for tid in os.listdir(f"/proc/{pid}/task")}

    runner = SubmissionRunner(load_submission(PROJECT_ROOT / "submissions" / "reference"))
    try:
        identity = runner.identity()
        before = nices(identity)
        with ahead_of_the_others(runner_pids(identity)) as raised:
            assert raised > 1 and nices(identity) == {TIMED_NICE}  # torch's threads too
        assert nices(identity) == before != {TIMED_NICE}
    finally:
        runner.close()
