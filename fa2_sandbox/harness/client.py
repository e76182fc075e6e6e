"""The harness side of the trust boundary: start a submission's runner, call it, survive it.

Each submission gets its own runner subprocess (fa2_sandbox.runner.serve) in a private copy of its
directory (fa2_sandbox.harness.scratch), in its own process group, confined by
fa2_sandbox.harness.confinement: its own uid, the project and the class folder hidden, no network but
loopback, hard limits on memory, file size, core dumps and process count (see confinement.py for what
each machine allows and the note it logs when it allows less). The runner imports trusted
modules from a copy of just those (scratch.py), never the project root; the oracle and the
hidden rubric live only in this process and are never written where a runner can read them.

The call protocol: the runner's first message (its hello: the functions found, or the import
error) must come within the import timeout. Each call then sends one request, tagged with a name
the runner cannot guess, and waits for the reply with that tag, following the runner's phase
messages (at most MAX_PHASES) to say where a failure happened. A reply is validated before it is
believed: its tag, its status, the type and size of each field, and its tensors, read only from
the file the tag names (fa2_sandbox.wire.tensors).

A call that outlives its timeout gets the whole group killed (and, with a uid of its own, every
process of that uid, or in a PID namespace of its own every process in it, so setsid'd children
die too: watchdog.kill_runner), and a case at least as
large as one that timed out (same op, slot and direction) fails at once without running. A call
whose runner dies is reported with the signal or exit status; a runner that goes over its
memory limit (the watchdog), hits a CUDA error or sends an invalid reply is killed. Either way
the next call starts a fresh runner, so one failure never leaks into the next check. Output goes
through a pipe into a bounded in-memory tail (watchdog.py), so a submission that prints
gigabytes costs neither disk nor memory.
"""
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fa2_sandbox.harness import confinement, forked, kernel_cache
from fa2_sandbox.harness.compile_credit import CompileCredit
from fa2_sandbox.harness.discover import Submission
from fa2_sandbox.harness.scratch import PROJECT_ROOT, ScratchFolder  # noqa: F401 (PROJECT_ROOT: tests import it here)
from fa2_sandbox.harness.watchdog import OutputTail, Watchdog, gib, kill_runner, runner_identity
from fa2_sandbox.wire import outcomes, requests
from fa2_sandbox.wire import tensors as wire_tensors
from fa2_sandbox.wire.channel import Channel, ChannelClosed, ReceiveTimeout

LOG_TAIL_BYTES = 8192
# bench/grade_speed.py's account of a class: where each runner appends its CPU by activity. Unset
# (the default), runners do not profile themselves.
CPU_LOG = os.environ.get("GRADER_CPU_LOG")
MAX_PHASES = 64


def runner_memory_limit(workers: int | None = None) -> int:
    """Bytes for one runner (all its processes): GRADER_MEMORY_LIMIT_GB, or 80% of the machine's
    memory shared among the pytest-xdist workers (this process's count unless given). 0 turns
    the limit off."""
    if "GRADER_MEMORY_LIMIT_GB" in os.environ:
        return int(float(os.environ["GRADER_MEMORY_LIMIT_GB"]) * (1 << 30))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)) if workers is None else workers
    return int(0.8 * total / max(1, workers))


@dataclass
class Reply:
    status: str  # a word of outcomes.STATUSES; ask the predicates below rather than compare it
    message: str = ""
    result: dict = field(default_factory=dict)
    traceback: str = ""
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # phase name -> monotonic time its message came
    tensors: dict = field(default_factory=dict, repr=False)  # validated, loaded in call()
    oom: str = ""  # why an allocation failed: host | gpu_allowance | gpu_full (serve.py out_of_memory)
    gpu_peak: int = 0  # the most GPU memory the runner's allocator held during the call (its word: a hint)

    # What a call site asks of a reply, so none compares status words (fa2_sandbox/wire/outcomes.py).
    @property
    def ok(self) -> bool:
        return self.status == outcomes.OK

    @property
    def raised(self) -> bool:
        """The submission raised (not NotImplementedError: that is not_attempted)."""
        return self.status == outcomes.ERROR

    @property
    def not_attempted(self) -> bool:
        return self.status == outcomes.NOT_ATTEMPTED

    @property
    def timed_out(self) -> bool:
        return self.status == outcomes.TIMEOUT

    @property
    def crashed(self) -> bool:
        return self.status == outcomes.CRASH

    @property
    def import_failed(self) -> bool:
        """tests/adapters.py could not be imported: every call of the submission ends so."""
        return self.status == outcomes.IMPORT_ERROR

    @property
    def unanswered(self) -> bool:
        """The case got no answer (it raised, crashed, timed out): see outcomes.Status.unanswered."""
        s = outcomes.STATUSES.get(self.status)
        return bool(s and s.unanswered)

    @property
    def outcome(self) -> str:
        """The outcome of a check this reply fails (outcomes.STATUSES)."""
        return outcomes.outcome_of_call(self.status)


class GpuCrowded(RuntimeError):
    """The device had no room for a call even with the GPU to itself: the grader's fault (its own
    processes fill the card), never the student's; the plugin records it as a grader error."""


def call_on_gpu(ledger, call, allowance: int, label: str, note, runner=None, reserve: int | None = None) -> Reply:
    """`call(holding)` on the GPU, the runner held to its `allowance` of GPU bytes.

    It first reserves `reserve` bytes (default: the whole allowance): what the call needs unless the
    class holds N x N matrices, which the allowance allows but few classes use (a dense backward:
    16 of the 19 GiB at the timing shape). Reserving the whole allowance for every call kept the GPU
    half idle: in a corpus class the timing warm-ups' whole allowances filled the ledger, calls queued
    behind them, while the card's memory stayed far from full (notes/grading-speed.md, "timing
    windows pause the others", its run1).
    `runner()` names the runner's processes, which a timing window may pause meanwhile
    (gpu_ledger.py), and `holding` says for how long.

    An out-of-memory error is the student's only when the allowance itself ran out. When the device
    was full (the neighbours' memory), the call runs again with its whole allowance reserved, then
    with the GPU to itself, and if the device is full even then it is the grader's fault
    (GpuCrowded), never a crash of the student's."""
    reservations = [reserve, allowance] if reserve is not None and reserve < allowance else [allowance]
    for nbytes in reservations:
        with ledger.reserve(nbytes, label, say=note, runner=runner() if runner else None) as holding:
            reply = call(holding)
        if reply.oom != outcomes.OOM_GPU_FULL:
            return reply
        note(f"the GPU was full of other processes' memory ({reply.message[:200]}) with {gib(nbytes)} reserved")
    note("running the call again with the GPU to itself")
    with ledger.alone(label, say=note):
        reply = call(None)
    if reply.oom == outcomes.OOM_GPU_FULL:
        raise GpuCrowded(f"the GPU had no room for {gib(allowance)} even with no other check on it: "
                         f"{reply.message[:300]}")
    return reply


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class SubmissionRunner:
    """One submission's runner process, started on first use and restarted after a failure."""

    def __init__(self, submission: Submission, env: dict | None = None, import_timeout: float = 120.0,
                 memory_limit: int | None = None, kept_kernels: Path | None = None, gpu_ledger=None,
                 dense_backward: bool = True, forked: bool = True, learns_timeouts: bool = True):
        self.submission = submission
        # Whether a case at least as large as one that timed out fails at once (_after_a_timeout): a
        # submission's hang costs a few timeouts, not one per case. Not for a runner of the grader's
        # own code kept from one submission's check to the next (the timing reference), whose
        # timeout says how busy the machine was, not how its next call will end.
        self.learns_timeouts = learns_timeouts
        # Whether the runner may be forked from a fork server (forked.py) rather than started afresh.
        self.forked = forked
        self.gpu_ledger = gpu_ledger  # gpu_ledger.GpuLedger of the runner's GPU, or None (no GPU)
        # Whether a call's GPU allowance has room for N x N scores (FlashCase.gpu_allowance_bytes): a
        # student's class may hold them in its backward; the reference never does.
        self.dense_backward = dense_backward
        self.env = env or {}
        self.import_timeout = import_timeout
        self.memory_limit = runner_memory_limit() if memory_limit is None else memory_limit
        # probed with this runner's own limit: an RLIMIT_DATA that works may break a smaller one
        self.isolation = confinement.isolation(tempfile.gettempdir(), self.memory_limit)
        self.uid = confinement.claim_uid() if self.isolation["mode"] in ("namespace", "uid") else None
        self.scratch_folder = ScratchFolder(submission, self.uid, kept_kernels)
        self.output = OutputTail()
        self.note(self.isolation["note"])
        self.process = None
        self.channel = None
        self.watchdog = None  # the running process's
        self.ready = None  # the runner's hello: functions found, or the import error (None: not yet)
        self._launched_at = 0.0
        self.calls = 0
        self.phases = {}
        self._timed_out = {}  # (op, slot, backward) -> (smallest case size that timed out, message)

    # -- the scratch folder ----------------------------------------------------------------
    def _copy_submission(self) -> Path:
        """The submission's private copy, made on first use; its notes go into the runner's log."""
        return self.scratch_folder.copy_submission(log=self.note)

    def note(self, note: str) -> None:
        self.output.write(f"[grader] {note}\n".encode())

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the runner and wait for its hello: the functions found, or the import error."""
        if self.process is None:
            self.launch()
        return self._await_ready()

    def launch(self) -> None:
        """Start the runner without waiting for it to import (`start` waits): two runners launched
        one after the other import side by side. Nothing is sent to it before its hello."""
        started = time.monotonic()
        self.ready = None
        try:
            root = self._copy_submission()
        except (OSError, shutil.Error) as exc:
            self.ready = {"import_error": f"the submission could not be copied: {str(exc)[:300]}"}
            return
        to_runner_r, to_runner_w = os.pipe()
        from_runner_r, from_runner_w = os.pipe()
        log_r, log_w = os.pipe()
        # -P: the submission's folder (the cwd) does not go first on sys.path, so a root-level
        # torch/ or triton/ cannot shadow the real ones; the runner adds it after importing them.
        argv = [sys.executable, "-P", "-m", "fa2_sandbox.runner.serve", str(to_runner_r), str(from_runner_w)]
        spec = self.scratch_folder.sandbox_spec(self.isolation, self.memory_limit) \
            if self.isolation.get("launcher", True) else None
        env = self.scratch_folder.runner_env(self.isolation, self.env)
        # Forked from a process that has imported torch and Triton (forked.py), confined the same
        # way; started afresh where no fork server can be had.
        server = forked.fork_server(env) if self.forked else None
        self.process = server.spawn(spec, root, env, (to_runner_r, from_runner_w, log_w)) if server else None
        if self.process is None:
            if server is not None:
                self.note(f"runner started afresh, not forked: {server.broken}")
            if spec is not None:
                argv = confinement.launch_command(spec, argv)
            self.process = subprocess.Popen(
                argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log_w, stderr=log_w,
                pass_fds=(to_runner_r, from_runner_w), start_new_session=True)
        for fd in (to_runner_r, from_runner_w, log_w):
            os.close(fd)
        self.watchdog = Watchdog(self.process, log_r, self.output, self.memory_limit, self.uid,
                                 name=f"runner-{self.submission.name}")
        self.watchdog.start()
        self.channel = Channel(from_runner_r, to_runner_w)
        self.channel.send({"root": str(root), "adapters_file": self.submission.adapters_file,
                           "extra_paths": self.submission.extra_paths, "exchange": str(self.scratch_folder.exchange),
                           "cpu_profile": bool(CPU_LOG)})
        self._launched_at = started

    def _await_ready(self) -> dict:
        """The hello of a launched runner (its import within the import timeout, from its launch)."""
        if self.ready is not None:  # the copy failed, or it is ready already
            return self.ready
        waited = time.monotonic() - self._launched_at
        reply = self._wait_done("import", max(0.0, self.import_timeout - waited), event="ready")
        if isinstance(reply, Reply):  # the runner hung or died while importing
            self.ready = {"import_error": f"{self.submission.adapters_file} could not be imported: {reply.message}"}
        else:
            self.ready = reply
            self._log_cpu(reply)
            # how long a start costs (Python, torch, triton, the adapters): bench/grade_speed.py reads it
            self.note(f"runner ready in {time.monotonic() - self._launched_at:.1f} s")
        if self.ready.get("import_error"):
            self.stop()
        return self.ready

    def stop(self) -> None:
        if self.process is not None:
            kill_runner(self.process, self.uid)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # stuck in the kernel (a GPU driver call): let it be
                pass
            if self.watchdog is not None:
                self.watchdog.stop()
        if self.channel is not None:
            self.channel.close()
        self.process = self.channel = self.watchdog = None

    def close(self) -> None:
        self.stop()
        self.scratch_folder.remove()
        if self.uid is not None:
            confinement.release_uid(self.uid)

    # -- calls -----------------------------------------------------------------------------
    def _died(self, phase: str, what: str = "") -> Reply:
        where = f"during {phase}" + (f" ({what})" if what else "")
        try:
            code = self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:  # closed its end of the channel and kept running
            self.stop()
            return Reply(outcomes.CRASH, f"closed the grader's result channel and kept running {where}")
        killed_for = self.watchdog.killed_for
        self.stop()
        if killed_for:
            return Reply(outcomes.CRASH, f"ran out of memory {where}: {killed_for}")
        if code == 71 and "sandbox could not be set up" in self.log_tail():
            return Reply(outcomes.CRASH, f"the grader could not start the runner's sandbox (see the log) {where}")
        how = f"process died with {signal_name(code)}" if code < 0 else f"exited with status {code}"
        return Reply(outcomes.CRASH, f"{how} {where}")

    def _wait_done(self, phase: str, timeout: float, event: str = "done", what: str = "", holding=None,
                   until: float | None = None):
        """Wait for the message `event`, following phase updates. A Reply means failure;
        `what` (the case) goes into its message; `until` (time.monotonic()): no pause is credited past it."""
        deadline = time.monotonic() + timeout
        suffix = f" ({what})" if what else ""
        watchdog = self.watchdog  # stop() drops it if the call fails
        watchdog.busy = True
        try:
            return self._wait(phase, deadline, timeout, event, what, suffix, holding, until)
        finally:
            watchdog.busy = False

    def _wait(self, phase, deadline, timeout, event, what, suffix, holding=None, until=None):
        self.phases = {}
        credited = 0.0  # seconds of pause already added to the deadline
        compiling = CompileCredit(timeout)  # an autotuner's compiles do not count either (compile_credit.py)
        while True:
            try:
                message = self.channel.receive(timeout=max(0.0, deadline - time.monotonic()))
            except ReceiveTimeout:
                paused = holding.paused_s() if holding is not None else 0.0
                owed = max(0.0, paused - credited) + compiling.owed()
                # A timing window stopped the runner, or it compiled an autotuner's configs: that time
                # does not count, up to `until`.
                if owed > 0 and (until is None or time.monotonic() < until):
                    # (at least a second on: a pause still under way would otherwise poll the ledger in a loop)
                    deadline = max(deadline + owed, time.monotonic() + 1.0)
                    deadline = deadline if until is None else min(deadline, until)
                    credited = max(credited, paused)
                    continue
                if self.watchdog.killed_for:  # the watchdog killed it just now
                    return self._died(phase, what)
                self.stop()  # the phases so far say how far it got (a timing budget's passes)
                more = (f"; {compiling.credited:.0f} s more were given for compiling an autotuner's configs"
                        if compiling.credited >= 1 else "")
                return Reply(outcomes.TIMEOUT, f"timed out after {timeout:g} s in {phase}{suffix}{more}",
                             phases=dict(self.phases))
            except ChannelClosed:
                return self._died(phase, what)
            except ValueError as exc:  # not JSON, or a line too long
                self.stop()
                return Reply(outcomes.CRASH, f"sent an invalid message on the grader's channel during {phase}{suffix}: "
                                      f"{str(exc)[:100]}")
            if not isinstance(message, dict):
                self.stop()
                return Reply(outcomes.CRASH, f"sent an invalid message on the grader's channel during {phase}{suffix}")
            if message.get("event") == "phase":
                if len(self.phases) < MAX_PHASES:
                    phase = str(message.get("phase"))[:40]
                    self.phases[phase] = time.monotonic()
            elif message.get("event") == "compiling":
                compiling.heard(message)
            elif message.get("event") == event:
                return message

    @staticmethod
    def _family(request: requests.Request) -> tuple:
        return request.op, getattr(request, "slot", None), getattr(request, "backward", True)

    def _after_a_timeout(self, request: requests.Request) -> "Reply | None":
        """The reply of a case at least as large as one that timed out (same op, slot and
        direction): it is not run, and fails at once with that timeout's message."""
        size, earlier = self._case_size(request), self._timed_out.get(self._family(request))
        if size is not None and earlier and size >= earlier[0]:
            return Reply(outcomes.TIMEOUT, f"not run: a smaller case already {earlier[1]}")
        return None

    @staticmethod
    def _case_size(request: requests.Request) -> int | None:
        return request.case.work if isinstance(request, requests.FlashRequest) else None

    def import_failure(self) -> "Reply | None":
        """The import_error Reply every call would get, or None. Like a call, it starts the runner
        if none is running (the first time, or after a crash), so the caller's thread starts it."""
        if self.submission.problem:
            return Reply(outcomes.IMPORT_ERROR, self.submission.problem)
        if self.ready is None or (self.process is None and not self.ready.get("import_error")):
            self.start()  # never started, launched and importing, or stopped since
        if self.ready and self.ready.get("import_error"):
            return Reply(outcomes.IMPORT_ERROR, self.ready["import_error"], traceback=self.ready.get("traceback", ""))
        return None

    def adapters_failure(self) -> "Reply | None":
        """What import_failure says, except that a runner whose adapters imported once is not started
        again only to ask (stopped after a timeout, say: the calls that need it start it)."""
        if self.process is None and self.ready is not None and not self.ready.get("import_error") \
                and not self.submission.problem:
            return None
        return self.import_failure()

    def gpu_allowance(self, request: requests.Request, dense_backward: bool | None = None) -> int | None:
        """The GPU memory a request may use (requests.Request.gpu_allowance), or None off the GPU;
        `dense_backward=False`: without room for N x N scores, what a tiled class needs."""
        return request.gpu_allowance(self.dense_backward if dense_backward is None else dense_backward)

    def call(self, request: requests.Request, timeout: float, what: str = "", until: float | None = None) -> Reply:
        """Send one request (see _call); on a GPU, admitted by its ledger (call_on_gpu). The runner
        starts before the reservation: its start (Python, torch, the student's imports) holds no
        GPU memory back from the others, and a window can then name its processes to pause.

        `until` (a time.monotonic() value): the call ends by then whatever held it, a wait for the
        GPU or a timing window's pause included; without it, the time a window paused the runner
        is added to `timeout`."""
        allowance = self.gpu_allowance(request) if self.gpu_ledger is not None else None
        if allowance is None:
            return self._call(request, timeout, what, until=until)
        if (skipped := self._after_a_timeout(request)) is not None:
            return skipped  # without starting the runner again that the timeout stopped
        if self.import_failure() is not None or self.process is None:
            return self._call(request, timeout, what, until=until)  # the import error, without holding the GPU
        return call_on_gpu(self.gpu_ledger,
                           lambda holding: self._call(request, timeout, what, holding, until, allowance),
                           allowance, f"{self.submission.name}: {request.op} {what}",
                           self.note, runner=self.identity, reserve=self.gpu_allowance(request, dense_backward=False))

    def identity(self) -> "dict | None":
        """This runner's processes as a timing window names them (watchdog.runner_identity), starting
        it if it is not running (after a crash, say); None if it cannot run."""
        if self.import_failure() is not None or self.process is None:
            return None
        return runner_identity(self.process, self.uid)

    def _call(self, request: requests.Request, timeout: float, what: str = "", holding=None,
              until: float | None = None, gpu_allowance: int | None = None) -> Reply:
        """Send one request; `what` describes the case for messages, e.g. 'N=4096, causal'.
        `holding` (gpu_ledger.Holding) says how long a timing window paused the runner: the
        call's deadline moves by as much, never past `until` (see call). The runner holds itself
        to `gpu_allowance` bytes of GPU memory (call_on_gpu).

        A case at least as large as one that already timed out (same op, slot and direction) is
        not run again: it fails at once with that timeout's message, so a submission that hangs
        costs a few timeouts, not one per case."""
        if self.submission.problem:
            return Reply(outcomes.IMPORT_ERROR, self.submission.problem)
        if self.ready and self.ready.get("import_error"):  # importing again would fail again
            return Reply(outcomes.IMPORT_ERROR, self.ready["import_error"], traceback=self.ready.get("traceback", ""))
        if (skipped := self._after_a_timeout(request)) is not None:
            return skipped
        size, family = self._case_size(request), self._family(request)
        earlier = self._timed_out.get(family)
        if self.process is None or self.ready is None:
            ready = self.start()
            if ready.get("import_error"):
                return Reply(outcomes.IMPORT_ERROR, ready["import_error"], traceback=ready.get("traceback", ""))
        if until is not None:  # what a wait for the GPU left of it
            timeout = round(max(0.0, min(timeout, until - time.monotonic())), 1)
        self.scratch_folder.share_kernels()
        self.calls += 1
        tag = f"call{self.calls}-{secrets.token_hex(4)}"  # unguessable: forged replies cannot match it
        try:
            self.channel.send(requests.envelope(request, tag, gpu_allowance))
        except BrokenPipeError:
            return self._died("setup", what)
        message = self._wait_done("setup", timeout, what=what, holding=holding, until=until)
        if isinstance(message, Reply):
            if message.timed_out and size is not None and self.learns_timeouts:
                if not earlier or size < earlier[0]:
                    self._timed_out[family] = (size, message.message)
            return message
        reply = self._reply(message, tag, what)
        self.scratch_folder.share_kernels()
        if reply.crashed or message.get("restart"):
            self.stop()  # out of memory, a poisoned CUDA context, a forged reply: start afresh
        return reply

    def _log_cpu(self, message: dict) -> None:
        """The runner's CPU by activity so far (fa2_sandbox/runner/cpu_profile.py), one line of
        GRADER_CPU_LOG: bench/grade_speed.py's account of a class reads it. Nothing is judged by it."""
        cpu = message.get("cpu")
        if not CPU_LOG or not isinstance(cpu, dict) or self.process is None:
            return
        line = {"pid": self.process.pid, "submission": self.submission.name, "at": time.time(),
                "worker": os.environ.get("PYTEST_XDIST_WORKER"), "worker_pid": os.getpid(),
                "cpu": {str(k): float(v) for k, v in cpu.items() if isinstance(v, (int, float))}}
        line["cpu"][kernel_cache.SHARED_KERNELS] = self.scratch_folder.kernels_from_others
        with open(CPU_LOG, "a") as f:
            f.write(json.dumps(line) + "\n")

    def _reply(self, message: dict, tag: str, what: str) -> Reply:
        self._log_cpu(message)
        where = f" during {next(reversed(self.phases), 'setup')}" + (f" ({what})" if what else "")
        if message.get("tag") != tag or message.get("status") not in outcomes.ANSWERED:
            return Reply(outcomes.CRASH, f"sent an invalid reply (not the answer to the request it was sent){where}")
        result = message.get("result") if isinstance(message.get("result"), dict) else {}
        text = str(message.get("message", ""))[:2000]
        seconds = message.get("seconds") if isinstance(message.get("seconds"), (int, float)) else 0.0
        reply = Reply(message["status"], text, result, str(message.get("traceback", ""))[:20000], seconds,
                      dict(self.phases))
        if isinstance(message.get("gpu_peak"), int) and message["gpu_peak"] > 0:
            reply.gpu_peak = message["gpu_peak"]
        if message.get("oom"):
            oom = message["oom"]
            oom = oom if oom in (outcomes.OOM_HOST, outcomes.OOM_GPU_FULL) else outcomes.OOM_GPU_ALLOWANCE
            if oom == outcomes.OOM_HOST:
                limit = f"; the runner's limit is {gib(self.memory_limit)}" if self.memory_limit else ""
                return Reply(outcomes.CRASH, f"ran out of memory{where}: {text}{limit}", traceback=reply.traceback,
                             oom=oom)
            allowance = message.get("gpu_allowance") if isinstance(message.get("gpu_allowance"), int) else 0
            own = oom == outcomes.OOM_GPU_ALLOWANCE and allowance
            allowed = f"; it was allowed {gib(allowance)} of GPU memory" if own else ""
            return Reply(outcomes.CRASH, f"ran out of GPU memory{where}: {text}{allowed}", traceback=reply.traceback,
                         oom=oom)
        if reply.ok and "tensors" in result:
            try:
                reply.tensors = wire_tensors.read(self.scratch_folder.exchange, result["tensors"], tag)
            except ValueError as exc:
                return Reply(outcomes.CRASH, f"sent back invalid tensors{where}: {exc}")
        return reply

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        if self.watchdog is not None:  # what the runner printed before its last reply, too
            self.watchdog.catch_up()
        return self.output.tail(limit)
