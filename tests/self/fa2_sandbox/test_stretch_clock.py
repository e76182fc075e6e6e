"""The reference's own record of a timed stretch (fa2_sandbox/runner/stretch_clock.py) tells a
stretch the CPU bounded from one whose launching thread waited."""
import time

from fa2_sandbox.runner.stretch_clock import StretchClock


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_stretch_whose_launches_ran_on_the_cpu_reads_as_cpu_bound():
    clock = StretchClock("cpu")
    spin(0.05)  # two passes' launches, all CPU
    clock.launched()
    time.sleep(0.02)  # the synchronize: waiting, no CPU
    clock.synchronized(2)
    [s] = clock.stretches
    assert s["passes"] == 2 and s["gpu_ms"] is None
    assert 24 <= s["enqueue_ms"] <= 40 and 34 <= s["own_ms"] <= 60  # per pass: 25 ms launching, 10 waiting
    assert s["cpu_ms"] >= 0.8 * s["enqueue_ms"]


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
