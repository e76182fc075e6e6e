"""The grading plugin: active only under `pytest --impl PATH`.

It parametrizes the suite over submissions, keeps one runner per group of checks per worker,
records each check the moment it finishes, and at the end of the session assembles every
submission's results.json, builds the HTML reports and prints where the time went. Under xdist
(`--dist loadgroup`) a group's checks stay on one worker, so its runner starts once, but for the
tail of a group that proves slow, which idle workers share (grading/scheduler.py); a group is one
shard of a submission (grading/shards.py), so one submission spreads over workers too.

Only the controller writes under reports/ (grading/results/store.py says which file is
whose): workers send what they find on the test reports' user_properties, the check record as
"grading_check" (CheckRecord.to_json(): user_properties must stay plain JSON data), the runner's
facts as "grading_runner" and, once, the tests they collected as "grading_collected".

An exception raised by the grader's own code in a test (the harness, the oracle, a file read)
is not the student's failure: the test is run once more, and if the grader fails again the
check is recorded as "grader_error", unscored, and the submission is marked incomplete. What the
student's code does wrong reaches the tests as a runner Reply and fails through Check.fail.
"""
import os
import platform
import shutil
import tempfile
import threading
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import pytest
import torch

from fa2_sandbox.harness import kernel_cache, shared_probe
from fa2_sandbox.harness.client import SubmissionRunner, runner_memory_limit
from fa2_sandbox.harness.discover import defined_functions, find_submissions, stub_functions
from fa2_sandbox.harness.gpu_ledger import GpuLedger, capacity_bytes, ledger_path
from fa2_sandbox.wire import outcomes
from grading import shards
from grading.durations import Durations
from grading.results import scoring, store
from grading.results.record import GRADER_ERROR, NOT_GRADED_HERE, CheckRecord, grader_error_diagnosis
from grading.rubric import Rubric, RubricError
from reporting.build import build_reports


def check_id(item) -> str:
    """A grading test's id in the records: its module's name and its name,
    "grading.checks.test_flash::test_forward[alice-...]". Not pytest's node id, a path from the
    rootdir, which a checkout and an installed package (or two rootdirs) would give two ways."""
    return f"{item.module.__name__}::{item.name}"


def case_data(case) -> tuple:
    """(id, fields) of a check's case: a case id alone (fields {}), an object with `.id` and
    `.to_json()` (fa2_sandbox.wire.cases.FlashCase), whose fields become plain JSON data, or
    (id, such an object): its fields under an id of the test's own ("triton-<case id>", say)."""
    if isinstance(case, str):
        return case, {}
    label, case = case if isinstance(case, tuple) else (case.id, case)
    fields = {key: list(value) if isinstance(value, tuple) else value for key, value in case.to_json().items()}
    return label, fields


def warm_up_cuda(device: torch.device) -> None:
    """Create this process's CUDA context and load cuBLAS, as the float64 oracles will."""
    x = torch.ones(64, 64, dtype=torch.float64, device=device)
    (x @ x).sum().item()


class Check:
    """What one test found, as a CheckRecord (`.record`). Tests fill it through fail, ok, skip,
    update and settle_reply; the plugin settles it when the test's report comes."""

    def __init__(self, submission, part, check, case, tier, rubric):
        case_id, case_fields = case_data(case)
        group = rubric.group_of(part, check, tier)
        self.record = CheckRecord(submission=submission.name, part=part, check=check, case=case_id,
                                  case_fields=case_fields, tier=tier, group=group,
                                  source=rubric.source(group), advice=rubric.advice(group))

    def update(self, **fields):
        self.record.update(**fields)

    def fail(self, diagnosis: str, evidence: str = "", outcome: str = outcomes.FAILED, **details):
        self.update(outcome=outcome, diagnosis=diagnosis,
                    output=diagnosis + ("\n" + evidence if evidence else ""), **details)
        pytest.fail(self.record.output, pytrace=False)

    def ok(self, note: str = "", **details):
        self.update(outcome=outcomes.PASSED, output=note or "passed", **details)

    def skip(self, reason: str):
        """The check does not apply to this submission (an adapter of the other template): 0 of 0."""
        self.update(outcome=outcomes.SKIPPED, output=f"skipped: {reason}")
        pytest.skip(reason)

    def not_measured(self, reason: str):
        """What the check measures cannot be read from this submission's structure (an optimizer
        with no .state, a wrapper with no buffers to read, a replay with no first answer): neither
        passed nor failed, 0 of 0, like a skipped check, so it can never cost the submission a
        requirement; a group none of whose checks was measured shares its points out (Rubric.weights)."""
        self.update(outcome=outcomes.SKIPPED, output=f"could not be measured: {reason}")
        pytest.skip(f"could not be measured: {reason}")

    def not_here(self, reason: str):
        """The check cannot run on this machine (it needs a GPU): it keeps its share of the maximum
        and scores nothing until graded where it can run, so the total is provisional."""
        self.update(outcome=NOT_GRADED_HERE, output=f"not graded here: {reason}")
        pytest.skip(f"not graded here: {reason}")

    def settle_reply(self, reply):
        """Fail the check if the runner call itself went wrong; otherwise return quietly."""
        self.update(seconds=reply.seconds)
        if reply.ok:
            return
        outcome = outcomes.outcome_of_call(reply.status)
        if outcome == outcomes.NOT_ATTEMPTED:
            self.fail(f"not attempted: {reply.message}", outcome=outcome)
        if outcome == outcomes.ERROR:
            self.fail(f"raised {reply.message}", reply.traceback, outcome=outcome)
        self.fail(reply.message, outcome=outcome)


class Grading:
    """Session state shared by the grading tests of one process (controller or worker)."""

    def __init__(self, config):
        self.config = config
        try:
            self.rubric = Rubric(config.getoption("--rubric"))
        except RubricError as exc:  # pytest prints it, without a traceback, and exits with status 4
            raise pytest.UsageError(str(exc)) from None
        self.reports = Path(config.getoption("--reports"))
        self.seed = grading_seed(config, self.reports)
        self.on_gpu = torch.cuda.is_available()
        # Workers share the cores, and so do their runners: without this each one's float64
        # oracles and each runner's matmuls would use every core at once.
        self.threads = max(1, usable_cores() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
        torch.set_num_threads(self.threads)
        # The worker's own CUDA work (oracles, the timing check's SDPA) on its runners' GPU: on two
        # H200s every worker's went to GPU 0 (22 processes there, 2 on the other, most of a run).
        if os.environ.get("PYTEST_XDIST_WORKER") and (gpu := self.worker_gpu()) is not None:
            torch.cuda.set_device(gpu)
        # A worker's first CUDA work (its context, cuBLAS) takes seconds; started now, it overlaps
        # the start of the first runner, which the first oracle otherwise waits behind.
        if os.environ.get("PYTEST_XDIST_WORKER") and self.on_gpu:
            device = torch.device("cuda", torch.cuda.current_device())
            threading.Thread(target=warm_up_cuda, args=(device,), name="warm-up-cuda", daemon=True).start()
        self.submissions = find_submissions(config.getoption("--impl"))
        self.functions = {s.name: defined_functions(s) for s in self.submissions}
        self.stubs = {s.name: stub_functions(s) for s in self.submissions}
        # On a GPU, under xdist, several workers share one submission (grading/shards.py);
        # the plugin sets the shard of the test under way, and each (submission, shard) has its
        # runner. On a CPU there is no compiling to spread, only runner starts to add.
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
        self.sharded = self.on_gpu and workers > 1
        self.per_kernel_shards = shards.per_kernel_shards(len(self.submissions), workers)
        self.shard = ""
        self._runners = {}  # (submission name, shard) -> SubmissionRunner
        self._kept = {}  # name -> a runner of the grader's own code, kept for the session (keep)
        self._replies = {}  # ((submission name, shard), call key) -> (Reply, tensors)
        self._current = None
        self.runner_facts = {}  # submission name -> facts for info.json not yet sent to the controller

    def _switch_to(self, name: str):
        """A worker grades one group's checks together (loadgroup): when the next group starts,
        close the last one's runner and drop its tensors, so a class of 100 holds one at a time."""
        group = (name, self.shard)
        if group == self._current:
            return
        for other in [g for g in self._runners if g != group]:
            self._runners.pop(other).close()
        self._replies = {key: value for key, value in self._replies.items() if key[0] == group}
        self._current = group

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
        workers and runners on it; None without a GPU. Made on first use: the controller never
        needs it, and reading the device's size creates a CUDA context."""
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

    def kept_kernels(self, root, shard: str):
        """Where a runner's compiled kernels are kept between runs (kernel_cache.py): on a GPU only,
        where compiling and autotuning cost seconds per kernel; the interpreter compiles nothing."""
        return kernel_cache.kept_cache(root, shard) if self.on_gpu else None

    def runner(self, submission) -> SubmissionRunner:
        self._switch_to(submission.name)
        group = (submission.name, self.shard)
        if group not in self._runners:
            self._runners[group] = SubmissionRunner(submission, env=self.worker_env(),
                                                    import_timeout=self.rubric.timeout("import"),
                                                    kept_kernels=self.kept_kernels(submission.root, self.shard),
                                                    gpu_ledger=self.gpu_ledger)
        return self._runners[group]

    def fail_if_stub(self, check, submission, function: str):
        """Fail `check` as not attempted when `function` is the template's NotImplementedError stub,
        unless the adapters do not even import: that, not the stub, is then the finding."""
        if function not in self.stubs[submission.name]:
            return
        runner = self.runner(submission)
        if (failure := runner.import_failure()) is not None:
            self.note_runner(submission, runner, failure)
            check.settle_reply(failure)
        check.fail(f"not attempted: {function} raises NotImplementedError in {submission.adapters_file}.",
                   outcome=outcomes.NOT_ATTEMPTED)

    def call_cached(self, submission, key, request, timeout, what):
        """One runner call shared by the checks that need it (forward and backward, say)."""
        self._switch_to(submission.name)
        key = ((submission.name, self.shard), key)  # replies never cross submissions or shards
        if key not in self._replies:
            runner = self.runner(submission)
            reply = runner.call(request, timeout, what)
            tensors = reply.tensors if reply.ok else {}
            self._replies[key] = (reply, tensors)
            self.note_runner(submission, runner, reply)
        return self._replies[key]

    def note_runner(self, submission, runner, reply):
        """Keep the runner's facts for info.json; the plugin sends them to the controller on the
        test's report, and the controller alone writes the file."""
        ungradable = reply.message if reply.status == "import_error" else None
        if submission.problem:
            ungradable = submission.problem
        facts = self.runner_facts.setdefault(submission.name, {"submission": submission.name})
        if ungradable is not None:
            facts["ungradable"] = ungradable
        # One tail per runner: under sharding a submission has a runner per shard (grading/shards.py).
        facts.setdefault("runner_logs", {})[self.shard] = runner.log_tail()
        # Which confinement held the student's code, for the report to say in words (never silently).
        facts["isolation"] = {"mode": runner.isolation["mode"], "note": runner.isolation["note"][:600]}

    def forget(self, name: str):
        """Drop a submission's cached replies and close its runners: a retry starts afresh."""
        self._replies = {key: value for key, value in self._replies.items() if key[0][0] != name}
        for group in [g for g in self._runners if g[0] == name]:
            try:
                self._runners.pop(group).close()
            except Exception:
                pass

    def keep(self, name: str, start) -> SubmissionRunner:
        """A runner of the grader's own code (`start()` makes it), kept for this process's session:
        unlike a student's, it outlives the group that first asked for it."""
        if name not in self._kept:
            self._kept[name] = start()
        return self._kept[name]

    def close(self):
        for runner in [*self._runners.values(), *self._kept.values()]:
            runner.close()


LOG_TAILS_CHARS = 24000  # all of a submission's runner logs together, in results.json


def joined_logs(logs: dict) -> str:
    """The runners' log tails as one text: one runner's as it is; several (one per shard) each
    under its shard's name, the last LOG_TAILS_CHARS / n characters of each."""
    if len(logs) == 1:
        return next(iter(logs.values()))
    share = LOG_TAILS_CHARS // len(logs)
    return "\n".join(f"--- the runner of {shard or 'the submission'} ---\n{tail[-share:]}"
                     for shard, tail in sorted(logs.items()))


def usable_cores() -> int:
    """The cores this process may run on: its affinity where the OS has one (taskset, the cpuset
    Slurm gives a job), which os.cpu_count() ignores: a job given 8 cores of a 64-core node
    would otherwise run 64 / workers threads in each of its workers and runners."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def grading_seed(config, reports: Path) -> int:
    """--seed when given; in an xdist worker, the controller's (pytest_configure_node); else the
    reports folder's secret seed."""
    if (seed := config.getoption("--seed")) is not None:
        return seed
    if hasattr(config, "workerinput"):
        return config.workerinput["grading_seed"]
    return store.secret_seed(reports)


def environment(on_gpu: bool) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
            "triton": triton_version, "triton_interpreter": not on_gpu, "python": platform.python_version()}


def submission_of(item):
    """The name of the submission a grading test grades, or None for any other test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "submission" not in callspec.params:
        return None
    return callspec.params["submission"].name


# The grader's own code, as a traceback names it: a checkout's folders or the installed packages.
GRADER_ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = [str(GRADER_ROOT / name) + os.sep for name in ("grading", "fa2_sandbox", "reference", "reporting")]


def describe(exc: BaseException) -> str:
    """'KeyError: 'o' at grading/checks/test_flash.py:97': the error and where the grader raised it."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 300:
        text = text[:297] + "..."
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(tuple(OWN_PACKAGES))]
    frame = (ours or frames or [None])[-1]
    if frame is not None:
        where = os.path.relpath(frame.filename, GRADER_ROOT) if frame in ours else frame.filename
        text += f" at {where}:{frame.lineno}"
    return text


CHECKS = Path(__file__).resolve().with_name("checks")


def reaches_checks(config, arg: str) -> bool:
    """Whether collecting `arg` (a path, or path::test) may collect checks: it is the checks'
    folder, inside it, or a folder holding it (a checkout's root, say)."""
    path = (config.invocation_params.dir / arg.split("::", 1)[0]).resolve()
    return path.is_relative_to(CHECKS) or CHECKS.is_relative_to(path)


def narrowed(config) -> bool:
    """Whether the run selects part of what it collects (-k, -m, --deselect, --lf): then a worker
    reporting no test after the selection has still collected checks."""
    option = config.option
    return bool(option.keyword or option.markexpr or getattr(option, "deselect", None)
                or getattr(option, "lf", False))


# The session's grading state, for the fixtures (grading/fixtures.py) and the hooks below.
GRADING = pytest.StashKey[Grading]()


class GradingPlugin:
    """Registered by grading/pytest_plugin.py under --impl, in the controller and in each worker."""

    def __init__(self, config):
        self.config = config
        self.state = config.stash[GRADING] = Grading(config)
        self.is_worker = hasattr(config, "workerinput")
        self.started = time.monotonic()
        self.pending = {}  # submission name -> checks not yet reported (controller only)
        # Test ids collected this session per submission, before -k / --deselect, and the modules
        # collected whole: what a complete result needs, and which old records are stale (see
        # store.current_records). Workers collect; the controller learns it from their reports.
        self.collected = {}
        self.modules = set()
        self._collected_sent = False
        self.info = {}  # submission name -> its info.json (controller only: the file's one writer)
        self.durations = Durations()  # controller only
        self._runner_seen = set()
        self._probe = None  # controller only: the isolation probe its workers share (shared_probe.py)
        self._failures_not_shown = False  # controller only: pytest's FAILURES section left to the reports
        self.no_checks = False  # controller only: this session collected no check, so it writes nothing
        self.scheduler = None  # controller only, under xdist: grading/scheduler.py's, which says what it spread
        if self.is_worker and (probe := config.workerinput.get("isolation_probe")):
            shared_probe.adopt(Path(probe["path"]), probe["question"])

    # -- setup -----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        # A submission's checks share one worker (and one runner): the controller schedules by
        # group, and workers tag each test id with its group, which they do only under loadgroup.
        if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load"):
            config.option.dist = "loadgroup"
        # Groups go out in collection order, which puts the longest first (the sort below), not
        # the most tests first, xdist's default since 3.6: that sent a submission's one-test
        # timing shard (60 s) last, and on an H100 a lone submission ended 40 s later for it.
        if hasattr(config.option, "loadscopereorder"):
            config.option.loadscopereorder = False
        if self.is_worker:
            config.option.loadgroup = True
        elif self.failures_left_to_reports(config):
            config.option.tbstyle = "no"
            self._failures_not_shown = True

    def failures_left_to_reports(self, config) -> bool:
        """A class's failures go to the reports alone, not to pytest's FAILURES section too: it is
        thousands of entries there, and pytest spends time quadratic in the number of tests on it
        (each failure scans every report for its teardown sections, pytest-dev/pytest#13360: tens of
        seconds after a class, notes/grading-speed.md). One submission keeps it, for the student who
        reads it; so does a run given --tb."""
        given = any(arg.startswith("--tb") for arg in config.invocation_params.args)
        return len(self.state.submissions) > 1 and not given and config.option.tbstyle == "auto"

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """xdist, in the controller: every worker draws its inputs from the controller's seed, and
        takes the sandbox's isolation from one probe the controller runs while they start."""
        node.workerinput["grading_seed"] = self.state.seed
        if self._probe is None:
            path = Path(tempfile.mkdtemp(prefix="fa2-isolation-")) / "answer.json"
            limit = runner_memory_limit(node.workerinput["workercount"])  # what each worker's runners get
            shared_probe.start(path, tempfile.gettempdir(), limit)
            self._probe = {"path": str(path), "question": shared_probe.question(tempfile.gettempdir(), limit)}
        node.workerinput["isolation_probe"] = self._probe

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config, log):
        """xdist, in the controller: loadgroup's order, with timing groups spread out and capped per
        GPU, and a group that proves slow shared with idle workers (grading/scheduler.py)."""
        if self.is_worker or config.getvalue("dist") != "loadgroup":
            return None
        from grading.scheduler import GradingScheduling  # xdist's: imported only where xdist runs

        pinned = self.state.on_gpu and "CUDA_VISIBLE_DEVICES" not in os.environ  # as Grading.worker_gpu
        self.scheduler = GradingScheduling(config, log, gpus=torch.cuda.device_count() if pinned else 1,
                                           on_steal=lambda steal: self._say(steal.line()))
        return self.scheduler

    def pytest_sessionstart(self, session):
        if self.is_worker:
            return
        if not self.config.option.pyargs and not any(reaches_checks(self.config, arg) for arg in self.config.args):
            self.no_checks = True  # nothing of this session goes under reports/
            raise pytest.UsageError(
                f"grading collects no check: none of the paths given ({' '.join(self.config.args)}) holds the "
                f"grader's checks, which are in {CHECKS}. Leave the paths out (`pytest --impl DIR` grades "
                f"every check) or name files of that folder; -k selects checks by name.")
        if self.config.option.collectonly:
            return
        self._show_rubric()
        # Check files are kept: a check this session does not run keeps its last result, and one
        # it runs is overwritten (scoring.assemble decides which records are current). The
        # runner's facts stay too until this session's runner replaces them.
        for s in self.state.submissions:
            old = store.read_info(self.state.reports, s.name)
            self.info[s.name] = {
                "student": s.student, "student_id": s.student_id, "email": s.email, "students": s.students,
                "seed": self.state.seed,
                "ungradable": s.problem or old.get("ungradable"),
                "environment": environment(self.state.on_gpu), "notes": s.notes,
                **{key: old[key] for key in ("runner_log_tail", "runner_logs") if old.get(key)}}
            store.write_info(self.state.reports, s.name, self.info[s.name])
        names = ", ".join(s.name for s in self.state.submissions) or "none"
        self._say(f"grading {len(self.state.submissions)} submission(s) with seed {self.state.seed}: {names}")

    def pytest_generate_tests(self, metafunc):
        if "submission" in metafunc.fixturenames:
            subs = self.state.submissions
            metafunc.parametrize("submission", subs, ids=[s.name for s in subs], scope="session")

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker tags ids with the group, and before -k
    def pytest_collection_modifyitems(self, config, items):
        try:
            self._note_collected(config, items)
        finally:
            if not self.is_worker and not self.collected:  # without xdist: the controller collects
                self._stop_without_checks(f"{len(items)} other test(s)" if items else "nothing")

    def _stop_without_checks(self, found: str):
        """Grading that collected no check stops (exit status 4) and writes no report."""
        self.no_checks = True
        raise pytest.UsageError(f"grading collected no check: {found} from {' '.join(self.config.args)}, where "
                                f"the grader's checks ({CHECKS}) were expected. Nothing was graded and no report "
                                f"was written; see the collection errors above, if any.")

    def _note_collected(self, config, items):
        # Modules named with "::" on the command line (one test, one case) were not collected
        # whole: their other tests' records are kept, never judged stale.
        partial = {(config.invocation_params.dir / arg.split("::", 1)[0]).resolve()
                   for arg in config.args if "::" in arg}
        # The marker is xdist's: without the plugin (-p no:xdist) pytest would warn it is unknown.
        grouping = config.pluginmanager.hasplugin("xdist")
        # --lf drops the tests that passed last time while collecting, before this hook runs
        # (pytest's LFPluginCollWrapper): no module is collected whole then, so the checks it
        # leaves out keep their records, as with tests named by id.
        last_failed = bool(config.getoption("lf", False))
        for item in items:
            name = submission_of(item)
            if name is not None:
                item.grading_shard = shards.shard_of(item, self.state.stubs[name], self.state.per_kernel_shards) \
                    if self.state.sharded else ""
                if grouping:
                    item.add_marker(pytest.mark.xdist_group(shards.group_name(name, item.grading_shard)))
                item.grading_nodeid = check_id(item)  # the records' id (the node id would end in xdist's "@group")
                self.collected.setdefault(name, set()).add(item.grading_nodeid)
                if not last_failed and not (partial and item.path.resolve() in partial):
                    self.modules.add(item.module.__name__)
        if not self.is_worker:
            self._save_collected()

    # Last: pytest's own hook (fixtures.py, reorder_items) regroups the items by the session-scoped
    # `submission` parameter after every tryfirst hook, which undid this sort on an H100 run: a
    # lone submission's shards went out in the order of its test modules, its one-test Triton
    # timing shard (the longest) among the last.
    @pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
    def pytest_collection_modifyitems_heavy_first(self, items):
        # Every worker sorts alike, as xdist requires (the sorts are stable).
        if self.state.sharded:
            items.sort(key=lambda item: shards.cost_rank(getattr(item, "grading_shard", "")))
        else:  # a runner's distributed checks one after another: its ranks serve them all
            items.sort(key=lambda item: not (submission_of(item) and shards.is_distributed(item)))

        def group_of(item):
            name = submission_of(item)
            return shards.group_name(name, getattr(item, "grading_shard", "")) if name is not None else None

        shards.groups_together(items, group_of)
        shards.smallest_case_first(items, group_of)
        shards.memory_early(items, group_of)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        self.state.shard = getattr(item, "grading_shard", "")  # the runner this test's calls go to

    # -- recording -------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """Run a grading test; if the grader's own code raises, run it once more from scratch."""
        name = submission_of(item)
        if name is None:
            return (yield)
        try:
            return (yield)
        except Exception as exc:  # Check.fail / skip raise pytest's outcomes, which are not Exceptions
            first = describe(exc)
        self.state.forget(name)
        item.grading_check = None
        try:
            item.runtest()
        except Exception as exc:
            item.grading_fault = [first, describe(exc)]
            raise
        finally:
            item.grading_retried = first
        return None

    @staticmethod
    def _stand_in(item, name) -> CheckRecord:
        """A record for a grading test that failed before it made its check (in a fixture, say)."""
        case = item.callspec.id.replace(name, "", 1).replace("--", "-").strip("-")
        return CheckRecord(submission=name, part="grader", check=item.originalname, case=case, stand_in=True)

    def _record(self, item, report, call, name):
        """The check record this report settles, or None (teardown, or nothing to record)."""
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return None
        check = getattr(item, "grading_check", None)
        if check is None and report.passed:
            return None
        record = check.record if check is not None else self._stand_in(item, name)
        fault = getattr(item, "grading_fault", None)
        if report.passed and record.outcome == "error" and not record.diagnosis:
            record.update(outcome=outcomes.PASSED, output=record.output or "passed")
        elif report.skipped and record.outcome not in (outcomes.SKIPPED, NOT_GRADED_HERE):
            reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            record.update(outcome=outcomes.SKIPPED, output=f"skipped: {reason}")
        elif report.failed and (fault or report.when == "setup" or not record.diagnosis):
            if not fault:  # failed in setup (not retried), or through pytest.fail outside Check
                if call.excinfo is not None:
                    message = describe(call.excinfo.value)
                else:
                    message = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else "failed"
                fault = [message + (" (in setup)" if report.when == "setup" else "")]
            record.update(outcome=GRADER_ERROR, diagnosis=grader_error_diagnosis(fault),
                          output=str(report.longrepr)[-20000:], attempts=fault)  # the traceback, for staff
        if getattr(item, "grading_retried", None) and record.outcome != GRADER_ERROR:
            record.retried_after = item.grading_retried  # the first attempt's grader error
        record.nodeid = getattr(item, "grading_nodeid", None) or check_id(item)
        return record

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        name = submission_of(item)
        if name is None:
            return
        # On this report only (not item.user_properties, which all its reports share).
        sent = [("grading_submission", name)]
        if self.is_worker and not self._collected_sent:
            self._collected_sent = True
            sent.append(("grading_collected", {"items": {k: sorted(v) for k, v in self.collected.items()},
                                               "modules": sorted(self.modules)}))
        if facts := self.state.runner_facts.pop(name, None):
            sent.append(("grading_runner", facts))
        if (record := self._record(item, report, call, name)) is not None:
            sent.append(("grading_check", record.to_json()))
        report.user_properties = [*report.user_properties, *sent]

    def pytest_runtest_logreport(self, report):
        if self.is_worker:
            return
        sent = dict(report.user_properties)
        if (collected := sent.get("grading_collected")) and not self.collected:
            for name, ids in collected["items"].items():
                self.collected.setdefault(name, set()).update(ids)
            self.modules.update(collected["modules"])
            self._save_collected()
        if facts := sent.get("grading_runner"):
            self._note_runner(facts)
        if name := sent.get("grading_submission"):
            self.durations.add(name, report.nodeid, report.duration, sent.get("grading_check"))
        if (sent_record := sent.get("grading_check")) is None:
            if report.failed and report.when != "teardown" and "[" in report.nodeid:
                self._say(f"{report.nodeid}: failed without a result (worker crash?)")
            return
        record = CheckRecord.from_json(sent_record)
        # A runner that timed out fails every larger case of its group at once (SubmissionRunner.call):
        # a thief's runner would not know, and would wait out the timeout again.
        if record.outcome == "timeout" and self.scheduler is not None and "@" in report.nodeid:
            self.scheduler.keep_whole(report.nodeid.rsplit("@", 1)[1])
        store.write_check(self.state.reports, record)
        self._count_done(record.submission)

    def _note_runner(self, facts):
        """The runner's facts, into info.json (written here only: the controller owns it)."""
        name = facts.get("submission")
        if name not in self.info:
            return
        info = self.info[name]
        if name not in self._runner_seen:  # this session's runner replaces the last session's facts
            self._runner_seen.add(name)
            problem = next((s.problem for s in self.state.submissions if s.name == name), None)
            info["ungradable"] = problem
            info.pop("runner_log_tail", None)
            info.pop("runner_logs", None)
        info.update({k: facts[k] for k in ("ungradable", "isolation") if facts.get(k) is not None})
        if facts.get("runner_logs"):
            info.setdefault("runner_logs", {}).update(facts["runner_logs"])
            info["runner_log_tail"] = joined_logs(info["runner_logs"])
        store.write_info(self.state.reports, name, info)

    def _save_collected(self):
        """What a full run holds, per submission, into collected.json (the controller's file)."""
        if self.config.option.collectonly:
            return
        for s in self.state.submissions:
            store.update_collected(self.state.reports, s.name, sorted(self.collected.get(s.name, ())),
                                          self.modules)

    def _assemble(self, name):
        return scoring.assemble(self.state.reports, name, self.state.rubric)

    # -- progress --------------------------------------------------------------------------
    def pytest_collection_finish(self, session):
        if not self.is_worker and session.items:  # without xdist: the controller holds the items
            self._set_pending(submission_of(item) for item in session.items)

    @pytest.hookimpl(optionalhook=True)  # an xdist hook: `-p no:xdist` must still work
    def pytest_xdist_node_collection_finished(self, node, ids):
        if not any(self._submission_of_id(i) for i in ids) and not narrowed(self.config):
            self._stop_without_checks(f"{len(ids)} other test(s)" if ids else "nothing")
        if not self.pending:
            self._set_pending(self._submission_of_id(i) for i in ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self.durations.mark("workers down")  # the last worker's, in the end

    def _submission_of_id(self, nodeid: str):
        """The submission of a test id as a worker reports it under loadgroup, "<id>@<group>", the
        group being the submission's name, or "<name>/<shard>" (grading/shards.py)."""
        if "@" not in nodeid:
            return None
        name = shards.submission_of_group(nodeid.rsplit("@", 1)[1])
        return name if any(s.name == name for s in self.state.submissions) else None

    def _set_pending(self, names):
        """Pending checks per submission, from the submission of each collected test (None: not a
        grading test). Counted by exact name: a substring would count s10's tests as s1's."""
        counts = Counter(name for name in names if name is not None)
        self.pending = {s.name: counts[s.name] for s in self.state.submissions}

    def _count_done(self, name):
        if name not in self.pending:
            return
        self.pending[name] -= 1
        if self.pending[name] == 0:
            done = sum(1 for v in self.pending.values() if v <= 0)
            graded = self._assemble(name)
            self._say(f"[{done} of {len(self.pending)} submissions done] {name}: "
                      f"{graded['score']:g} / {graded['max_score']:g}"
                      + (" (incomplete: not final)" if graded["extra_data"]["incomplete"] else ""))

    def _show_rubric(self):
        """The point table at the start (controller only), so a wrong weight shows before grading; -q: its totals."""
        rubric, reporter = self.state.rubric, self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if self.config.get_verbosity() < 0:
            reporter.write_line(rubric.summary())
            return
        reporter.write_sep("-", f"rubric: {rubric.path}")
        for line in rubric.point_table().splitlines():
            reporter.write_line(line)

    def _say(self, line: str) -> None:
        """A progress line through pytest's terminal reporter, on a line of its own."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:  # -p no:terminal
            print(line, flush=True)
            return
        reporter.write_line("\n" + line)  # the dots of -q, xdist's among them, do not end their line

    # -- the end ---------------------------------------------------------------------------
    def pytest_sessionfinish(self, session):
        if self._probe:
            shutil.rmtree(Path(self._probe["path"]).parent, ignore_errors=True)
        if self.is_worker or self.config.option.collectonly or self.no_checks:
            return
        self.durations.mark("scoring")
        summary = []
        for s in self.state.submissions:
            graded = self._assemble(s.name)
            summary.append((s.name, graded["score"], graded["max_score"], graded["output"]))
        self.summary = summary
        build_reports(self.state.reports, student_view=self.config.getoption("--student-view"))
        self.durations.mark("reports written")

    def pytest_terminal_summary(self, terminalreporter):
        if self.is_worker or not getattr(self, "summary", None):
            return
        terminalreporter.section("grades")
        for name, score, max_score, output in self.summary:
            terminalreporter.write_line(f"{name:30s} {score:7.2f} / {max_score:6.2f}   {output}")
        for line in self.durations.lines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"reports: {self.state.reports / 'index.html'} "
                                    f"({time.monotonic() - self.started:.0f} s)")
        if self._failures_not_shown:
            terminalreporter.write_line("why each check failed: in the reports (or here, with --tb=short)")
