"""The harness side of the trust boundary: start a submission's runner, call it, survive it.

Each submission gets its own runner subprocess (fa2_adapters.runner.serve) in a private copy of its
directory, in its own process group, confined by fa2_adapters.harness.sandbox: its own uid, the project and
the class folder hidden, no network but loopback, hard limits on memory, file size, core dumps
and process count (see sandbox.py for what each machine allows and the note it logs when it
allows less). The runner imports trusted modules from a copy of just those (`trusted/` in its
scratch folder, never the project root, so the reference solutions and the oracle are not on
its path); the oracle and the hidden rubric live only in this process and are never written
where a runner can read them.

A call that outlives its timeout gets the whole group killed (and, with a uid of its own, every
process of that uid, so setsid'd children die too); a call whose runner dies is reported with
the signal or exit status; a runner that goes over its memory limit, hits a CUDA error or sends
an invalid reply is killed. Either way the next call starts a fresh runner, so one failure never
leaks into the next check. Output goes through a pipe into a bounded in-memory tail, so a
submission that prints gigabytes costs neither disk nor memory.
"""
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fa2_adapters.harness import sandbox
from fa2_adapters.wire.channel import Channel, ChannelClosed, ReceiveTimeout
from fa2_adapters.harness.discover import Submission

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_BYTES = 8192
LOG_KEEP_BYTES = 1 << 16  # what the runner's output tail holds in memory
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "wandb", "*.pt", "*.ckpt")
# What the runner imports from the project: copied into its scratch folder, nothing else.
# The runner side and the wire: exactly the code the runner trusts.
TRUSTED_MODULES = ["fa2_adapters/__init__.py", "fa2_adapters/runner/*.py", "fa2_adapters/wire/*.py"]
# The bundled reference submission links into reference/; only it may have links leaving its folder.
TRUSTED_SUBMISSIONS = [PROJECT_ROOT / "submissions" / "reference", PROJECT_ROOT / "submissions" / "slow" / "tiles16"]
ENV_KEEP = ("PATH", "LANG", "LC_", "TZ", "TERM", "LD_LIBRARY_PATH", "CUDA_", "NVIDIA_", "OMP_", "MKL_",
            "OPENBLAS_", "KMP_", "TRITON_", "TORCH_", "PYTORCH_", "NCCL_", "GLOO_", "TORCHINDUCTOR_",
            "FLASH_TRITON_")  # the last: the reference solution's own switches (FLASH_TRITON_AUTOTUNE)
MAX_TENSOR_FILE = 4 << 30  # bytes of one reply's tensors
MAX_PHASES = 64


def _memory_limit() -> int:
    """Bytes for one runner (all its processes): GRADER_MEMORY_LIMIT_GB, or 80% of the machine's
    memory shared among the pytest-xdist workers. 0 turns the limit off."""
    if "GRADER_MEMORY_LIMIT_GB" in os.environ:
        return int(float(os.environ["GRADER_MEMORY_LIMIT_GB"]) * (1 << 30))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(0.8 * total / max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))))


FILE_LIMIT = int(float(os.environ.get("GRADER_FILE_LIMIT_GB", 2)) * (1 << 30))  # one file's size
NPROC_LIMIT = 4096  # processes + threads of the runner's uid


@dataclass
class Reply:
    status: str  # ok | error | not_attempted | timeout | crash | import_error
    message: str = ""
    result: dict = field(default_factory=dict)
    traceback: str = ""
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # phase name -> monotonic time its message came
    tensors: dict = field(default_factory=dict, repr=False)  # validated, loaded in call()

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _gib(n: float) -> str:
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


class SubmissionRunner:
    """One submission's runner process, started on first use and restarted after a failure."""

    def __init__(self, submission: Submission, env: dict | None = None, import_timeout: float = 120.0,
                 memory_limit: int | None = None):
        self.submission = submission
        self.env = env or {}
        self.import_timeout = import_timeout
        self.memory_limit = _memory_limit() if memory_limit is None else memory_limit
        self.scratch = Path(tempfile.mkdtemp(prefix="grade-"))  # no name: /tmp is listable by all
        os.chmod(self.scratch, 0o711)
        self.isolation = sandbox.isolation(tempfile.gettempdir(), _memory_limit())
        self.uid = sandbox.claim_uid() if self.isolation["mode"] != "none" else None
        self.exchange = self.scratch / "exchange"
        self.home = self.scratch / "home"
        for folder in (self.exchange, self.home, self.home / "tmp"):
            self._private_dir(folder)
        self.trusted = self._copy_trusted()
        self.output = OutputTail()
        self.output.write(f"[grader] {self.isolation['note']}\n".encode())
        self.process = None
        self.channel = None
        self.ready = None  # the runner's hello: functions found, or the import error
        self.calls = 0
        self.phases = {}
        self.copy_notes = []
        self._pump = None
        self._stopping = threading.Event()
        self._killed_for = None  # why the watchdog killed the runner, if it did
        self._busy = False  # a call (or the import) is under way
        self._timed_out = {}  # (op, slot, backward) -> (smallest case size that timed out, message)

    # -- the scratch folder ----------------------------------------------------------------
    def _private_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)

    def _copy_trusted(self) -> Path:
        trusted = self.scratch / "trusted"
        for pattern in TRUSTED_MODULES:
            for source in PROJECT_ROOT.glob(pattern):
                target = trusted / source.relative_to(PROJECT_ROOT)
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                os.chmod(target, 0o644)
        os.chmod(trusted, 0o755)
        return trusted

    def _copy_submission(self) -> Path:
        """A private copy the runner owns. Links are followed only while they stay inside the
        submission (a link to /etc/shadow or ../../reports must not be copied as root into a
        folder the student's code can read); special files are skipped."""
        copy = self.scratch / "submission"
        if copy.exists():
            return copy
        root = Path(os.path.realpath(self.submission.root))
        trusted = any(root == Path(os.path.realpath(t)) for t in TRUSTED_SUBMISSIONS)

        def ignore(directory, names):
            skipped = set(COPY_IGNORE(directory, names))
            here = os.path.realpath(directory)
            for name in set(names) - skipped:
                path = os.path.join(directory, name)
                target = os.path.realpath(path)
                if os.path.islink(path):
                    inside = sandbox._is_under(target, str(root))
                    cycle = os.path.isdir(target) and sandbox._is_under(here, target)
                    if not os.path.exists(target) or cycle or not (inside or trusted):
                        skipped.add(name)
                        self.copy_notes.append(f"{os.path.relpath(path, self.submission.root)} (a link "
                                               f"leading outside the submission) was not copied")
                        continue
                if not (os.path.isdir(target) or os.path.isfile(target)):
                    skipped.add(name)  # FIFOs, sockets, devices
            return skipped

        shutil.copytree(self.submission.root, copy, symlinks=False, ignore=ignore)
        if self.uid is not None:
            for folder, dirs, files in os.walk(copy):
                for name in [folder] + [os.path.join(folder, n) for n in dirs + files]:
                    os.lchown(name, self.uid, self.uid)
        os.chmod(copy, 0o700)
        for note in self.copy_notes:
            self.output.write(f"[grader] {note}\n".encode())
        return copy

    def _sandbox_spec(self, root: Path) -> dict:
        limits = {"RLIMIT_CORE": 0, "RLIMIT_FSIZE": FILE_LIMIT}
        if self.memory_limit and self.isolation["data_limit"]:
            limits["RLIMIT_DATA"] = self.memory_limit
        spec = {"limits": limits, "uid": self.uid, "namespace": self.isolation["mode"] == "namespace",
                "network": self.isolation["network"]}
        if self.uid is not None:
            limits["RLIMIT_NPROC"] = NPROC_LIMIT
        if spec["namespace"]:  # the runner's root: system folders, Python, its scratch folder
            hide = [str(PROJECT_ROOT), str(self.submission.root)]
            hide += [p for p in os.environ.get("GRADER_HIDE", "").split(os.pathsep) if p]
            spec.update(binds=sandbox.root_binds(hide), scratch=os.path.realpath(self.scratch))
        return spec

    def _runner_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_KEEP)}  # no tokens, no paths
        site_paths = [p for p in sys.path if p.endswith("site-packages") and "/.local/" in p]
        env.update({"PYTHONPATH": os.pathsep.join([str(self.trusted)] + site_paths), "PYTHONUNBUFFERED": "1",
                    "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(self.home), "TMPDIR": str(self.home / "tmp"),
                    "USER": "grader", "LOGNAME": "grader", "XDG_CACHE_HOME": str(self.home / ".cache"),
                    "TRITON_CACHE_DIR": str(self.home / ".triton" / "cache"), "GRADER_RUNNER": "1"})
        if self.isolation["network"]:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
        sharing = -(-workers // max(1, torch.cuda.device_count())) if torch.cuda.is_available() else 1
        if sharing > 1:  # workers share a GPU (the plugin pins them round-robin): a fair share each
            env["GRADER_GPU_MEMORY_FRACTION"] = f"{1 / sharing:.3f}"
        env.update(self.env)
        return env

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> dict:
        try:
            root = self._copy_submission()
        except (OSError, shutil.Error) as exc:
            self.ready = {"import_error": f"the submission could not be copied: {str(exc)[:300]}"}
            return self.ready
        to_runner_r, to_runner_w = os.pipe()
        from_runner_r, from_runner_w = os.pipe()
        log_r, log_w = os.pipe()
        self._killed_for = None
        self._stopping = threading.Event()
        argv = [sys.executable, "-P", "-m", "fa2_adapters.runner.serve", str(to_runner_r), str(from_runner_w)]
        self.process = subprocess.Popen(
            # -P: the submission's folder (the cwd) does not go first on sys.path, so a root-level
            # torch/ or triton/ cannot shadow the real ones; the runner adds it after importing them.
            sandbox.launch_command(self._sandbox_spec(root), argv) if self.isolation.get("launcher", True) else argv,
            cwd=root, env=self._runner_env(), stdin=subprocess.DEVNULL, stdout=log_w, stderr=log_w,
            pass_fds=(to_runner_r, from_runner_w), start_new_session=True)
        for fd in (to_runner_r, from_runner_w, log_w):
            os.close(fd)
        self._pump = threading.Thread(target=self._watch, args=(log_r, self.process, self._stopping),
                                      daemon=True, name=f"runner-{self.submission.name}")
        self._pump.start()
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

    def _watch(self, log_fd: int, process, stopping: threading.Event) -> None:
        """Drain the runner's output into the tail; kill it if its processes outgrow the memory limit."""
        import select

        last_check, stop_by = 0.0, None
        try:
            while stop_by is None or time.monotonic() < stop_by:
                ready, _, _ = select.select([log_fd], [], [], 0.25)
                if ready:
                    chunk = os.read(log_fd, 1 << 16)
                    if not chunk:
                        break
                    self.output.write(chunk)
                if stopping.is_set():  # drain what is left, for a second at most
                    if not ready:
                        break
                    stop_by = stop_by or time.monotonic() + 1.0
                    continue
                now = time.monotonic()  # memory: 4 times a second during a call, every 5 s when idle
                if self.memory_limit and now - last_check > (0.25 if self._busy else 5.0) and process.poll() is None:
                    last_check = now
                    pids = self._pids(process)
                    used = sandbox.rss_bytes(pids)
                    if used > self.memory_limit:
                        self._killed_for = (f"its processes held {_gib(used)}, over the runner's limit of "
                                            f"{_gib(self.memory_limit)}")
                        self._kill(process)
        finally:
            os.close(log_fd)

    def _pids(self, process) -> list:
        if self.uid is not None:
            return sandbox.processes(uid=self.uid)
        return sandbox.processes(pgid=process.pid)

    def _kill(self, process) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the runner and anything it spawned
        except (ProcessLookupError, PermissionError):
            pass
        if self.uid is not None:
            sandbox.kill_uid(self.uid)  # and what left the group (setsid, double fork)

    def stop(self) -> None:
        if self.process is not None:
            self._kill(self.process)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stuck in the kernel (a GPU driver call): let it be
                pass
            self._stopping.set()
            if self._pump is not None:
                self._pump.join(timeout=2)
        if self.channel is not None:
            self.channel.close()
        self.process = self.channel = self._pump = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)
        if self.uid is not None:
            sandbox.release_uid(self.uid)

    # -- calls -----------------------------------------------------------------------------
    def _died(self, phase: str, what: str = "") -> Reply:
        where = f"during {phase}" + (f" ({what})" if what else "")
        try:
            code = self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:  # closed its end of the channel and kept running
            self.stop()
            return Reply("crash", f"closed the grader's result channel and kept running {where}")
        killed_for = self._killed_for
        self.stop()
        if killed_for:
            return Reply("crash", f"ran out of memory {where}: {killed_for}")
        if code == 71 and "sandbox could not be set up" in self.log_tail():
            return Reply("crash", f"the grader could not start the runner's sandbox (see the log) {where}")
        how = f"process died with {signal_name(code)}" if code < 0 else f"exited with status {code}"
        return Reply("crash", f"{how} {where}")

    def _wait_done(self, phase: str, timeout: float, event: str = "done", what: str = ""):
        """Wait for the message `event`, following phase updates. A Reply means failure;
        `what` (the case) goes into its message."""
        deadline = time.monotonic() + timeout
        suffix = f" ({what})" if what else ""
        self._busy = True
        try:
            return self._wait(phase, deadline, timeout, event, what, suffix)
        finally:
            self._busy = False

    def _wait(self, phase, deadline, timeout, event, what, suffix):
        self.phases = {}
        while True:
            try:
                message = self.channel.receive(timeout=max(0.0, deadline - time.monotonic()))
            except ReceiveTimeout:
                if self._killed_for:  # the watchdog killed it just now
                    return self._died(phase, what)
                self.stop()
                return Reply("timeout", f"timed out after {timeout:g} s in {phase}{suffix}")
            except ChannelClosed:
                return self._died(phase, what)
            except ValueError as exc:  # not JSON, or a line too long
                self.stop()
                return Reply("crash", f"sent an invalid message on the grader's channel during {phase}{suffix}: "
                                      f"{str(exc)[:100]}")
            if not isinstance(message, dict):
                self.stop()
                return Reply("crash", f"sent an invalid message on the grader's channel during {phase}{suffix}")
            if message.get("event") == "phase":
                if len(self.phases) < MAX_PHASES:
                    phase = str(message.get("phase"))[:40]
                    self.phases[phase] = time.monotonic()
            elif message.get("event") == event:
                return message

    @staticmethod
    def _case_size(request: dict):
        case = request.get("case")
        try:
            size = case["n_queries"] * case["n_keys"] * case["head_dim"]
            for b in case["batch"]:
                size *= b
            return size
        except (TypeError, KeyError):
            return None

    def import_failure(self) -> "Reply | None":
        """The import_error Reply every call would get (starting the runner to find out), or None."""
        if self.submission.problem:
            return Reply("import_error", self.submission.problem)
        if self.process is None and not self.ready:
            self.start()
        if self.ready and self.ready.get("import_error"):
            return Reply("import_error", self.ready["import_error"], traceback=self.ready.get("traceback", ""))
        return None

    def call(self, request: dict, timeout: float, what: str = "") -> Reply:
        """Send one request; `what` describes the case for messages, e.g. 'N=4096, causal'.

        A case at least as large as one that already timed out (same op, slot and direction) is
        not run again: it fails at once with that timeout's message, so a submission that hangs
        costs a few timeouts, not one per case."""
        if self.submission.problem:
            return Reply("import_error", self.submission.problem)
        if self.ready and self.ready.get("import_error"):  # importing again would fail again
            return Reply("import_error", self.ready["import_error"], traceback=self.ready.get("traceback", ""))
        size, family = self._case_size(request), (request.get("op"), request.get("slot"), request.get("backward", True))
        earlier = self._timed_out.get(family)
        if size is not None and earlier and size >= earlier[0]:
            return Reply("timeout", f"not run: a smaller case already {earlier[1]}")
        if self.process is None:
            ready = self.start()
            if ready.get("import_error"):
                return Reply("import_error", ready["import_error"], traceback=ready.get("traceback", ""))
        self.calls += 1
        tag = f"call{self.calls}-{secrets.token_hex(4)}"  # unguessable: forged replies cannot match it
        request = {**request, "tag": tag}
        try:
            self.channel.send(request)
        except BrokenPipeError:
            return self._died("setup", what)
        message = self._wait_done("setup", timeout, what=what)
        if isinstance(message, Reply):
            if message.status == "timeout" and size is not None:
                if not earlier or size < earlier[0]:
                    self._timed_out[family] = (size, message.message)
            return message
        reply = self._reply(message, tag, what)
        if reply.status in ("crash",) or message.get("restart"):
            self.stop()  # out of memory, a poisoned CUDA context, a forged reply: start afresh
        return reply

    def _reply(self, message: dict, tag: str, what: str) -> Reply:
        where = f" during {next(reversed(self.phases), 'setup')}" + (f" ({what})" if what else "")
        if message.get("tag") != tag or message.get("status") not in ("ok", "error", "not_attempted"):
            return Reply("crash", f"sent an invalid reply (not the answer to the request it was sent){where}")
        result = message.get("result") if isinstance(message.get("result"), dict) else {}
        text = str(message.get("message", ""))[:2000]
        seconds = message.get("seconds") if isinstance(message.get("seconds"), (int, float)) else 0.0
        reply = Reply(message["status"], text, result, str(message.get("traceback", ""))[:20000], seconds,
                      dict(self.phases))
        if message.get("oom"):
            limit = f"; the runner's limit is {_gib(self.memory_limit)}" if self.memory_limit and message["oom"] == "host" else ""
            what_ran_out = "GPU memory" if message["oom"] == "gpu" else "memory"
            return Reply("crash", f"ran out of {what_ran_out}{where}: {text}{limit}", traceback=reply.traceback)
        if reply.ok and "tensors" in result:
            try:
                reply.tensors = self._read_tensors(result["tensors"], tag)
            except ValueError as exc:
                return Reply("crash", f"sent back invalid tensors{where}: {exc}")
        return reply

    def _read_tensors(self, path, tag: str) -> dict:
        """The reply's tensors, read only from the file this call's tag names in the exchange folder
        (never a path the runner chose), not through a link, and only plain dense tensors."""
        expected = self.exchange / f"{tag}.pt"
        if path != str(expected):
            raise ValueError("the reply named a file outside the exchange folder")
        try:
            fd = os.open(expected, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise ValueError(f"the tensors file could not be opened ({exc.strerror})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_TENSOR_FILE:
                raise ValueError("the tensors file is not a regular file of a sane size")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        finally:
            os.close(fd)
            try:
                os.unlink(expected)
            except OSError:
                pass
        import io
        import warnings
        try:
            with warnings.catch_warnings():  # a forged file's pickle protocol, say: not our warning
                warnings.simplefilter("ignore")
                tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ValueError(f"the tensors file could not be read ({type(exc).__name__})") from None
        if not isinstance(tensors, dict):
            raise ValueError(f"expected a dict of tensors, got {type(tensors).__name__}")
        for name, value in tensors.items():
            if not isinstance(name, str) or type(value) is not torch.Tensor:
                raise ValueError(f"{str(name)[:40]!r} is not a plain tensor")
            if value.layout != torch.strided or value.is_quantized or value.is_complex():
                raise ValueError(f"{name} is not a dense real tensor")
        return tensors

    def load_tensors(self, reply: Reply) -> dict:
        return reply.tensors

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        return self.output.tail(limit)
