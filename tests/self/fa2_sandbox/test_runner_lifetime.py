"""A runner never outlives the grader that started it (the sandbox launcher's PR_SET_PDEATHSIG).

A pytest worker killed mid-call (Ctrl-C twice, the OOM killer, a CI timeout) cannot kill its
runner itself; a submission stuck in `while True` would then spin on a core for ever."""
import os
import subprocess
import sys
import time

import pytest

from fa2_sandbox.harness import watchdog
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
    back after: every thread of every process of the runner, not its first thread alone, in real time
    where the kernel grants it (else at TIMED_NICE); and a thread one of them starts in the window is
    an ordinary one (test_what_a_raised_thread_starts_is_ordinary)."""
    from fa2_sandbox.harness.client import SubmissionRunner
    from fa2_sandbox.harness.discover import load_submission
    from fa2_sandbox.harness.watchdog import TIMED_NICE, ahead_of_the_others, runner_pids

    def threads(identity):
        return [int(tid) for pid in runner_pids(identity) for tid in os.listdir(f"/proc/{pid}/task")]

    def how(identity):
        return {(os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK, os.getpriority(os.PRIO_PROCESS, tid))
                for tid in threads(identity)}

    runner = SubmissionRunner(load_submission(PROJECT_ROOT / "submissions" / "reference"))
    try:
        identity = runner.identity()
        before = how(identity)
        with ahead_of_the_others(runner_pids(identity)) as raised:
            assert raised.threads > 1 and raised.threads == len(threads(identity))  # torch's threads too
            during = how(identity)
            if raised.real_time:
                assert raised.real_time == raised.threads and {policy for policy, _ in during} == {os.SCHED_RR}
            else:
                assert {nice for _, nice in during} == {TIMED_NICE}
        assert how(identity) == before and all(policy == os.SCHED_OTHER for policy, _ in before)
    finally:
        runner.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a process above nice 0")
# /proc/self/autogroup is empty where the process's CPU group is a cgroup's (a container's, as CI's)
@pytest.mark.skipif(watchdog._autogroup("self") is None, reason="this process is in no autogroup (a cgroup's)")
def test_a_timed_runners_session_runs_ahead_of_the_others_and_the_graders_own_does_not():
    """Under autogroups a thread's nice orders it only within its session, and every runner is a
    session of its own: the window raises the runner's session too (its autogroup), puts it back
    after, and leaves the grader's own session (its terminal's, every worker's) as it was."""
    from fa2_sandbox.harness.client import SubmissionRunner
    from fa2_sandbox.harness.discover import load_submission
    from fa2_sandbox.harness.watchdog import TIMED_NICE, ahead_of_the_others, runner_pids

    def session(pid):
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)

    runner = SubmissionRunner(load_submission(PROJECT_ROOT / "submissions" / "reference"))
    try:
        pids = runner_pids(runner.identity())
        own, theirs = session("self"), session(pids[0])
        assert own[0] != theirs[0]  # the runner is a session of its own
        with ahead_of_the_others(pids + [os.getpid()]) as raised:
            assert raised.sessions == 1 and session(pids[0]) == (theirs[0], TIMED_NICE)
            assert session("self") == own
        assert session(pids[0]) == theirs and session("self") == own
    finally:
        runner.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a process above nice 0")
def test_what_a_raised_thread_starts_is_ordinary():
    """SCHED_RESET_ON_FORK: a thread or a process that a thread raised into real time starts is of the
    ordinary class, so a submission timed in a window cannot leave real-time threads behind it."""
    import threading

    from fa2_sandbox.harness.watchdog import ahead_of_the_others
    with ahead_of_the_others([os.getpid()]) as raised:
        if not raised.real_time:
            pytest.skip("this kernel or container grants no real-time policy")
        assert os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK == os.SCHED_RR
        child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                               capture_output=True, text=True, check=True)
        started = []
        thread = threading.Thread(target=lambda: started.append(os.sched_getscheduler(0)))
        thread.start()
        thread.join()
    assert int(child.stdout) == os.SCHED_OTHER and started == [os.SCHED_OTHER]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER




@pytest.mark.skipif(os.geteuid() != 0, reason="only root may raise a process above nice 0")
def test_a_refused_real_time_says_why_and_falls_back_to_nice(monkeypatch):
    """On the device every window's timed threads fell back to nice, with no word of the cause: the
    window now records the kernel's refusal."""
    from fa2_sandbox.harness import watchdog

    def refuse(tid, policy, param):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(watchdog.os, "sched_setscheduler", refuse)
    with watchdog.ahead_of_the_others([os.getpid()]) as raised:
        assert os.getpriority(os.PRIO_PROCESS, 0) == watchdog.TIMED_NICE
    assert raised.threads >= 1 and raised.real_time == 0 and "Operation not permitted" in raised.refused
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0
