"""The state of the process that runs the checks (an xdist worker, or the one process of a run
without workers), WorkerState: the submissions, the rubric and the seed as the controller gives
them (grading/protocol.py), one runner per submission and track, the replies the checks share, the
GPU this process grades on and its ledger. A test sees it as a TrackSession: the same state, its
runner calls going to the runner of the test's track. The controller's own state (the reports
folder, the seed it draws there) is grading/controller.py's ControllerState."""
import json
import os
import threading
from contextlib import contextmanager
from functools import cached_property

import pytest
import torch

from fa2_sandbox.harness import forked, kernel_cache
from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import defined_functions, stub_functions
from fa2_sandbox.harness.gpu_ledger import GpuLedger, capacity_bytes, ledger_path
from fa2_sandbox.wire import outcomes
from grading import protocol, time_limit, tracks
from grading.checks.shared_oracles import SharedOracles
from grading.time_limit import SpentTime
from grading.tracks import Track


def warm_up_cuda(device: torch.device) -> None:
    """Create this process's CUDA context and load cuBLAS, as the float64 oracles will."""
    x = torch.ones(64, 64, dtype=torch.float64, device=device)
    (x @ x).sum().item()


class WorkerState:
    """What the grading tests of one process share, registered only where checks run (grading/
    pytest_plugin.py): it writes nothing under the reports folder, which is the controller's."""

    def __init__(self, config, settings: protocol.Settings):
        self.rubric, self.submissions, self.time_limit = settings.rubric, settings.submissions, settings.time_limit
        # Each submission's check time under a limit, in the folder the controller made for the run.
        self.spent = SpentTime(protocol.given(config, protocol.SPENT)) if self.time_limit is not None else None
        self.seed = protocol.given(config, protocol.SEED)
        # The CPU cases' oracles, computed once by the run's workers between them, where the
        # controller made room for them (under xdist).
        shared = protocol.given(config, protocol.ORACLES)
        self.oracles = SharedOracles(shared["path"], shared["key"]) if shared else None
        self.on_gpu = torch.cuda.is_available()
        # Workers share the cores, and so do their runners: without this each one's float64
        # oracles and each runner's matmuls would use every core at once.
        self.threads = max(1, usable_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
        torch.set_num_threads(self.threads)
        # The worker's own CUDA work (oracles, the timing check's SDPA) on its runners' GPU: left to
        # CUDA's default, every worker's went to GPU 0 of a host of two.
        if os.environ.get("PYTEST_XDIST_WORKER") and (gpu := self.worker_gpu()) is not None:
            torch.cuda.set_device(gpu)
        # A worker's first CUDA work (its context, cuBLAS) takes seconds; started now, it overlaps
        # the start of the first runner, which the first oracle otherwise waits behind.
        if os.environ.get("PYTEST_XDIST_WORKER") and self.on_gpu:
            device = torch.device("cuda", torch.cuda.current_device())
            threading.Thread(target=warm_up_cuda, args=(device,), name="warm-up-cuda", daemon=True).start()
        self.functions = {s.name: defined_functions(s) for s in self.submissions}
        self.stubs = {s.name: stub_functions(s) for s in self.submissions}
        # On a GPU, under xdist, several workers share one submission (grading/tracks.py): each
        # (submission, track) has its runner, and a test's calls name its track (TrackSession).
        # On a CPU there is no compiling to spread, only runner starts to add.
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
        self.split_into_tracks = self.on_gpu and workers > 1
        self.per_kernel_tracks = tracks.per_kernel_tracks(len(self.submissions), workers)
        self._runners = {}  # (submission name, track) -> SubmissionRunner
        self._kept = {}  # name -> a runner of the grader's own code, kept for the session (keep)
        self._replies = {}  # ((submission name, track), the request as sent) -> (Reply, tensors)
        self._current = None
        self.runner_facts = {}  # submission name -> facts for info.json not yet sent to the controller
        self.autotuning = set()  # submissions whose Triton slot autotuned in a runner of this process

    def _switch_to(self, name: str, track: Track):
        """A worker grades one submission track's checks together (loadgroup): when the next one
        starts, close the last one's runner and drop its tensors, so a class of 100 holds one at a time."""
        key = (name, track)
        if key == self._current:
            return
        for other in [k for k in self._runners if k != key]:
            self._runners.pop(other).close()
        self._replies = {reply_key: value for reply_key, value in self._replies.items() if reply_key[0] == key}
        self._current = key

    def worker_env(self) -> dict:
        """What a runner of this worker gets besides the harness's own environment: the Triton
        interpreter without a GPU, this worker's GPU on a host of several, its share of the cores."""
        env = {} if self.on_gpu else {"TRITON_INTERPRET": "1"}
        if (gpu := self.worker_gpu()) is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["OMP_NUM_THREADS"] = str(self.threads)
        return env

    def worker_gpu(self):
        """This worker's GPU on a host of several (workers pinned round-robin), else None."""
        if not self.on_gpu or torch.cuda.device_count() < 2 or "CUDA_VISIBLE_DEVICES" in os.environ:
            return None
        return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0) % torch.cuda.device_count()

    @cached_property
    def gpu_ledger(self):
        """The ledger of this worker's GPU (fa2_sandbox/harness/gpu_ledger.py), shared with the
        workers and runners on it; None without a GPU. Made on first use, by the first runner or
        oracle: reading the device's size creates a CUDA context."""
        if not self.on_gpu:
            return None
        gpu = self.worker_gpu() or 0
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
        on_this_gpu = -(-workers // torch.cuda.device_count())
        return GpuLedger(ledger_path(gpu), capacity_bytes(torch.cuda.get_device_properties(gpu).total_memory,
                                                          on_this_gpu))

    @contextmanager
    def gpu_work(self, nbytes: int, what: str):
        """The worker's own GPU work (an oracle) under a reservation of `nbytes`; its cached memory
        goes back to the GPU after. On a CPU, nothing."""
        if self.gpu_ledger is None:
            yield
            return
        with self.gpu_ledger.reserve(nbytes, f"worker {os.environ.get('PYTEST_XDIST_WORKER', '')}: {what}"):
            try:
                yield
            finally:
                torch.cuda.empty_cache()

    def kept_kernels(self, root, track_name: str):
        """Where a runner's compiled kernels are kept between runs (kernel_cache.py): on a GPU only,
        where compiling and autotuning cost seconds per kernel; the interpreter compiles nothing."""
        return kernel_cache.kept_cache(root, track_name) if self.on_gpu else None

    def runner(self, submission, track: Track) -> SubmissionRunner:
        """The runner of `submission`'s `track`, started on first use."""
        self._switch_to(submission.name, track)
        key = (submission.name, track)
        if key not in self._runners:
            # Every student's runner is forked, its timing runner too: forked, the students' Triton
            # passes read as they did started afresh, where a forked reference's did not, so the
            # reference's runner alone starts afresh (test_timing.reference_runner; notes/grading-speed.md,
            # "forked timing runners measured and left out").
            self._runners[key] = SubmissionRunner(submission, env=self.worker_env(),
                                                  import_timeout=self.rubric.timeout("import"),
                                                  kept_kernels=self.kept_kernels(submission.root, track.name),
                                                  gpu_ledger=self.gpu_ledger)
        return self._runners[key]

    def fail_if_unimportable(self, check, submission, track: Track):
        """Fail `check` with the import error when the submission's adapters do not import: every
        check of every part then says that one sentence, whatever the check or its part would
        otherwise find (a stub, an adapter missing, a GPU needed). Starts the runner if none ran yet."""
        runner = self.runner(submission, track)
        if (failure := runner.adapters_failure()) is not None:
            self.note_runner(submission, track, runner, failure)
            check.settle_reply(failure)

    def cut_if_out_of_time(self, check, position: int):
        """Cut an advice check whose turn comes once its submission's checks before it (`position`, in
        the run's order of checks) have taken more than --time-limit (grading/time_limit.py): it fails
        and earns nothing, and its points stay in its group. A requirement check is never cut, nor a
        timing check."""
        if self.time_limit is None or time_limit.exempt(check.record):
            return
        spent = self.spent.of(check.record.submission, before=position)
        if spent < self.time_limit:
            return
        check.fail(time_limit.cut_diagnosis(self.time_limit, spent), outcome=outcomes.TIMEOUT)

    def fail_if_stub(self, check, submission, function: str):
        """Fail `check` as not attempted when `function` is the template's NotImplementedError stub
        (the check fixture has already failed it if the adapters do not even import)."""
        if function not in self.stubs[submission.name]:
            return
        check.fail(f"not attempted: {function} raises NotImplementedError in {submission.adapters_file}.",
                   outcome=outcomes.NOT_ATTEMPTED)

    def call_cached(self, submission, track: Track, request, timeout, what):
        """One runner call shared by the checks that make the same request (forward and backward,
        say): the same fields, as the runner is sent them."""
        self._switch_to(submission.name, track)
        asked = json.dumps(request.to_json(), sort_keys=True)
        key = ((submission.name, track), asked)  # replies never cross submissions or tracks
        if key not in self._replies:
            runner = self.runner(submission, track)
            reply = runner.call(request, timeout, what)
            tensors = reply.tensors if reply.ok else {}
            self._replies[key] = (reply, tensors)
            self.note_runner(submission, track, runner, reply)
        return self._replies[key]

    def note_runner(self, submission, track: Track, runner, reply):
        """Keep the runner's facts for info.json; the plugin sends them to the controller on the
        test's report, and the controller alone writes the file."""
        ungradable = reply.message if reply.import_failed else None
        if submission.problem:
            ungradable = submission.problem
        facts = self.runner_facts.setdefault(submission.name, {"submission": submission.name})
        if ungradable is not None:
            facts["ungradable"] = ungradable
        # One tail per runner: split into tracks, a submission has a runner per track (grading/tracks.py).
        facts.setdefault("runner_logs", {})[track.name] = runner.log_tail()
        # Which confinement held the student's code, for the report to say in words (never silently).
        facts["isolation"] = {"mode": runner.isolation["mode"], "note": runner.isolation["note"][:600]}
        # Not for info.json: the scheduler's (GradingScheduling.autotuned), which starts an autotuning
        # slot's largest kernels early. Asked until the answer is yes: a look at the cache's folders.
        if track.kind in tracks.TRITON_CASES and submission.name not in self.autotuning \
                and runner.scratch_folder.autotuned():
            self.autotuning.add(submission.name)
            facts["autotunes"] = True

    def forget(self, name: str):
        """Drop a submission's cached replies and close its runners: a retry starts afresh."""
        self._replies = {key: value for key, value in self._replies.items() if key[0][0] != name}
        for key in [k for k in self._runners if k[0] == name]:
            try:
                self._runners.pop(key).close()
            except Exception:
                pass

    def keep(self, name: str, start) -> SubmissionRunner:
        """A runner of the grader's own code (`start()` makes it), kept for this process's session:
        unlike a student's, it outlives the submission track that first asked for it."""
        if name not in self._kept:
            self._kept[name] = start()
        return self._kept[name]

    def close(self):
        for runner in [*self._runners.values(), *self._kept.values()]:
            runner.close()
        # Now, not at the interpreter's exit: an xdist worker can be gone before its atexit
        # handlers have ended a server, and that server's folder stayed in the temporary folder.
        forked.close_all()


class TrackSession:
    """The grading session as one test sees it: the process's WorkerState (its seed, rubric, GPU
    and the rest, read through), with the test's runner calls going to the runner of its track, which
    the worker's plugin gave the test at collection (grading/tracks.py)."""

    def __init__(self, session: WorkerState, track: Track):
        self._session = session
        self.track = track

    def __getattr__(self, name):  # everything but the calls below is the process's session's
        return getattr(self._session, name)

    def runner(self, submission) -> SubmissionRunner:
        return self._session.runner(submission, self.track)

    def call_cached(self, submission, request, timeout, what):
        return self._session.call_cached(submission, self.track, request, timeout, what)

    def fail_if_unimportable(self, check, submission):
        self._session.fail_if_unimportable(check, submission, self.track)


def usable_cores() -> int:
    """The cores this process may run on: its affinity where the OS has one (taskset, the cpuset
    Slurm gives a job), which os.cpu_count() ignores: a job given 8 cores of a 64-core node
    would otherwise run 64 / workers threads in each of its workers and runners."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


# Where checks run, the process's WorkerState, for the fixtures (grading/fixtures.py) and the worker's plugin.
WORKER_STATE = pytest.StashKey[WorkerState]()
