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
second before it exits is lost), and "other_commands" the command lines of those of no known role.
Both come from `processes`, a ProcessLedger of every process seen (its parent, role, CPU and the
children it reaped unseen), which bench/cpu_account.py turns into each submission's account.
"""
import os
import shutil
import subprocess
import threading
import time


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
RUNNER, COMPILE_WORKERS, RANKS = "runner (student code)", "torch.compile workers", "distributed ranks"
WORKER, CONTROLLER, COMPILERS = "grader workers", "grader controller", "compilers (ptxas, gcc, ld)"
FORK_SERVER = "fork servers"
ROLES = (
    (RUNNER, ("fa2_sandbox.runner.serve",)),
    (COMPILE_WORKERS, ("compile_worker",)),
    (RANKS, ("multiprocessing", "spawn_main", "torch.distributed")),
    (WORKER, ("execnet", "xdist", "import sys;exec(eval(")),
    (CONTROLLER, ("pytest",)),
    (COMPILERS, ("ptxas", "cc1", "gcc", "/ld", "collect2", "cicc")),
    ("nvidia-smi", ("nvidia-smi",)),
)


# Processes of the fork server (fa2_sandbox/runner/fork_server.py) share its command line: they
# are told apart by the name each gives itself.
FORKED = {"fa2-runner": RUNNER, "fa2-forkserver": FORK_SERVER}


def read_stat(pid: str):
    """(ppid, own core-seconds, reaped children's core-seconds, start time in ticks, comm) or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; fields[0] is the state
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks, (int(fields[13]) + int(fields[14])) / ticks,
            int(fields[19]), stat[stat.index("(") + 1:stat.rindex(")")])


class ProcessLedger:
    """Every process's CPU between samples, kept by (pid, start time) so a reused pid is another."""

    def __init__(self):
        self.procs = {}  # key -> {"pid", "ppid", "role", "cpu", "last", "reaped", "worker", "runner", "deltas"}
        self.first = True

    def sample(self, wall: float, snapshot: dict) -> None:
        """snapshot: {pid: (stat tuple, role[, command line])} of every process now (process_cpu)."""
        live = {}
        for pid, (stat, role, *command) in snapshot.items():
            ppid, own, reaped, started, _ = stat
            key = (pid, started)
            p = self.procs.get(key)
            if p is None:
                p = self.procs[key] = {"pid": pid, "ppid": ppid, "role": role, "cpu": 0.0, "short_lived": 0.0,
                                       "last": own if self.first else 0.0, "reaped": reaped if self.first else 0.0,
                                       "deltas": [], "alive": True}
            if not role.startswith("other (") or p["role"].startswith("other ("):
                p["role"] = role  # kept once known: an exiting process's command line reads empty
                unknown = role.startswith("other (")
                p["command"] = ((command[0] if command else "") or role) if unknown else None
            delta = max(0.0, own - p["last"])
            p["cpu"] += delta
            p["last"] = own
            if delta:
                p["deltas"].append((wall, delta))
            p["reaped_delta"] = max(0.0, reaped - p["reaped"])
            p["reaped"] = reaped
            live[key] = p
        by_pid = {p["pid"]: p for p in live.values()}
        gone = {p["pid"]: p for key, p in self.procs.items() if p["alive"] and key not in live}
        for p in gone.values():
            p["alive"] = False
            # What was seen of it comes back as the reaped time of its nearest ancestor still here:
            # its parent's, or, where the parent went in the same second, the grandparent's.
            parent = by_pid.get(self._root_ppid(p, gone))
            if parent is not None:
                parent["reaped_delta"] = parent.get("reaped_delta", 0.0) - p["last"] - p["reaped"]
        for p in live.values():
            unseen = max(0.0, p.pop("reaped_delta", 0.0))
            if unseen and not self.first:
                p["short_lived"] += unseen
                p["deltas"].append((wall, unseen))
            if "ancestry" not in p:  # who it belongs to, found while its parents live
                p["ancestry"] = self._ancestry(p, by_pid)
        self.first = False

    def by(self, key: str, at_least: float) -> dict:
        """Core-seconds of the processes' own CPU by their "role" or their "command" (kept for the
        processes of no known role), the most first, those under `at_least` left out."""
        totals = {}
        for p in self.procs.values():
            if p.get(key):
                totals[p[key]] = totals.get(p[key], 0.0) + p["cpu"]
        return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v >= at_least}

    @staticmethod
    def _root_ppid(p: dict, gone: dict) -> int:
        """The parent pid of the topmost of `p`'s ancestors that went in the same second."""
        node, hops = p, 0
        while node["ppid"] in gone and hops < 64:
            node, hops = gone[node["ppid"]], hops + 1
        return node["ppid"]

    @staticmethod
    def _ancestry(p: dict, by_pid: dict) -> dict:
        """The runners at or above this process (nearest first: in sandbox mode "userns" the pid the
        harness knows, and whose profile is logged, is the launcher's, two above the runner), and
        the nearest grader worker."""
        found, seen, node = {"runners": []}, set(), p
        while node is not None and node["pid"] not in seen:
            seen.add(node["pid"])
            if node["role"] == RUNNER:
                found["runners"].append(node["pid"])
            if node["role"] == WORKER and "worker" not in found:
                found["worker"] = node["pid"]
            if node["role"] in (WORKER, RUNNER, CONTROLLER):
                found["run"] = True
            node = by_pid.get(node["ppid"])
        return found


def process_cpu():
    """{pid: ((ppid, own core-seconds, reaped children's core-seconds, start ticks, comm), role,
    command line)} of every process now, or {} without /proc."""
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
        found[int(pid)] = (stat, role, command[:120])
    return found


CPU_IDLE = 0.10  # a sample period in which less than this share of the cores was busy
IDLE_GAP_S = 2.0  # both-idle stretches shorter than this are not listed


class Utilization:
    def __init__(self, period: float = 1.0):
        self.period = period
        self.samples = []  # (monotonic time, cpu_times(), gpu_utilization())
        self.processes = ProcessLedger()  # every process's CPU: the roles below, and bench/cpu_account.py
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        self.samples.append((time.monotonic(), cpu_times(), gpu_utilization()))
        self.processes.sample(time.time(), process_cpu())

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
                "cpu_by_role": self.processes.by("role", at_least=0.5),
                "other_commands": dict(list(self.processes.by("command", at_least=1.0).items())[:10])}

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
