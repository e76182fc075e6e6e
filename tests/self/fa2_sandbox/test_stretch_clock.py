"""The reference's own record of a timed stretch (fa2_sandbox/runner/stretch_clock.py) tells a
stretch the CPU bounded from one whose launching thread waited."""
import time

from fa2_sandbox.runner.stretch_clock import StretchClock


def spin(seconds):
    """Burn this thread's CPU for `seconds` (its own CPU time, not the wall clock: on a loaded
    machine a wall-clock spin is partly waiting, and reads as less CPU than time)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_stretch_whose_launches_ran_on_the_cpu_reads_as_cpu_bound():
    clock = StretchClock("cpu")
    spin(0.05)  # two passes' launches, all CPU
    clock.launched()
    time.sleep(0.02)  # the synchronize: waiting, no CPU
    clock.synchronized(2)
    [s] = clock.stretches
    assert s["passes"] == 2 and s["gpu_ms"] is None
    assert 24.9 <= s["cpu_ms"] <= 27 and s["enqueue_ms"] >= s["cpu_ms"] - 0.1  # per pass: 25 ms launching,
    assert s["own_ms"] >= s["enqueue_ms"] + 9.5                                   # then 10 ms waiting


def test_a_launching_thread_that_waited_shows_less_cpu_than_time():
    clock = StretchClock("cpu")
    time.sleep(0.04)  # the thread off its core
    clock.launched()
    clock.synchronized(4)
    time.sleep(0.01)
    clock.launched()
    clock.synchronized(6)
    first, second = clock.stretches
    assert first["passes"] == 4 and first["cpu_ms"] < 0.2 * first["enqueue_ms"]
    assert second["passes"] == 2 and second["own_ms"] >= 4


def test_a_stretch_with_no_pass_adds_nothing():
    clock = StretchClock("cpu")
    clock.synchronized(0)
    assert clock.stretches == []
