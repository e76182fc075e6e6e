"""Admission to a shared GPU: memory reservations, and exclusive windows for timing.

A class graded with `-n 16` on one GPU runs 16 workers, each with its runners, on one card. Left
alone they crowd it: in one class run about 60 processes filled an 80 GB H100, checks of correct
submissions were recorded as the students' out-of-memory crashes, and SDPA's own time for one case
ranged from 1.4 to 33 ms with the neighbours' kernels. So GPU memory and GPU time are scheduled:

- Every runner call on a GPU first reserves what its case may need (client.py asks for
  `gpu_budget_bytes`), and runs only when the ledger has room for it; the runner is held to that
  budget (serve.py: torch.cuda.set_per_process_memory_fraction) and gives its cache back after
  each call. A worker's own GPU work (the float64 oracles) reserves too.
- A timing window takes the GPU alone (`exclusive`): it starts when no reservation is held, and
  no reservation is admitted while it holds the GPU. Waiting, it holds nothing back, so timing
  windows fill the GPU's idle moments and the run's end (grading/shards.py hands timing out
  last). Reservations queue in arrival order, so a large one is not starved by small ones.
- Calls made inside a window this process holds (the timed calls themselves) pass straight in.

The ledger is one JSON file per GPU that every process sharing the GPU reads and writes under an
exclusive flock: holders and the queue, each token -> pid, bytes, exclusive, what, since.
A holder or waiter whose process is gone is dropped, so a killed worker never wedges the GPU.
What the ledger cannot see, each process's CUDA context and a worker's cached oracles, is left
out of its capacity (`capacity_bytes`); the runner tells an allocation refused because the device
was full from one refused at its own budget, and only the latter is the student's (client.py).
"""
import contextlib
import fcntl
import json
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path

GIB = 1 << 30
# What each process on a GPU holds outside any reservation: its CUDA context, cuBLAS's workspace,
# loaded kernels and, in a worker, its cached oracles. A worker brings itself and its student's
# runner; the reference's runner lives only through a timing check.
CONTEXT_BYTES = 3 * GIB // 4
PROCESSES_PER_WORKER = 2
MIN_CAPACITY_SHARE = 0.25  # however many workers share it, reservations may use this much of a GPU
POLL_S = 0.2
SAY_EVERY_S = 30.0  # a wait longer than this says what it waits for (to `say`: the runner's log)


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


class GpuLedger:
    """One process's handle on the ledger of one GPU (`path`, shared), `capacity` bytes in all."""

    def __init__(self, path: Path, capacity: int):
        self.path = Path(path)
        self.capacity = int(capacity)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._exclusive_here = 0  # windows this process holds (threads of one worker share them)
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
                        del table[token]
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
        not delay), or, first of them, when the GPU is empty, however large it is. A window goes
        when the GPU is empty, the windows in arrival order, and holds no place in the queue
        while it waits: a window that waited for the holders and held back the rest kept the GPU
        idle while the holders compiled (a reservation spans a whole runner call, Triton's
        compiling and autotuning included) and stalled every worker behind it (2026-11-26, a
        corpus run: 19 s of GPU work in 390 s, no Triton check recorded)."""
        holders, waiting = state["holders"], state["waiting"]
        if any(h["exclusive"] for h in holders.values()):
            return False
        queue = sorted(waiting.items(), key=lambda item: item[1]["since"])
        entry = waiting[token]
        if entry["exclusive"]:
            first_window = next(queued for queued, e in queue if e["exclusive"])
            admitted = not holders and first_window == token
        else:
            ahead = [e for queued, e in queue[:[q for q, _ in queue].index(token)] if not e["exclusive"]]
            room = self.capacity - sum(h["bytes"] for h in holders.values()) - sum(e["bytes"] for e in ahead)
            admitted = entry["bytes"] <= room or (not holders and not ahead)
        if admitted:
            holders[token] = {**waiting.pop(token), "since": time.time()}
        return admitted

    def _hold(self, nbytes: int, exclusive: bool, what: str, say) -> str:
        """Queue, then poll until admitted; the token the holding is known by."""
        token = secrets.token_hex(6)
        with self._state() as state:
            state["waiting"][token] = {"pid": os.getpid(), "bytes": self.capacity if exclusive else int(nbytes),
                                       "exclusive": exclusive, "what": what[:80], "since": time.time()}
        started = last_said = time.monotonic()
        try:
            while True:
                with self._state() as state:
                    if self._admit(state, token):
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
            state["holders"].pop(token, None)
            state["waiting"].pop(token, None)

    # -- what callers use ------------------------------------------------------------------
    @contextlib.contextmanager
    def reserve(self, nbytes: int, what: str = "", say=None):
        """Hold `nbytes` of the GPU for the block (a reservation larger than the capacity waits for
        an empty GPU). Inside a window this process holds, it passes straight in."""
        with self._lock:
            inside_window = self._exclusive_here > 0
        if inside_window:
            yield
            return
        token = self._hold(nbytes, False, what, say)
        try:
            yield
        finally:
            self._release(token)

    @contextlib.contextmanager
    def exclusive(self, what: str = "", say=None):
        """Hold the whole GPU for the block, alone. A nested window of this process passes in."""
        with self._lock:
            nested = self._exclusive_here > 0
            if nested:
                self._exclusive_here += 1
        token = None if nested else self._hold(self.capacity, True, what, say)
        if not nested:
            with self._lock:
                self._exclusive_here += 1
        try:
            yield
        finally:
            with self._lock:
                self._exclusive_here -= 1
            if token is not None:
                self._release(token)


def ledger_path(gpu: int) -> Path:
    """Where the ledger of this host's GPU `gpu` lives: GRADER_GPU_LEDGER_DIR, or a folder of this
    user's under the temporary directory, shared by every grading run of the user on the host."""
    folder = os.environ.get("GRADER_GPU_LEDGER_DIR") or Path(tempfile.gettempdir()) / f"fa2-grader-gpus-{os.getuid()}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").replace(",", "_") or "all"
    return Path(folder) / f"gpu-{visible}-{gpu}.json"
