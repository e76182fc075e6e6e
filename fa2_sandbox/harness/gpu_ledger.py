"""Admission to a shared GPU: memory reservations, and timing windows that pause the others.

A class graded with `-n 16` on one GPU runs 16 workers, each with its runners, on one card. Left
alone they crowd it: in a class run the processes filled the card's memory, checks of correct
submissions were recorded as the students' out-of-memory crashes, and SDPA's own time for one case
varied many-fold with the neighbours' kernels (notes/grading-speed.md, "the corpus class on one
H100; GPU memory and time scheduled"). So GPU memory and GPU time are scheduled:

- Every runner call on a GPU first reserves what its case may need (client.py asks for
  `gpu_allowance_bytes`), and runs only when the ledger has room for it; the runner is held to that
  allowance (serve.py: torch.cuda.set_per_process_memory_fraction) and gives its cache back after
  each call. A worker's own GPU work (the float64 oracles) reserves too. Reservations queue in
  arrival order, so a large one is not starved by small ones.
- A timing window (`window`) has the GPU's time to itself without waiting for the others to
  finish: it pauses them. A reservation made for a runner names the runner's processes, and the
  window stops them (SIGSTOP) for its length and starts them again after (SIGCONT); their calls'
  deadlines are extended by the pause (`Holding.paused_s`, read by client.py). The window waits
  only for what cannot be paused (a worker's own oracle: short), for room for its own calls'
  memory (paused runners keep theirs) and for the kernels already in flight (`wait_for_idle_gpu`).
  A reservation spans a whole runner call, compiling and autotuning included, so a window that
  waited for every holder to finish starved: in a class run windows waited behind one student's
  compile while the GPU sat idle, and most timing checks never ran (issue 32; notes/grading-speed.md,
  "First try, and why it was wrong").
- `alone` takes the GPU when no one holds any of it, for a call that found the device full of
  others' memory: pausing frees no memory, so it waits for the holders to finish.
- Calls made inside a window or `alone` that this process holds (the timed calls) pass straight in.

The ledger is one JSON file per GPU that every process sharing the GPU reads and writes under an
exclusive flock: holders and the queue, each token -> pid, bytes, kind, the runner to pause, what,
since. A holder or waiter whose process is gone is dropped, so a killed worker never wedges the
GPU, and what a dead window paused is started again. What the ledger cannot see, each process's
CUDA context and a worker's cached oracles, is left out of its capacity (`capacity_bytes`); the
runner tells an allocation refused because the device was full from one refused at its own allowance,
and only the latter is the student's (client.py).
"""
import contextlib
import fcntl
import json
import os
import secrets
import signal
import tempfile
import threading
import time
from pathlib import Path

from fa2_sandbox.harness.watchdog import signal_runner

GIB = 1 << 30
# What each process on a GPU holds outside any reservation: its CUDA context, cuBLAS's workspace,
# loaded kernels and, in a worker, its cached oracles. A worker brings itself and its student's
# runner, and once it has graded a timing check the reference's runner too (test_timing.py keeps
# it): two per worker is an estimate, and the corpus class stayed well inside the card with it
# (notes/grading-speed.md, "timing windows pause the others", its GPU memory column).
CONTEXT_BYTES = 3 * GIB // 4
PROCESSES_PER_WORKER = 2
MIN_CAPACITY_SHARE = 0.25  # however many workers share it, reservations may use this much of a GPU
POLL_S = 0.2
SAY_EVERY_S = 30.0  # a wait longer than this says what it waits for (to `say`: the runner's log)
# The kinds of holding: a reservation shares the GPU; a window pauses the reservations' runners;
# "alone" waits until nothing else holds the GPU. Windows and "alone" exclude each other.
SHARED, WINDOW, ALONE = "shared", "window", "alone"


def capacity_bytes(total_bytes: int, workers_on_gpu: int) -> int:
    """What reservations may add up to on a GPU of `total_bytes` shared by `workers_on_gpu` workers:
    90% of it, less what their processes hold outside any reservation."""
    outside = workers_on_gpu * PROCESSES_PER_WORKER * CONTEXT_BYTES
    return max(int(0.9 * total_bytes) - outside, int(MIN_CAPACITY_SHARE * total_bytes))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


class Holding:
    """A reservation held: how long the window of another process has paused its runner so far
    (`paused_s`), which its caller adds to the call's deadline."""

    def __init__(self, ledger: "GpuLedger | None", token: str | None):
        self._ledger, self._token = ledger, token

    def paused_s(self) -> float:
        if self._ledger is None:
            return 0.0
        with self._ledger._state() as state:
            entry = state["holders"].get(self._token)
        return _paused_s(entry) if entry else 0.0


def _paused_s(entry: dict, now: float | None = None) -> float:
    ongoing = (now or time.time()) - entry["paused_since"] if entry.get("paused_since") else 0.0
    return entry.get("paused_s", 0.0) + ongoing


class GpuLedger:
    """One process's handle on the ledger of one GPU (`path`, shared), `capacity` bytes in all."""

    def __init__(self, path: Path, capacity: int):
        self.path = Path(path)
        self.capacity = int(capacity)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._own_windows = 0  # windows or "alone" this process holds (a worker's threads share them)
        self._lock = threading.Lock()

    # -- the file, under flock -------------------------------------------------------------
    @contextlib.contextmanager
    def _state(self):
        """The ledger's state, locked; written back when the block ends without an exception."""
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.seek(0)
                text = f.read()
                state = json.loads(text) if text.strip() else {}
                state.setdefault("holders", {})
                state.setdefault("waiting", {})
                for table in (state["holders"], state["waiting"]):
                    for token in [t for t, entry in table.items() if not _alive(entry["pid"])]:
                        _resume(state, table.pop(token))  # a window that died starts its paused runners again
                yield state
                f.seek(0)
                f.truncate()
                f.write(json.dumps(state))
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def holders(self) -> dict:
        with self._state() as state:
            return dict(state["holders"])

    # -- holding -------------------------------------------------------------------------
    def _admit(self, state: dict, token: str) -> bool:
        """Whether the queued `token` may hold the GPU now; if so it moves to the holders.

        Reservations are served in arrival order: one goes when it fits in what the holders and
        the reservations queued before it leave (a small call may pass a large one that it does
        not delay), or, first of them, when the GPU is empty, however large it is. While a window
        waits, the room its calls need comes first, and a reservation that cannot be paused (a
        worker's own) queued after it waits for it. Windows and "alone" go one at a time in arrival
        order: a window when what holds the GPU can all be paused, no reservation that cannot be
        paused is queued before it, and its calls' memory fits beside what holds the GPU;
        "alone" when nothing holds the GPU. Neither holds a place while it waits: one that did held
        the rest back and kept the GPU idle while the holders compiled (notes/grading-speed.md)."""
        holders, waiting = state["holders"], state["waiting"]
        if any(h["kind"] != SHARED for h in holders.values()):
            return False
        queue = sorted(waiting.items(), key=lambda item: item[1]["since"])
        entry = waiting[token]
        before = [queued for queued, _ in queue].index(token)
        held = sum(h["bytes"] for h in holders.values())
        windows = [(queued, e) for queued, e in queue if e["kind"] != SHARED]
        if entry["kind"] == ALONE:
            admitted = not holders and windows[0][0] == token
        elif entry["kind"] == WINDOW:
            pausable = all(h.get("runner") for h in holders.values())
            unpausable_first = any(e["kind"] == SHARED and not e.get("runner") for _, e in queue[:before])
            admitted = (windows[0][0] == token and pausable and not unpausable_first
                        and (entry["bytes"] <= self.capacity - held or not holders))
        else:
            waiting_window = next((e for _, e in windows if e["kind"] == WINDOW), None)
            if waiting_window is not None and not entry.get("runner") and waiting_window["since"] < entry["since"]:
                return False
            ahead = [e for _, e in queue[:before] if e["kind"] == SHARED]
            if waiting_window is not None:
                ahead.append(waiting_window)
            room = self.capacity - held - sum(e["bytes"] for e in ahead)
            admitted = entry["bytes"] <= room or (not holders and not ahead)
        if admitted:
            holders[token] = {**waiting.pop(token), "since": time.time()}
        return admitted

    def _hold(self, nbytes: int, kind: str, what: str, say, runner: dict | None = None) -> str:
        """Queue, then poll until admitted; the token the holding is known by."""
        token = secrets.token_hex(6)
        with self._state() as state:
            state["waiting"][token] = {"pid": os.getpid(), "bytes": int(nbytes), "kind": kind, "runner": runner,
                                       "what": what[:80], "since": time.time()}
        started = last_said = time.monotonic()
        try:
            while True:
                with self._state() as state:
                    if self._admit(state, token):
                        if kind == WINDOW:
                            _pause(state, token)
                        return token
                    held = sum(h["bytes"] for h in state["holders"].values()) / GIB
                    count, queued = len(state["holders"]), len(state["waiting"]) - 1
                now = time.monotonic()
                if say is not None and now - last_said >= SAY_EVERY_S:
                    last_said = now
                    say(f"[grader] waiting {now - started:.0f} s for the GPU ({what}): {count} holding "
                        f"{held:.1f} of {self.capacity / GIB:.1f} GiB, {queued} more queued")
                time.sleep(POLL_S)
        except BaseException:
            self._release(token)
            raise

    def _release(self, token: str) -> None:
        with self._state() as state:
            entry = state["holders"].pop(token, None) or state["waiting"].pop(token, None)
            if entry is not None:
                _resume(state, entry)

    # -- what callers use ------------------------------------------------------------------
    @contextlib.contextmanager
    def reserve(self, nbytes: int, what: str = "", say=None, runner: dict | None = None):
        """Hold `nbytes` of the GPU for the block (a reservation larger than the capacity waits for
        an empty GPU); `runner` names the processes a window may pause meanwhile (watchdog.py
        runner_identity), None for work that cannot be paused. Yields a Holding. Inside a window
        or "alone" this process holds, it passes straight in."""
        with self._lock:
            inside = self._own_windows > 0
        if inside:
            yield Holding(None, None)
            return
        token = self._hold(nbytes, SHARED, what, say, runner)
        try:
            yield Holding(self, token)
        finally:
            self._release(token)

    @contextlib.contextmanager
    def window(self, nbytes: int, what: str = "", say=None):
        """The GPU's time for the block, the other runners on it paused; `nbytes` of memory for the
        block's calls. Yields {"waited_s": seconds waited for it, "paused": reservations paused}, and
        adds "held_s" (seconds from its start to its release) when the block ends.
        Run `wait_for_idle_gpu` first inside: a paused process's kernels already queued still run."""
        with self._exclusive(nbytes, WINDOW, what, say) as held:
            yield held

    @contextlib.contextmanager
    def alone(self, what: str = "", say=None):
        """The whole GPU for the block, once nothing else holds any of it."""
        with self._exclusive(self.capacity, ALONE, what, say) as held:
            yield held

    @contextlib.contextmanager
    def _exclusive(self, nbytes: int, kind: str, what: str, say):
        """A window or "alone" for the block; one nested in another of this process passes in."""
        with self._lock:
            nested = self._own_windows > 0
            if nested:
                self._own_windows += 1
        started = time.monotonic()
        token = None if nested else self._hold(nbytes, kind, what, say)
        held = {"waited_s": time.monotonic() - started, "paused": 0}
        if not nested:
            with self._lock:
                self._own_windows += 1
            held["paused"] = len(self.holders().get(token, {}).get("paused") or [])
        admitted = time.monotonic()
        try:
            yield held
        finally:
            with self._lock:
                self._own_windows -= 1
            if token is not None:
                self._release(token)
            held["held_s"] = time.monotonic() - admitted  # how long the others stood paused


def _pause(state: dict, token: str) -> None:
    """Stop the runners of every reservation the window `token` shares the GPU with, under the
    ledger's lock (so none of them ends its call and releases in between), and note when."""
    window, now = state["holders"][token], time.time()
    window["paused"] = []
    for other, entry in state["holders"].items():
        if other != token and entry.get("runner"):
            signal_runner(entry["runner"], signal.SIGSTOP)
            entry["paused_since"] = now
            window["paused"].append(other)


def _resume(state: dict, window: dict) -> None:
    """Start again the runners that `window` (an entry just released or found dead) paused, and
    credit each reservation with the time it stood still."""
    now = time.time()
    for other in window.get("paused") or []:
        entry = state["holders"].get(other)
        if entry is None or not entry.get("paused_since"):
            continue
        signal_runner(entry["runner"], signal.SIGCONT)
        entry["paused_s"] = _paused_s(entry, now)
        entry["paused_since"] = None


def wait_for_idle_gpu(device: int, limit_s: float = 3.0) -> float:
    """Wait until the GPU runs no kernel (NVML's utilization reads 0: the kernels a paused process
    had queued have run), `limit_s` at most; the seconds waited. Without NVML (no nvidia-ml-py),
    a fixed half second."""
    import torch
    started = time.monotonic()
    try:
        while torch.cuda.utilization(device) > 0 and time.monotonic() - started < limit_s:
            time.sleep(0.02)
    except Exception:  # pynvml missing, or NVML cannot read this device
        time.sleep(0.5)
    return time.monotonic() - started


def ledger_path(gpu: int) -> Path:
    """Where the ledger of this host's GPU `gpu` lives: GRADER_GPU_LEDGER_DIR, or a folder of this
    user's under the temporary directory, shared by every grading run of the user on the host."""
    folder = os.environ.get("GRADER_GPU_LEDGER_DIR") or Path(tempfile.gettempdir()) / f"fa2-grader-gpus-{os.getuid()}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").replace(",", "_") or "all"
    return Path(folder) / f"gpu-{visible}-{gpu}.json"
