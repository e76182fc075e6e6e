"""Runners forked from a fork server (fa2_sandbox/runner/fork_server.py) instead of started afresh.

    server = fork_server(env)                    # one per environment, per grader process
    process = server.spawn(spec, cwd, env, (to_runner_r, from_runner_w, log_w)) if server else None

A forked runner is confined by the same launcher code and reads the same environment as an exec'd
one; what it skips is a Python's start and torch's and Triton's imports. `spawn` returns a
ForkedProcess, which answers what the harness asks of a subprocess.Popen (pid, poll, wait,
returncode): the server is the runner's parent, so it reaps it and says how it ended.

A server that cannot start, or could not fork safely (a preloaded module started a thread), is not
used again, and its runners start the usual way: `fork_server` returns None, and so it does
with GRADER_FORK_SERVER=off.
"""
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from fa2_sandbox.harness.scratch import user_site_paths

SERVER_PY = Path(__file__).resolve().parents[1] / "runner" / "fork_server.py"
READY_TIMEOUT_S = 180.0  # the server's imports, on a machine whose cores are all busy
# What the server imports before it forks. With a GPU, also torch.compile's front end, which
# about half the course's submissions import (seconds of CPU a runner): a class there starts
# hundreds of runners. Under the Triton interpreter (a CPU: the project's tests, a student's own
# check) a server often forks only a few, and importing it would cost more than it saves. Not
# torch._inductor.compile_fx: on an H200 its import starts a thread, so the server refused to fork
# at all. Its torch/_inductor/runtime/benchmarking.py asks torch.cuda.is_available() at import,
# which even NVML's way (PYTORCH_NVML_BASED_CUDA_CHECK, below) answers from a thread of NVML's
# (notes/grading-speed.md, "the whole class, to its end").
PRELOAD = ("torch", "triton", "numpy")
PRELOAD_COMPILE = ("torch._dynamo",)
# A runner's own folders: the server gets folders of its own instead, and each runner its own.
PER_RUNNER = ("HOME", "TMPDIR", "XDG_CACHE_HOME", "TRITON_HOME", "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING",
              "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH")


class ForkedProcess:
    """A runner forked by a fork server: what the harness uses of subprocess.Popen."""

    def __init__(self, server: "ForkServer", pid: int):
        self.server, self.pid, self.returncode = server, pid, None
        self.args = ["fa2_sandbox.runner.serve (forked)"]

    def poll(self):
        self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None):
        if not self.server.wait_for(self.pid, timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.poll()


class ForkServer:
    def __init__(self, env: dict):
        self.folder = tempfile.mkdtemp(prefix="fa2-fork-server-")
        os.chmod(self.folder, 0o700)
        own = {"HOME": self.folder, "TMPDIR": self.folder, "XDG_CACHE_HOME": self.folder, "TRITON_HOME": self.folder,
               "TRITON_CACHE_DIR": os.path.join(self.folder, "triton"),
               "TORCHINDUCTOR_CACHE_DIR": os.path.join(self.folder, "inductor"),
               # torch's own CUDA check would initialise the driver, which a fork does not survive
               "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
               # a runner's PYTHONPATH without the runner's own trusted copy: the server imports none of it
               "PYTHONPATH": os.pathsep.join(user_site_paths())}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.socket = ours
        self.process = subprocess.Popen(
            [sys.executable, "-P", str(SERVER_PY), str(theirs.fileno()), str(launcher_py()), *PRELOAD,
             *(PRELOAD_COMPILE if env.get("TRITON_INTERPRET") != "1" else ())],
            env={**{k: v for k, v in env.items() if k not in PER_RUNNER}, **own}, pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.folder)
        theirs.close()
        self.broken = None  # why the server is not used, once it is not
        self._lock = threading.Lock()  # one request at a time: a reply names no request
        self._changed = threading.Condition()
        self._started = []  # pids the server has started, not yet taken by spawn()
        self._ended = {}  # pid -> returncode
        self._ready = threading.Event()
        threading.Thread(target=self._read, name="fork-server", daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S) and self.broken is None:
            self.broken = f"the fork server was not ready after {READY_TIMEOUT_S:.0f} s"
        if self.broken:
            self.close()

    def _read(self) -> None:
        try:
            while True:
                data = self.socket.recv(1 << 16)
                if not data:
                    break
                message = json.loads(data)
                with self._changed:
                    if "ready" in message:
                        self._ready.set()
                    elif "started" in message:
                        self._started.append(int(message["started"]))
                    elif "exited" in message:
                        self._ended[int(message["exited"])] = int(message["returncode"])
                    elif "error" in message:
                        self.broken = str(message["error"])
                        self._ready.set()
                    self._changed.notify_all()
        except (OSError, ValueError) as exc:
            self.broken = self.broken or f"the fork server's channel failed: {exc!r}"
        with self._changed:
            self.broken = self.broken or "the fork server ended"
            self._ready.set()
            self._changed.notify_all()

    def spawn(self, spec: dict | None, cwd: str, env: dict, fds: tuple) -> ForkedProcess | None:
        """Fork a runner confined as `spec` says (None: no launcher), in `cwd` with `env`; None
        where the server cannot (the caller starts the runner the usual way)."""
        with self._lock:
            if self.broken:
                return None
            message = json.dumps({"spec": spec, "cwd": str(cwd), "env": env}).encode()
            try:
                socket.send_fds(self.socket, [message], [int(fd) for fd in fds])
            except OSError as exc:
                self.broken = f"the fork server could not be reached: {exc!r}"
                return None
            with self._changed:
                if not self._changed.wait_for(lambda: self._started or self.broken, timeout=30):
                    self.broken = "the fork server did not fork within 30 s"
                if not self._started:
                    return None
                return ForkedProcess(self, self._started.pop(0))

    def returncode(self, pid: int):
        with self._changed:
            if pid in self._ended:
                return self._ended[pid]
            if self.broken:  # its children died with it (their parent-death signal)
                return -9
            return None

    def wait_for(self, pid: int, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: pid in self._ended or self.broken, timeout=timeout)

    def close(self) -> None:
        """End the server (its runners die with it) and remove its folder."""
        try:
            self.socket.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def launcher_py() -> Path:
    from fa2_sandbox.harness.confinement import LAUNCHER_PY
    return LAUNCHER_PY


_servers = {}  # environment key -> ForkServer
_servers_lock = threading.Lock()


def fork_server(env: dict) -> ForkServer | None:
    """This process's fork server for runners of environment `env` (started on first use), or None
    where runners start afresh (GRADER_FORK_SERVER=off, not Linux). A server that could not start
    says why in `broken`."""
    if os.environ.get("GRADER_FORK_SERVER", "on") == "off" or not sys.platform.startswith("linux"):
        return None
    key = json.dumps({k: v for k, v in sorted(env.items()) if k not in PER_RUNNER})
    with _servers_lock:
        server = _servers.get(key)
        if server is None:
            if not _servers:
                atexit.register(close_all)
            server = _servers[key] = ForkServer(env)
    return server


def close_all() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()
