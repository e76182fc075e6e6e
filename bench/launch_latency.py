"""Does a timed thread get a core when it wants one? Launch-like bursts on a CPU kept busy.

    python bench/launch_latency.py [HOGS]        # as root; HOGS busy processes at nice 0 (default 2 per core)

A timing window's launching thread does short bursts of CPU work (one kernel launch each) for the
length of a stretch, then waits for the GPU. This thread does the same: stretches of 36 bursts of
50 us of CPU, 2 ms apart, while HOGS processes spin at nice 0. For each way of raising it (none; nice
-10, the grader's TIMED_NICE before; SCHED_RR 1, watchdog.TIMED_POLICY) it prints a stretch's wall
time over its CPU time, median, 90th percentile and worst, and how many stretches ran over 1.2x
their CPU time: a thread that waited for a core. Nothing here needs a GPU; the kernel's scheduler
is the subject (notes/grading-speed.md, "the reference's slow stretches: a thread waiting for a core").
"""
import multiprocessing
import os
import statistics
import sys
import time

BURSTS, BURST_S, PAUSE_S, ROUNDS = 36, 50e-6, 2e-3, 400


def hog():
    while True:
        pass


def stretch() -> float:
    """One stretch's wall time over its CPU time."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(BURSTS):
        start = time.thread_time()
        while time.thread_time() - start < BURST_S:
            pass
    return (time.perf_counter() - wall) / (time.thread_time() - cpu)


def measure(how: str) -> str:
    if how == "nice -10":
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    elif how == "SCHED_RR":
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    ratios = []
    for _ in range(ROUNDS):
        ratios.append(stretch())
        time.sleep(PAUSE_S)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, 0, 0)
    ratios.sort()
    return (f"{how:9s} wall/CPU median {statistics.median(ratios):.2f}, 90th percentile "
            f"{ratios[int(0.9 * len(ratios))]:.2f}, worst {ratios[-1]:.2f}; over 1.2x in "
            f"{sum(r > 1.2 for r in ratios)} of {len(ratios)} stretches")


def main() -> int:
    hogs = int(sys.argv[1]) if len(sys.argv) > 1 else 2 * os.cpu_count()
    spinning = [multiprocessing.Process(target=hog, daemon=True) for _ in range(hogs)]
    for process in spinning:
        process.start()
    print(f"{os.cpu_count()} cores, {hogs} busy processes at nice 0, kernel {os.uname().release}", flush=True)
    time.sleep(0.5)
    for how in ("plain", "nice -10", "SCHED_RR", "nice -10", "SCHED_RR"):
        print(measure(how), flush=True)
    for process in spinning:
        process.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
