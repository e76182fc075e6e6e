"""What a thread's nice buys against busy sessions, and what its session's autogroup's nice buys.

    python bench/session_priority.py [--busy 6] [--rounds 400]

A timing window raises the threads it times (fa2_sandbox/harness/watchdog.py ahead_of_the_others).
Every runner is a session of its own, and with Linux's autogroups on
(/proc/sys/kernel/sched_autogroup_enabled) the scheduler shares the CPU between sessions before it
looks at a thread's nice. This starts `--busy` sessions that spin, then, in a session of its own
each time, a probe that does what a launching thread does between two launches: sleeps 2 ms, then
works for about a millisecond, `--rounds` times. It prints the probe's round (ms: median, 90th
percentile, longest) with nothing raised, its threads at TIMED_NICE, its session's autogroup at
TIMED_NICE, and both. Needs root (a negative nice) and a machine with fewer cores than `--busy`.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fa2_sandbox.harness.watchdog import TIMED_NICE  # noqa: E402

PROBE = """
import time
rounds = []
for _ in range({rounds}):
    started = time.perf_counter()
    time.sleep(0.002)
    x = 0
    for j in range(20000):
        x += j
    rounds.append((time.perf_counter() - started) * 1000)
rounds.sort()
print(f"{{rounds[len(rounds) // 2]:.2f}} {{rounds[int(len(rounds) * 0.9)]:.2f}} {{rounds[-1]:.2f}}")
"""


def probe(raise_threads: bool, raise_session: bool, rounds: int) -> str:
    process = subprocess.Popen([sys.executable, "-c", PROBE.format(rounds=rounds)], start_new_session=True,
                               stdout=subprocess.PIPE, text=True)
    if raise_threads:
        for tid in os.listdir(f"/proc/{process.pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), TIMED_NICE)
    if raise_session:
        with open(f"/proc/{process.pid}/autogroup", "w") as f:
            f.write(str(TIMED_NICE))
    return process.communicate()[0].strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args(argv)
    with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
        print(f"autogroups on: {f.read().strip() == '1'}; {os.cpu_count()} cores; {args.busy} busy sessions")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(args.busy)]
    try:
        print("| raised | median ms | 90th percentile ms | longest ms |\n|---|---|---|---|")
        for label, threads, session in (("nothing", False, False), (f"threads at nice {TIMED_NICE}", True, False),
                                        (f"session at nice {TIMED_NICE}", False, True), ("both", True, True)):
            print(f"| {label} | " + " | ".join(probe(threads, session, args.rounds).split()) + " |")
    finally:
        for process in busy:
            process.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
