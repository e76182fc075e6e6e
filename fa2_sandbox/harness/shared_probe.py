"""One isolation probe per grading run, not one per pytest-xdist worker.

confinement.isolation() starts a confined interpreter that imports torch and touches the GPU:
seconds (notes/grading-speed.md, "the kept kernels were never found"), paid by every worker before
its first runner starts, so on the critical path of every run, with a probe per worker competing
for the cores. Instead the controller probes once, in a thread, while its workers start and
collect, and writes what it found to a file each worker reads before its first runner.

A worker takes the controller's answer only for the same question: the same host, user,
GRADER_SANDBOX, scratch parent and memory limit (confinement.isolation's key). Otherwise, or if the controller's probe
raised or never answered, the worker probes itself, as it did before.
"""
import json
import os
import socket
import threading
import time
from pathlib import Path

from fa2_sandbox.harness import confinement

WAIT_S = 600.0  # the probe tries several launch modes, each under its own timeout; it usually answers in seconds


def question(scratch_parent: str, data_limit: int) -> dict:
    return {"host": socket.gethostname(), "euid": os.geteuid(), "sandbox": os.environ.get("GRADER_SANDBOX", ""),
            "scratch_parent": scratch_parent, "data_limit": data_limit}


def start(path: Path, scratch_parent: str, data_limit: int) -> threading.Thread:
    """In the controller: probe in a thread and write {"question", "isolation" | "error"} to `path`."""
    def probe():
        answer = {"question": question(scratch_parent, data_limit)}
        try:
            answer["isolation"] = confinement.isolation(scratch_parent, data_limit)
        except Exception as exc:  # the workers then probe for themselves
            answer["error"] = repr(exc)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(answer))
        os.replace(partial, path)  # a worker never reads half a file

    thread = threading.Thread(target=probe, name="isolation-probe", daemon=True)
    thread.start()
    return thread


def adopt(path: Path, asked: dict) -> None:
    """In a worker: confinement.isolation() will take the controller's answer for the same question,
    waiting for it when first asked, or probe itself when there is none."""
    if asked == question(asked["scratch_parent"], asked["data_limit"]):
        confinement.answer_isolation_with(asked["scratch_parent"], asked["data_limit"], lambda: _answer(path, asked))


def _answer(path: Path, asked: dict) -> dict | None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    answer = json.loads(path.read_text())
    return answer.get("isolation") if answer["question"] == asked else None
