"""Run a function on N ranks of a local process group, and get its return values back.

    results = run_on_ranks(fn, arg1, arg2, world_size=2)   # [fn's result on rank 0, rank 1]

`fn(rank, world_size, *args)` runs in a fresh spawned process per rank, after
init_process_group (gloo on CPU by default). It must be a module-level function, because spawn
pickles it by reference. Its return value travels back as torch.save bytes, so tensors, dicts,
lists and numbers all work, and nothing depends on a rank process staying alive after it
returns (torch's shared-memory tensor passing would).

Each call picks a free port by binding port 0, so concurrent test runs don't collide the way
a fixed MASTER_PORT would. A rank that raises fails the whole call with its traceback, and
the other ranks (likely stuck in a collective) are terminated.
"""
import datetime
import io
import queue as queue_module
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


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


def _worker(rank, world_size, port, backend, collective_timeout_s, fn, args, results):
    try:
        # Ranks share the machine's cores; more threads than cores per rank only thrashes.
        torch.set_num_threads(1)
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


def run_on_ranks(fn, *args, world_size: int = 2, backend: str = "gloo",
                 timeout_s: float = 120.0, collective_timeout_s: float = 60.0) -> list:
    """Run fn(rank, world_size, *args) on every rank; return the results ordered by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = find_free_port()
    procs = [
        ctx.Process(target=_worker, daemon=True,
                    args=(rank, world_size, port, backend, collective_timeout_s, fn, args, results))
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()

    done = {}
    deadline = time.monotonic() + timeout_s
    try:
        # Drain the queue before joining: a child blocks on exit until its data is read.
        while len(done) < world_size:
            try:
                rank, ok, payload = results.get(timeout=1.0)
            except queue_module.Empty:
                crashed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if crashed:  # died without reporting (segfault, OOM kill, ...)
                    raise RuntimeError(f"rank(s) {crashed} exited with codes "
                                       f"{[procs[r].exitcode for r in crashed]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {sorted(set(range(world_size)) - set(done))} "
                                       f"did not finish within {timeout_s} s")
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{payload}")
            done[rank] = _from_bytes(payload)
    except BaseException:
        for p in procs:  # peers of a failed rank are likely blocked in a collective
            if p.is_alive():
                p.terminate()
        raise
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return [done[r] for r in range(world_size)]
