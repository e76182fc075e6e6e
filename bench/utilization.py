"""How busy the machine's CPUs and GPUs were during a run, sampled every second.

    with Utilization() as use:
        run_the_grader()
    use.summary()  # {"seconds": S, "cpus": C, "cpu_busy": a share, "gpu_busy_s": [S0, S1],
                   #  "gpu_memory_max_gib": [G0, G1], "both_idle": [[start, seconds], ...], "cpu_by_role": {...}}

CPU: the share of all cores' time not idle, from /proc/stat's first line between the first and
the last sample (Linux only; None elsewhere). GPU: nvidia-smi's utilization.gpu (the share of its
last sample period in which a kernel ran) integrated over the samples, per GPU, in seconds, and
the most memory.used any sample saw (every process's, the grader's own included); [] without
nvidia-smi. "both_idle": the stretches in which neither the CPUs nor any GPU worked. A grading
run that keeps the CPUs busy and a GPU busy a third of the time is CPU-bound: a second GPU cannot
speed it up much (notes/grading-speed.md, "The class is CPU-bound").

"cpu_by_role": where the CPU went, in core-seconds, by what each process is (ROLES, from its
command line; /proc/<pid>/stat's utime + stime, summed between samples, so a process's last
second before it exits is lost).
"""
import os
import shutil
import subprocess
import threading
import time

from bench.cpu_account import ProcessLedger, read_stat


def cpu_times():
    """(busy, total) jiffies over every core since boot, or None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def gpu_utilization():
    """Each GPU's (utilization.gpu in percent, memory.used in MiB), or [] without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return [tuple(float(x) for x in line.split(",")) for line in out.strip().splitlines()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


# What a process is, from its command line: the first role whose words it holds.
ROLES = (
    ("runner (student code)", ("fa2_sandbox.runner.serve",)),
    ("torch.compile workers", ("compile_worker",)),
    ("distributed ranks", ("multiprocessing", "spawn_main", "torch.distributed")),
    ("grader workers", ("execnet", "xdist", "import sys;exec(eval(")),
    ("grader controller", ("pytest",)),
    ("compilers (ptxas, gcc, ld)", ("ptxas", "cc1", "gcc", "/ld", "collect2", "cicc")),
    ("nvidia-smi", ("nvidia-smi",)),
)


# Processes of the fork server (fa2_sandbox/runner/fork_server.py) share its command line: they
# are told apart by the name each gives itself.
FORKED = {"fa2-runner": "runner (student code)", "fa2-forkserver": "fork servers"}


def process_cpu():
    """{pid: ((ppid, own core-seconds, reaped children's core-seconds, start ticks, comm), role)} of
    every process now, or {} without /proc."""
    found = {}
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        stat = read_stat(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if stat is None:
            continue
        role = FORKED.get(stat[4]) or next((name for name, words in ROLES if any(w in command for w in words)),
                                           f"other ({stat[4]})")
        found[int(pid)] = (stat, role)
        if role.startswith("other ("):
            COMMANDS[int(pid)] = command[:120]
    return found


COMMANDS = {}  # pid -> command line, of the processes of no known role (what "other" holds)


CPU_IDLE = 0.10  # a sample period in which less than this share of the cores was busy
IDLE_GAP_S = 2.0  # both-idle stretches shorter than this are not listed


class Utilization:
    def __init__(self, period: float = 1.0):
        self.period = period
        self.samples = []  # (monotonic time, cpu_times(), gpu_utilization())
        self.by_role = {}  # role -> core-seconds
        self.by_command = {}  # command line -> core-seconds, of the processes of no known role
        self._seen = {}  # pid -> (core-seconds at the last sample, role)
        self.processes = ProcessLedger()  # every process's CPU, for bench/cpu_account.py's account
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        self.samples.append((time.monotonic(), cpu_times(), gpu_utilization()))
        now = process_cpu()
        for pid, (stat, role) in now.items():
            seconds = stat[1]
            before = self._seen.get(pid)
            # a pid first seen counts from 0 unless it was there at the start (then from its first sample)
            start = before[0] if before is not None else (seconds if len(self.samples) == 1 else 0.0)
            self.by_role[role] = self.by_role.get(role, 0.0) + max(0.0, seconds - start)
            if role.startswith("other (") and pid in COMMANDS:
                command = COMMANDS[pid] or role
                self.by_command[command] = self.by_command.get(command, 0.0) + max(0.0, seconds - start)
        self._seen = {pid: (stat[1], role) for pid, (stat, role) in now.items()}
        self.processes.sample(time.time(), now)

    def _run(self):
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def summary(self) -> dict:
        first, last = self.samples[0], self.samples[-1]
        cpu_busy = None
        if first[1] and last[1] and last[1][1] > first[1][1]:
            cpu_busy = round((last[1][0] - first[1][0]) / (last[1][1] - first[1][1]), 3)
        gpus = min((len(s[2]) for s in self.samples), default=0)
        busy = [0.0] * gpus
        for (t0, _, u0), (t1, _, u1) in zip(self.samples, self.samples[1:]):  # the trapezoid rule
            for i in range(gpus):
                busy[i] += (u0[i][0] + u1[i][0]) / 200 * (t1 - t0)
        memory = [max(s[2][i][1] for s in self.samples) / 1024 for i in range(gpus)]
        busy_core_s = None
        if first[1] and last[1]:
            busy_core_s = (last[1][0] - first[1][0]) / os.sysconf("SC_CLK_TCK")
        return {"seconds": round(last[0] - first[0], 1), "cpus": os.cpu_count(), "cpu_busy": cpu_busy,
                "busy_core_s": round(busy_core_s, 1) if busy_core_s is not None else None,
                "gpu_busy_s": [round(b, 1) for b in busy], "gpu_memory_max_gib": [round(m, 1) for m in memory],
                "both_idle": self.both_idle(),
                "cpu_by_role": {role: round(s, 1) for role, s in sorted(self.by_role.items(), key=lambda x: -x[1])
                                if s >= 0.5},
                "other_commands": {c: round(s, 1) for c, s in sorted(self.by_command.items(), key=lambda x: -x[1])[:10]
                                   if s >= 1.0}}

    def both_idle(self) -> list:
        """[start, seconds] of every stretch of at least IDLE_GAP_S, from the first sample, in
        which the CPUs were idle (under CPU_IDLE of the cores busy) and no GPU ran a kernel."""
        gaps, start = [], None
        t0 = self.samples[0][0]
        for (_, c0, _), (t1, c1, u1) in zip(self.samples, self.samples[1:]):
            cpu_idle = bool(c0 and c1 and c1[1] > c0[1] and (c1[0] - c0[0]) / (c1[1] - c0[1]) < CPU_IDLE)
            idle = cpu_idle and all(gpu[0] == 0 for gpu in u1)
            if idle and start is None:
                start = t1 - t0 - self.period
            elif not idle and start is not None:
                gaps.append([round(start, 1), round(t1 - t0 - self.period - start, 1)])
                start = None
        if start is not None:
            gaps.append([round(start, 1), round(self.samples[-1][0] - t0 - start, 1)])
        return [gap for gap in gaps if gap[1] >= IDLE_GAP_S]
