"""The harness side of the trust boundary: start a submission's runner, call it, survive it.

Each submission gets its own runner subprocess (adapters.runner) in a private copy of its
directory, in its own process group. A call that outlives its timeout gets the whole group
killed; a call whose runner dies is reported with the signal or exit status. Either way the
next call starts a fresh runner, so one failure never leaks into the next check.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from adapters.channel import Channel, ChannelClosed, ReceiveTimeout
from adapters.discover import Submission

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL_BYTES = 8192
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "wandb", "*.pt", "*.ckpt")


@dataclass
class Reply:
    status: str  # ok | error | not_attempted | timeout | crash | import_error
    message: str = ""
    result: dict = field(default_factory=dict)
    traceback: str = ""
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # phase name -> monotonic time its message came

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class SubmissionRunner:
    """One submission's runner process, started on first use and restarted after a failure."""

    def __init__(self, submission: Submission, env: dict | None = None, import_timeout: float = 120.0):
        self.submission = submission
        self.env = env or {}
        self.import_timeout = import_timeout
        self.scratch = Path(tempfile.mkdtemp(prefix=f"grade-{submission.name}-"))
        self.exchange = self.scratch / "exchange"
        self.exchange.mkdir()
        self.log_path = self.scratch / "runner.log"
        self.process = None
        self.channel = None
        self.ready = None  # the runner's hello: functions found, or the import error
        self.calls = 0

    # -- lifecycle -------------------------------------------------------------------------
    def _copy_submission(self) -> Path:
        copy = self.scratch / "submission"
        if not copy.exists():
            shutil.copytree(self.submission.root, copy, symlinks=False, ignore=COPY_IGNORE)
        return copy

    def start(self) -> dict:
        root = self._copy_submission()
        to_runner_r, to_runner_w = os.pipe()
        from_runner_r, from_runner_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1", **self.env}
        env = {k: v for k, v in env.items() if not k.startswith(("PYTEST_", "COV_"))}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                # -P: the submission's folder (the cwd) does not go first on sys.path, so a
                # root-level adapters.py cannot shadow this package; the runner adds it later.
                [sys.executable, "-P", "-m", "adapters.runner", str(to_runner_r), str(from_runner_w)],
                cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(to_runner_r, from_runner_w), start_new_session=True)
        os.close(to_runner_r)
        os.close(from_runner_w)
        self.channel = Channel(from_runner_r, to_runner_w)
        self.channel.send({"root": str(root), "adapters_file": self.submission.adapters_file,
                           "extra_paths": self.submission.extra_paths, "exchange": str(self.exchange)})
        reply = self._wait_done("import", self.import_timeout, event="ready")
        if isinstance(reply, Reply):  # the runner hung or died while importing
            self.ready = {"import_error": f"{self.submission.adapters_file} could not be imported: {reply.message}"}
        else:
            self.ready = reply
        if self.ready.get("import_error"):
            self.stop()
        return self.ready

    def stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # the runner and anything it spawned
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
        if self.channel is not None:
            self.channel.close()
        self.process = self.channel = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    # -- calls -----------------------------------------------------------------------------
    def _wait_done(self, phase: str, timeout: float, event: str = "done"):
        """Wait for the message `event`, following phase updates. A Reply means failure."""
        deadline = time.monotonic() + timeout
        self.phases = {}
        while True:
            try:
                message = self.channel.receive(timeout=max(0.0, deadline - time.monotonic()))
            except ReceiveTimeout:
                self.stop()
                return Reply("timeout", f"timed out after {timeout:g} s in {phase}")
            except ChannelClosed:
                self.process.wait()
                code = self.process.returncode
                self.stop()
                how = f"process died with {signal_name(code)}" if code < 0 else f"exited with status {code}"
                return Reply("crash", f"{how} during {phase}")
            if message.get("event") == "phase":
                phase = message["phase"]
                self.phases[phase] = time.monotonic()
            elif message.get("event") == event:
                return message

    def call(self, request: dict, timeout: float, what: str = "") -> Reply:
        """Send one request; `what` describes the case for messages, e.g. 'N=4096, causal'."""
        if self.submission.problem:
            return Reply("import_error", self.submission.problem)
        if self.ready and self.ready.get("import_error"):  # importing again would fail again
            return Reply("import_error", self.ready["import_error"], traceback=self.ready.get("traceback", ""))
        if self.process is None:
            ready = self.start()
            if ready.get("import_error"):
                return Reply("import_error", ready["import_error"], traceback=ready.get("traceback", ""))
        self.calls += 1
        request = {**request, "tag": f"call{self.calls}"}
        try:
            self.channel.send(request)
        except BrokenPipeError:
            self.process.wait()
            self.stop()
            return Reply("crash", "the runner had already exited before the call")
        message = self._wait_done("setup", timeout)
        if isinstance(message, Reply):
            if what:
                message.message += f" ({what})"
            return message
        return Reply(message["status"], message.get("message", ""), message.get("result", {}),
                     message.get("traceback", ""), message.get("seconds", 0.0), self.phases)

    def load_tensors(self, reply: Reply) -> dict:
        path = reply.result.get("tensors")
        if not path:
            return {}
        tensors = torch.load(path, map_location="cpu", weights_only=True)
        os.unlink(path)
        return tensors

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""
