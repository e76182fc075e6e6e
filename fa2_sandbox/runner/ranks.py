"""Run a function on N ranks of a local process group, and get its return values back.

    results = run_on_ranks(fn, arg1, arg2, world_size=2)   # [fn's result on rank 0, rank 1]

`fn(rank, world_size, *args)` runs in a process per rank, after init_process_group
(gloo on CPU by default). It must be a module-level function, because it is pickled by
reference. Its return value travels back as torch.save bytes, so tensors, dicts, lists and
numbers all work, and nothing depends on a rank process staying alive after it returns
(torch's shared-memory tensor passing would).

    pool = RankPool(world_size=2)            # the ranks start on the first run and stay
    pool.run(fn, arg1); pool.run(fn2, arg2)  # one spawn for both calls
    pool.close()

Ranks start as spawned ones do (a fresh interpreter's state, the parent's sys.path and working
directory, the function's module imported anew), but from multiprocessing's fork server, which
imports torch once for all of a runner's ranks (START_METHOD): spawned, each rank imported torch
itself, and a pool started again after every failed call.

run_on_ranks starts fresh ranks and ends them. Each call picks a free port by binding port 0,
so concurrent test runs don't collide the way a fixed MASTER_PORT would. A rank that raises
fails the whole call with its traceback, and the other ranks (likely stuck in a collective)
are terminated: after a failure a pool starts over, so one call's breakage never reaches the
next.
"""
import datetime
import io
import os
import queue as queue_module
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# A fresh Python per rank, as "spawn" gives, forked from one that has imported torch (and not the
# runner itself: the student's code ran there, and may have started threads or changed torch).
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
PRELOAD = ["torch", "torch.distributed"]


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def _serve_rank(rank, world_size, backend, tasks, results):
    """A rank process: run each task that comes, each in a process group of its own."""
    # Ranks share the machine's cores; more threads than cores per rank only thrashes.
    torch.set_num_threads(1)
    parent = os.getppid()
    while True:
        try:
            task = tasks.get(timeout=5.0)
        except queue_module.Empty:
            if os.getppid() != parent:  # the runner died without ending its ranks: so do they
                return
            continue
        if task is None:
            return
        port, collective_timeout_s, fn, args = task
        try:
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=collective_timeout_s),
            )
            out = fn(rank, world_size, *args)
            results.put((rank, True, _to_bytes(out)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


class RankPool:
    """`world_size` rank processes kept for several calls of `run`.

    Starting the ranks (a Python, torch, the submission's adapters, in each) costs seconds, the
    toy trainings of one check a fraction of that, so a runner keeps its ranks from one
    distributed call to the next. Each call gets a process group of its own on a fresh port. A
    call that fails in any way (a rank raised, died or ran out of time) ends the ranks: the
    others may be stuck in a collective, and the next call starts fresh ones."""

    def __init__(self, world_size: int = 2, backend: str = "gloo"):
        self.world_size, self.backend = world_size, backend
        self.procs = []

    def _start(self) -> None:
        ctx = mp.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            ctx.set_forkserver_preload(PRELOAD)
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(self.world_size)]
        self.procs = [ctx.Process(target=_serve_rank, daemon=True,
                                  args=(rank, self.world_size, self.backend, self.tasks[rank], self.results))
                      for rank in range(self.world_size)]
        for p in self.procs:
            p.start()

    def run(self, fn, *args, timeout_s: float = 120.0, collective_timeout_s: float = 60.0) -> list:
        """fn(rank, world_size, *args) on every rank; the results ordered by rank."""
        if not self.procs:
            self._start()
        port = find_free_port()
        for queue in self.tasks:
            queue.put((port, collective_timeout_s, fn, args))
        done = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(done) < self.world_size:
                try:
                    rank, ok, payload = self.results.get(timeout=1.0)
                except queue_module.Empty:
                    # a rank only ends when told to: any exit is a crash (segfault, OOM kill, os._exit)
                    crashed = [r for r, p in enumerate(self.procs) if p.exitcode is not None]
                    if crashed:
                        raise RuntimeError(f"rank(s) {crashed} exited with codes "
                                           f"{[self.procs[r].exitcode for r in crashed]}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"ranks {sorted(set(range(self.world_size)) - set(done))} "
                                           f"did not finish within {timeout_s} s")
                    continue
                if not ok:
                    raise RuntimeError(f"rank {rank} of {self.world_size} failed:\n{payload}")
                done[rank] = _from_bytes(payload)
        except BaseException:
            self.close(stuck=True)
            raise
        return [done[r] for r in range(self.world_size)]

    def close(self, stuck: bool = False) -> None:
        """End the ranks: asked to when idle, terminated at once when `stuck` (after a failure,
        a peer may be waiting in a collective) or when they do not end within 10 s."""
        for p, queue in zip(self.procs, self.tasks):
            if stuck:
                p.terminate()
            elif p.is_alive():
                queue.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_on_ranks(fn, *args, world_size: int = 2, backend: str = "gloo",
                 timeout_s: float = 120.0, collective_timeout_s: float = 60.0) -> list:
    """Run fn(rank, world_size, *args) on fresh ranks, ended afterwards; the results ordered by rank."""
    with RankPool(world_size, backend) as pool:
        return pool.run(fn, *args, timeout_s=timeout_s, collective_timeout_s=collective_timeout_s)
