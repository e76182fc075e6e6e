"""The float64 oracles of the cases that run on the CPU, computed once for a class and shared by
its workers.

Every submission is graded on the same inputs (the seed's), so a case's oracle and baseline are the
same for the whole class. Each worker keeps those it computed (grading/checks/flash_checks.py
`expected`), but under xdist each worker computed its own, and on the CPU, where the PyTorch
slot's cases run, that is seconds of a core per case, in nearly every worker of a class
(notes/grading-speed.md, "the oracles once per class"). Here the first worker to need a case
computes it under a lock, writes it, and the others read it.

The folder is the controller's (a mkdtemp, as the time limit's is), out of reach of a confined
runner. Each file carries an HMAC under a key the controller draws for the run and gives its
workers alone (protocol.ORACLES, in workerinput): a file that does not match it (torn, or written
by anyone else) is computed again, never read, so one submission cannot change another's oracle.

    oracles = SharedOracles(folder, key)      # a worker's, WorkerState.oracles
    value = oracles.get((case, seed, "cpu"), compute)   # compute() runs in one process of the run
"""
import fcntl
import hashlib
import hmac
import io
import os
from pathlib import Path

import torch

DIGEST = hashlib.sha256
MAC_BYTES = DIGEST().digest_size


class SharedOracles:
    def __init__(self, folder, key: str):
        self.folder, self.key = Path(folder), bytes.fromhex(key)

    def get(self, what, compute):
        """compute()'s value (tensors in tuples and dicts) for `what` (its repr names it), computed
        by the first of the run's processes to ask; the others wait for it and read it."""
        name = hashlib.sha256(repr(what).encode()).hexdigest()[:32]
        target = self.folder / f"{name}.pt"
        with open(self.folder / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            value = self._read(target)
            if value is None:
                value = compute()
                self._write(target, value)
            return value

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self.key, body, DIGEST).digest()

    def _read(self, target: Path):
        try:
            data = target.read_bytes()
        except OSError:
            return None
        mac, body = data[:MAC_BYTES], data[MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        return torch.load(io.BytesIO(body), weights_only=True)

    def _write(self, target: Path, value) -> None:
        buffer = io.BytesIO()
        torch.save(value, buffer)
        body = buffer.getvalue()
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        partial.write_bytes(self._mac(body) + body)
        os.replace(partial, target)  # whole or not at all: a reader never sees half a file
