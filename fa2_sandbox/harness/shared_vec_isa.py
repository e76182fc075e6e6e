"""torch.compile's vector-ISA probe once per class, not once per runner (fa2_sandbox/runner/vec_isa.py).

The controller starts `python -m fa2_sandbox.runner.vec_isa` in a thread while its workers start
(a plain subprocess of the grader's: it runs torch's own test programs, no student code), with a
compile cache of its own, and writes what it found to a file; each runner a worker launches
afterwards gets those answers with its configuration (client.SubmissionRunner.launch) and adopts
them. A runner launched before the file is written asks for itself, as every runner did before.

Answers hold for one machine and one torch: the file carries the question (host, the CPU's flags,
the torch version, the Python that ran the probe), and a worker takes it only where its own
question is the same, so a worker on another node (grading/slurm.py) never adopts another CPU's.
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

PROBE_TIMEOUT_S = 600.0  # seconds of gcc and Python starts; on a loaded machine, minutes
_adopted = {"path": None, "answers": None}  # this worker's: the controller's file, its answers once read


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return hashlib.sha256(flags.encode()).hexdigest()[:16]


def question() -> dict:
    return {"host": socket.gethostname(), "cpu": _cpu_flags(), "torch": torch.__version__, "python": sys.executable}


def start(path: Path) -> threading.Thread:
    """In the controller: probe in a thread and write {"question", "answers" | "error"} to `path`."""
    def probe():
        answer = {"question": question()}
        with tempfile.TemporaryDirectory(prefix="fa2-vec-isa-") as folder:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=folder)
            try:
                done = subprocess.run([sys.executable, "-m", "fa2_sandbox.runner.vec_isa"], env=env, cwd=folder,
                                      capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True)
                answer["answers"] = json.loads(done.stdout)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:  # runners then ask for themselves
                answer["error"] = repr(exc)[:500]
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(answer))
        os.replace(partial, path)  # a worker never reads half a file

    thread = threading.Thread(target=probe, name="vec-isa-probe", daemon=True)
    thread.start()
    return thread


def adopt(path: Path) -> None:
    """In a worker: the runners it launches from now on get the controller's answers, once written."""
    _adopted.update(path=Path(path), answers=None)


def answers() -> dict | None:
    """The answers a runner launched now adopts: None while the controller's file is not written, or
    where it answered another question or none."""
    if _adopted["answers"] is None and _adopted["path"] is not None:
        try:
            written = json.loads(_adopted["path"].read_text())
        except (OSError, ValueError):
            return None
        _adopted["answers"] = (written.get("answers") or {}) if written.get("question") == question() else {}
    return _adopted["answers"] or None
