"""A running runner's output and memory, watched from the grader, and how a runner is killed.

The runner's stdout and stderr go through a pipe into an OutputTail, a bounded in-memory tail
(the last LOG_KEEP_BYTES and a count of the rest), so a submission that prints gigabytes costs
neither disk nor memory.

A Watchdog is one thread per runner process: it drains that pipe into the tail and, while the
runner lives, adds up the memory of all its processes (every process of its uid, or of its
process group and its PID namespace without a uid of its own): 4 times a second during a call, every 5 s when idle.
Over the runner's memory limit it kills the runner and says why in `killed_for`, which the
harness reports as the call's failure.

kill_runner kills the runner's whole process group and, with a uid of its own, every process of
that uid, or in a PID namespace of its own (sandbox mode "userns"), every process in it, so
setsid'd and double-forked children die too.
"""
import contextlib
import os
import select
import signal
import threading
import time
from typing import NamedTuple

from fa2_sandbox.harness import confinement

LOG_KEEP_BYTES = 1 << 16  # what the runner's output tail holds in memory


def gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


class OutputTail:
    """The last LOG_KEEP_BYTES of a runner's stdout and stderr, and how much came in all."""

    def __init__(self):
        self.data = bytearray()
        self.total = 0
        self.lock = threading.Lock()

    def write(self, chunk: bytes) -> None:
        with self.lock:
            self.total += len(chunk)
            self.data += chunk
            if len(self.data) > LOG_KEEP_BYTES:
                del self.data[:len(self.data) - LOG_KEEP_BYTES]

    def tail(self, limit: int) -> str:
        with self.lock:
            kept = bytes(self.data[-limit:])
            dropped = self.total - len(kept)
        text = kept.decode(errors="replace")
        if dropped:
            text = f"[... {dropped:,} earlier bytes of output not kept ...]\n" + text
        return text


def kill_runner(process, uid: int | None) -> None:
    """SIGKILL the runner and anything it spawned, including what left its process group."""
    pidns = confinement.pid_namespace(process.pid)  # sandbox mode "userns": read while the launcher lives
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the runner and anything it spawned
    except (ProcessLookupError, PermissionError):
        pass
    if pidns is not None:
        confinement.kill_pidns(pidns)  # what left the group, in the runner's PID namespace (never by uid: the grader's)
    if uid is not None:
        confinement.kill_uid(uid)  # and what left the group (setsid, double fork)


def runner_identity(process, uid: int | None) -> dict:
    """What names a runner's processes for another process of the grader (a timing window pauses
    them, gpu_ledger.py): its process group, its uid if it has its own, its PID namespace if any."""
    return {"pgid": process.pid, "uid": uid, "pidns": confinement.pid_namespace(process.pid)}


def runner_pids(identity: dict) -> list:
    """Every process of the runner `identity` names: of its uid, or of its group and PID namespace."""
    if identity.get("uid") is not None:
        return confinement.processes(uid=identity["uid"])
    return confinement.processes(pgid=identity["pgid"], pidns=identity.get("pidns"))


def signal_runner(identity: dict, sig: int) -> None:
    """Send `sig` (SIGSTOP, SIGCONT) to every process of a runner; one that has ended is skipped."""
    for pid in runner_pids(identity):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


# How a timing window puts the threads it times ahead of the others: round-robin real time at the
# lowest priority, so no thread of the ordinary class holds a core that one of them wants. nice alone
# (TIMED_NICE, about ten times the CPU share of each other process) still let a launching thread wait
# out another's slice: in a class run, most of the reference's slow stretches had launches that took
# far longer than their CPU time ("a thread waiting for a core"), and on a busy CPU launch-like bursts
# at that nice overran their CPU time several times in every few dozen stretches, under SCHED_RR never
# (notes/grading-speed.md, "the reference's slow stretches: a thread waiting for a core").
# SCHED_RESET_ON_FORK: what a timed thread starts in the window is an ordinary thread, so a submission
# cannot spread real-time threads; the kernel's real-time throttling (sched_rt_runtime_us) leaves the
# ordinary class a share of every core all the same, and a window lasts seconds (timed_window.WINDOW_S).
# Where real time is refused, nice alone is not enough either: with Linux's autogroups
# (/proc/sys/kernel/sched_autogroup_enabled, on in many kernels, the Firecracker guests' among them)
# the scheduler shares the CPU between sessions first and by nice only within one, and every runner
# is a session of its own (setsid). A timed thread at TIMED_NICE then still waited behind every other runner's session;
# the session's autogroup at TIMED_NICE put it ahead (bench/session_priority.py; notes/grading-speed.md,
# "Nice orders threads within a session only"). So the timed runners' sessions are raised too, never
# the grader's own (its terminal's session, every worker's).
TIMED_POLICY = os.SCHED_RR | os.SCHED_RESET_ON_FORK
TIMED_NICE = -10  # where real time is refused (a grader that is not root, a container without it)


class Raised(NamedTuple):
    threads: int  # raised at all
    real_time: int  # of them, under TIMED_POLICY (the others at TIMED_NICE)
    refused: str = ""  # why real time was refused, the first such error: "" where none was
    sessions: int = 0  # the runners' sessions (autogroups) raised to TIMED_NICE


class Before(NamedTuple):
    """A raised thread's place before, to put it back, and whether it was raised into real time."""
    policy: int
    param: os.sched_param
    nice: int
    real_time: bool


def _raise(tid: int, refusals: list) -> "Before | None":
    """Put thread `tid` ahead of the others; None if it could not be raised (ended meanwhile, or not
    ours to raise). Why real time was refused goes into `refusals`."""
    try:
        policy, param, nice = os.sched_getscheduler(tid), os.sched_getparam(tid), os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        return None
    try:
        os.sched_setscheduler(tid, TIMED_POLICY, os.sched_param(1))
        return Before(policy, param, nice, True)
    except OSError as exc:  # a device's every window fell back to nice, cause unknown: now it is recorded
        refusals.append(str(exc))
    try:
        os.setpriority(os.PRIO_PROCESS, tid, TIMED_NICE)
        return Before(policy, param, nice, False)
    except OSError:
        return None


def _put_back(tid: int, before: Before) -> None:
    """Each part on its own: a thread left at TIMED_NICE because its policy could not be set back
    would stay ahead of the others after the window."""
    if before.real_time:
        try:
            os.sched_setscheduler(tid, before.policy, before.param)
        except OSError:
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, before.nice)
    except OSError:
        pass


@contextlib.contextmanager
def ahead_of_the_others(pids: list):
    """For the block, every thread of the processes `pids` runs ahead of the others (TIMED_POLICY, or
    TIMED_NICE where real time is refused), and so do their sessions' autogroups, the grader's own
    session apart; yields how many threads and sessions were raised (Raised: none where this user may
    raise none, as only root may). A timing window pauses the other runners' GPU calls,
    not their CPU work: with a runner per core keeping every core busy, a timed runner that waited for
    a core between two launches read several times its own time, while SDPA, timed on the GPU by
    events, read its idle time (notes/grading-speed.md, "Ratios, the Triton budget")."""
    before, refusals, sessions = {}, [], {}  # sessions: autogroup name -> (its nice before, its pids)
    own = (_autogroup("self") or (None, 0))[0]
    for pid in pids:
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in threads:
            if (old := _raise(tid, refusals)) is not None:
                before[tid] = old
        if (group := _autogroup(pid)) is None or group[0] == own:
            continue
        if group[0] in sessions:
            sessions[group[0]][1].append(pid)
        elif _set_autogroup(pid, TIMED_NICE):
            sessions[group[0]] = (group[1], [pid])
    try:
        yield Raised(len(before), sum(1 for old in before.values() if old.real_time), next(iter(refusals), ""),
                     len(sessions))
    finally:
        for tid, old in before.items():
            _put_back(tid, old)
        for nice, members in sessions.values():
            any(_set_autogroup(pid, nice) for pid in members)  # through the first still alive


def _autogroup(pid) -> "tuple[str, int] | None":
    """(name, nice) of the autogroup of process `pid` ("self": this one); None without autogroups."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _set_autogroup(pid, nice: int) -> bool:
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
        return True
    except OSError:  # gone meanwhile, or not ours to raise
        return False


class Watchdog:
    """The thread that watches one runner process, from start() until stop(). It owns `log_fd`,
    the read end of the runner's output pipe, and closes it when it ends."""

    def __init__(self, process, log_fd: int, output: OutputTail, memory_limit: int, uid: int | None, name: str):
        self.process = process
        self.log_fd = log_fd
        self.output = output
        self.memory_limit = memory_limit  # bytes for all the runner's processes; 0: no limit
        self.uid = uid
        self.busy = False  # a call (or the import) is under way: memory is checked more often
        self.killed_for = None  # why the watchdog killed the runner, if it did
        self._stopping = threading.Event()
        self._reading = threading.Lock()  # this thread and catch_up() both read the pipe
        self._closed = False
        self._thread = threading.Thread(target=self._watch, daemon=True, name=name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Once the runner is dead: drain what is left of its output, for a second at most, and end."""
        self._stopping.set()
        self._thread.join(timeout=2)

    def catch_up(self, within: float = 1.0) -> None:
        """Read, in the caller's thread, what the runner has written so far. A runner prints, then
        sends its reply on another pipe: the reply can arrive before this thread has read the
        print, and a log tail taken then would miss it. Bounded by `within` seconds, for a runner
        that keeps writing."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and self._read_available() == "read":
            pass

    def _read_available(self) -> str:
        """"read" (a chunk went into the tail), "none" (nothing to read now) or "ended" (end of file)."""
        with self._reading:
            if self._closed or not select.select([self.log_fd], [], [], 0)[0]:
                return "none"
            chunk = os.read(self.log_fd, 1 << 16)
            if not chunk:
                return "ended"
            self.output.write(chunk)
            return "read"

    def _watch(self) -> None:
        """Drain the runner's output into the tail; kill it if its processes outgrow the memory limit."""
        last_check, stop_by = 0.0, None
        try:
            while stop_by is None or time.monotonic() < stop_by:
                ready, _, _ = select.select([self.log_fd], [], [], 0.25)
                if ready and self._read_available() == "ended":
                    break
                if self._stopping.is_set():  # drain what is left, for a second at most
                    if not ready:
                        break
                    stop_by = stop_by or time.monotonic() + 1.0
                    continue
                now = time.monotonic()  # memory: 4 times a second during a call, every 5 s when idle
                due = now - last_check > (0.25 if self.busy else 5.0)
                if self.memory_limit and due and self.process.poll() is None:
                    last_check = now
                    used = confinement.rss_bytes(self._pids())
                    if used > self.memory_limit:
                        self.killed_for = (f"its processes held {gib(used)}, over the runner's limit of "
                                           f"{gib(self.memory_limit)}")
                        kill_runner(self.process, self.uid)
        finally:
            with self._reading:
                self._closed = True
                os.close(self.log_fd)

    def _pids(self) -> list:
        return runner_pids(runner_identity(self.process, self.uid))
