"""fa2_sandbox/harness/gpu_ledger.py: admission to a shared GPU, with a fake capacity.

Each "process" here is a thread with a GpuLedger of its own on one ledger file, as each worker has
its own; the file's flock is taken per open, so threads contend for it as processes do."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from fa2_sandbox.harness.gpu_ledger import GIB, GpuLedger, capacity_bytes
from fa2_sandbox.harness.watchdog import runner_identity

HOLD_S = 0.6


@pytest.fixture
def path(tmp_path):
    return tmp_path / "gpu-all-0.json"


def hold_in_thread(ledger_path, log, name, nbytes=None, alone=False, seconds=HOLD_S, capacity=10, window=None,
                   runner=None, holding=False):
    """Start a thread that takes the GPU (a reservation of `nbytes`, a window of `window` bytes, or
    the GPU alone) for `seconds`, logging (name, 'in'/'out', time). Returns the thread once it has
    queued, or with `holding` once it holds the GPU: a test whose later arrivals must find it
    holding says so, for one that has only queued may be passed (a window passes a reservation it
    can pause). `runner`: the processes a window may pause during the reservation."""
    ledger = GpuLedger(ledger_path, capacity)

    def take():
        if alone:
            return ledger.alone(name)
        if window is not None:
            return ledger.window(window, name)
        return ledger.reserve(nbytes, name, runner=runner)

    def run():
        with take():
            log.append((name, "in", time.monotonic()))
            time.sleep(seconds)
            log.append((name, "out", time.monotonic()))

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if holding:
            if any(n == name and e == "in" for n, e, _ in log):
                return thread
        else:  # queued or holding: in the ledger's file
            state = json.loads(ledger_path.read_text() or "{}") if ledger_path.exists() else {}
            entries = list(state.get("holders", {}).values()) + list(state.get("waiting", {}).values())
            if any(entry["what"] == name for entry in entries):
                return thread
        time.sleep(0.01)
    raise AssertionError(f"{name} never {'held the GPU' if holding else 'reached the ledger'}")


def at(log, name, event):
    return next(t for n, e, t in log if n == name and e == event)


def test_reservations_that_fit_run_together_and_one_that_does_not_waits(path):
    log = []
    first = hold_in_thread(path, log, "first", 4)
    second = hold_in_thread(path, log, "second", 4)  # 8 of 10: fits beside the first
    third = hold_in_thread(path, log, "third", 6)  # 14 of 10: waits for room
    for thread in (first, second, third):
        thread.join()
    assert at(log, "second", "in") < at(log, "first", "out")
    assert at(log, "third", "in") >= min(at(log, "first", "out"), at(log, "second", "out"))


def test_the_gpu_alone_waits_for_the_holders_and_holds_nothing_back_while_it_waits(path):
    log = []
    holder = hold_in_thread(path, log, "holder", 2, holding=True)
    window = hold_in_thread(path, log, "window", alone=True)
    later = hold_in_thread(path, log, "later", 1)  # queued after the window: it need not wait for it
    for thread in (holder, window, later):
        thread.join()
    window_in, window_out = at(log, "window", "in"), at(log, "window", "out")
    for other in ("holder", "later"):  # nothing else on the GPU while the window held it
        assert at(log, other, "out") <= window_in or at(log, other, "in") >= window_out
    assert at(log, "later", "in") < at(log, "holder", "out")  # ran beside the holder, past the waiting window


def test_windows_go_in_arrival_order(path):
    log = []
    holder = hold_in_thread(path, log, "holder", 2, seconds=0.3)
    first = hold_in_thread(path, log, "first window", window=1, seconds=0.3)
    second = hold_in_thread(path, log, "second window", alone=True, seconds=0.3)
    for thread in (holder, first, second):
        thread.join()
    assert at(log, "first window", "out") <= at(log, "second window", "in")


def test_a_large_reservation_is_not_starved_by_small_ones(path):
    log = []
    small = hold_in_thread(path, log, "small-0", 3)
    large = hold_in_thread(path, log, "large", 9)
    # queued after the large one, and each fits beside the first small one: they must wait
    others = [hold_in_thread(path, log, f"small-{i}", 3) for i in range(1, 4)]
    for thread in (small, large, *others):
        thread.join()
    for i in range(1, 4):
        assert at(log, f"small-{i}", "in") >= at(log, "large", "out")


def test_a_reservation_larger_than_the_gpu_runs_alone(path):
    log = []
    small = hold_in_thread(path, log, "small", 1)
    huge = hold_in_thread(path, log, "huge", 50)
    small.join()
    huge.join()
    assert at(log, "huge", "in") >= at(log, "small", "out")


def test_a_window_lets_its_own_calls_in(path):
    ledger = GpuLedger(path, 10)
    with ledger.window(8, "timing"):
        started = time.monotonic()
        with ledger.reserve(8, "the timed call"):  # would wait forever behind the window otherwise
            with ledger.alone("nested"):
                pass
        assert time.monotonic() - started < 1
    assert ledger.holders() == {}


def test_a_dead_process_holds_nothing(path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path.write_text(json.dumps({"holders": {"gone": {"pid": dead.pid, "bytes": 10, "kind": "alone", "what": "x",
                                                      "since": 0}},
                                "waiting": {"gone2": {"pid": dead.pid, "bytes": 10, "kind": "window", "what": "y",
                                                      "since": 0}}}))
    ledger = GpuLedger(path, 10)
    started = time.monotonic()
    with ledger.reserve(10, "after a killed worker"):
        assert time.monotonic() - started < 1


def test_capacity_leaves_room_for_the_processes_and_never_drops_below_a_quarter():
    assert capacity_bytes(80 * GIB, 1) == int(0.9 * 80 * GIB) - 3 * GIB // 2
    assert capacity_bytes(80 * GIB, 16) == int(0.9 * 80 * GIB) - 24 * GIB
    assert capacity_bytes(80 * GIB, 64) == 20 * GIB


# -- windows pause the runners of the reservations they share the GPU with ---------------------

@pytest.fixture
def busy_runner():
    """A process in a group of its own, spinning as a compiling runner does, named as a runner is
    named to the ledger (watchdog.runner_identity)."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    yield process, runner_identity(process, None)
    process.kill()
    process.wait()


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_window_pauses_a_compiling_runner_instead_of_waiting_for_it(path, busy_runner):
    process, runner = busy_runner
    log = []
    holder = hold_in_thread(path, log, "compiling", 2, seconds=3.0, runner=runner, holding=True)
    ledger = GpuLedger(path, 10)
    started = time.monotonic()
    with ledger.window(4, "timing") as window:
        assert time.monotonic() - started < 1.0  # not the holder's 3 s
        assert window["paused"] == 1
        time.sleep(0.3)
        assert state_of(process.pid) == "T"  # stopped
        [entry] = [h for h in ledger.holders().values() if h["what"] == "compiling"]
        assert entry["paused_since"]
    assert state_of(process.pid) in "RS"  # running again
    holder.join()
    assert at(log, "compiling", "out") - at(log, "compiling", "in") >= 3.0


def test_a_reservation_learns_how_long_it_was_paused(path, busy_runner):
    _, runner = busy_runner
    ledger = GpuLedger(path, 10)
    with ledger.reserve(2, "compiling", runner=runner) as holding:
        assert holding.paused_s() == 0.0
        window_ledger = GpuLedger(path, 10)

        def window():
            with window_ledger.window(1, "timing"):
                time.sleep(0.5)

        other = threading.Thread(target=window)
        other.start()
        other.join()
        assert 0.45 <= holding.paused_s() < 1.5


def test_a_window_waits_for_work_that_cannot_be_paused(path):
    log = []
    oracle = hold_in_thread(path, log, "oracle", 2, seconds=0.5)  # a worker's own: no runner to pause
    window = hold_in_thread(path, log, "window", window=2, seconds=0.1)
    later = hold_in_thread(path, log, "later oracle", 1, seconds=0.1)  # waits for the window, not beside it
    for thread in (oracle, window, later):
        thread.join()
    assert at(log, "window", "in") >= at(log, "oracle", "out")
    assert at(log, "later oracle", "in") >= at(log, "window", "out")


def test_a_window_waits_for_room_for_its_calls_and_keeps_it(path, busy_runner):
    _, runner = busy_runner
    log = []
    big = hold_in_thread(path, log, "big", 8, seconds=0.6, runner=runner, holding=True)  # paused, keeps its 8 of 10
    window = hold_in_thread(path, log, "window", window=4, seconds=0.1)
    small = hold_in_thread(path, log, "small", 2, seconds=0.1, runner=runner)  # fits beside big, not the window
    for thread in (big, window, small):
        thread.join()
    assert at(log, "window", "in") >= at(log, "big", "out")
    assert at(log, "small", "in") >= at(log, "big", "out")  # it would have taken the window's room


def test_the_runners_a_dead_window_paused_run_again(path, busy_runner):
    process, runner = busy_runner
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.kill(process.pid, signal.SIGSTOP)  # what the window did before its worker was killed
    path.write_text(json.dumps({"holders": {
        "window": {"pid": dead.pid, "bytes": 1, "kind": "window", "what": "timing", "since": 0, "paused": ["r"]},
        "r": {"pid": os.getpid(), "bytes": 1, "kind": "shared", "what": "compiling", "since": 0, "runner": runner,
              "paused_since": time.time() - 2}}, "waiting": {}}))
    holders = GpuLedger(path, 10).holders()
    assert "window" not in holders and holders["r"]["paused_s"] >= 2
    time.sleep(0.1)
    assert state_of(process.pid) in "RS"
