"""The grading plugin of the controller: the process that owns reports/ (registered by
grading/pytest_plugin.py wherever there is no `workerinput`; without xdist, beside the worker's),
and its state, ControllerState, which no process that runs checks holds.

It schedules a class over the xdist workers (`--dist loadgroup`, each xdist group a track of a
submission, grading/tracks.py: a track's checks stay on one worker, so its runner starts once, but
for the tail of a track that proves slow, which idle workers share: grading/scheduler.py),
writes each check the moment its report comes (grading/worker.py sends it), keeps each
submission's info.json, assembles a submission's results.json when its last check finishes (at the
end, those that never got there or whose facts moved since), builds the HTML reports at the end
and prints where the time went. Only this process writes under reports/
(grading/results/store.py says which file is whose).
"""
import json
import os
import platform
import secrets
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from fa2_sandbox.harness import shared_probe
from fa2_sandbox.harness.client import runner_memory_limit
from fa2_sandbox.wire import outcomes
from grading import protocol, time_limit
from grading.check import CheckIdentity, submission_of
from grading.durations import Durations
from grading.results import scoring, store
from grading.results.record import CheckRecord, left_out, points, read_class, write_class
from grading.time_limit import SpentTime
from reporting import build_reports

CHECKS = Path(__file__).resolve().with_name("checks")
LOG_TAILS_CHARS = 24000  # all of a submission's runner logs together, in results.json


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


def joined_logs(logs: dict) -> str:
    """The runners' log tails as one text: one runner's as it is; several (one per track) each
    under its track's name, the last LOG_TAILS_CHARS / n characters of each."""
    if len(logs) == 1:
        return next(iter(logs.values()))
    share = LOG_TAILS_CHARS // len(logs)
    return "\n".join(f"--- the runner of {track or 'the submission'} ---\n{tail[-share:]}"
                     for track, tail in sorted(logs.items()))


def environment(on_gpu: bool) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
            "triton": triton_version, "triton_interpreter": not on_gpu, "python": platform.python_version()}


class ControllerState:
    """What the controller alone holds, registered only in its process (grading/pytest_plugin.py):
    the class it grades, the reports folder and the seed drawn there, and under --time-limit the
    folder of each submission's time, which it makes and removes. Its workers get what they need of
    it through grading/protocol.py (for_workers)."""

    def __init__(self, config, settings: protocol.Settings):
        self.rubric, self.submissions, self.skipped = settings.rubric, settings.submissions, settings.skipped
        self.reports = Path(config.getoption("--reports"))
        # Each submission's check time under a limit, shared by the run's processes: made here, its
        # workers are told where.
        self.spent = SpentTime(tempfile.mkdtemp(prefix="fa2-spent-")) if settings.time_limit is not None else None
        # Under xdist, the CPU cases' oracles, computed once for all the workers (grading/checks/shared_oracles.py):
        # a folder made here, and a key drawn for the run that only the workers are given.
        self.oracles = None
        if getattr(config.option, "numprocesses", None):
            self.oracles = {"path": tempfile.mkdtemp(prefix="fa2-oracles-"), "key": secrets.token_hex(32)}
        self.seed = config.getoption("--seed")
        if self.seed is None:
            self.seed = store.secret_seed(self.reports)
        self.on_gpu = torch.cuda.is_available()

    def for_workers(self) -> dict:
        """What every process that runs checks is given: an xdist worker in its workerinput, the checks'
        side of a run without workers through protocol.hand_over."""
        given = {protocol.SEED: self.seed}
        if self.spent is not None:
            given[protocol.SPENT] = str(self.spent.folder)
        if self.oracles is not None:
            given[protocol.ORACLES] = self.oracles
        return given


# The controller's ControllerState, for its plugin.
CONTROLLER_STATE = pytest.StashKey[ControllerState]()


class ControllerPlugin:
    """Registered by grading/pytest_plugin.py under --impl in the controller."""

    def __init__(self, config):
        self.config = config
        self.state = config.stash[CONTROLLER_STATE]
        self.started = time.monotonic()
        self.pending = {}  # submission name -> checks not yet reported
        self.collected = {}  # submission name -> test ids a full run holds (from the workers' first reports)
        self.modules = set()
        self.groups = {}  # test id -> its rubric group
        self.info = {}  # submission name -> its info.json (this process is the file's one writer)
        self.clock = {}  # submission name -> [its first test's start, its last test's end] (time.time)
        self.assembled = {}  # submission name -> (the facts its results.json was assembled from, its results)
        self.durations = Durations()
        self.runner_seen = set()
        self.probe = None  # the isolation probe the workers share (shared_probe.py)
        self.failures_not_shown = False  # pytest's FAILURES section left to the reports
        self.no_checks = False  # this session collected no check, so it writes nothing
        self.scheduler = None  # under xdist: grading/scheduler.py's, which says what it spread
        self.identities = {}  # under xdist: a worker's node id -> CheckIdentity (WorkerPlugin.pytest_collection_finish)
        self.identities_folder = None  # where the workers write them
        self.summary = []
        self.waiting_lines = []  # progress lines that wait for the row of test results being written to end

    # -- setup -----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        # A submission track's checks share one worker (and one runner): the controller schedules by them.
        if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load"):
            config.option.dist = "loadgroup"
        # Groups go out in collection order, which puts the longest first (worker.py's sort), not
        # the most tests first, xdist's default since 3.6: that sent a submission's one-test
        # timing track, one of its longest, last, and a lone submission ended late for it.
        if hasattr(config.option, "loadscopereorder"):
            config.option.loadscopereorder = False
        if self.failures_left_to_reports(config):
            config.option.tbstyle = "no"
            self.failures_not_shown = True

    def failures_left_to_reports(self, config) -> bool:
        """A class's failures go to the reports alone, not to pytest's FAILURES section too: it is
        thousands of entries there, and pytest spends time quadratic in the number of tests on it
        (each failure scans every report for its teardown sections, pytest-dev/pytest#13360; notes/
        grading-speed.md, "pytest's FAILURES section"). One submission keeps it, for the student who
        reads it; so does a run given --tb."""
        given = any(arg.startswith("--tb") for arg in config.invocation_params.args)
        return len(self.state.submissions) > 1 and not given and config.option.tbstyle == "auto"

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """xdist: every worker draws its inputs from the controller's seed (and, under --time-limit,
        adds to its folder of each submission's time), and takes the sandbox's isolation from one
        probe the controller runs while they start."""
        node.workerinput.update(self.state.for_workers())
        if self.probe is None:
            path = Path(tempfile.mkdtemp(prefix="fa2-isolation-")) / "answer.json"
            limit = runner_memory_limit(node.workerinput["workercount"])  # what each worker's runners get
            shared_probe.start(path, tempfile.gettempdir(), limit)
            self.probe = {"path": str(path), "question": shared_probe.question(tempfile.gettempdir(), limit)}
        node.workerinput[protocol.PROBE] = self.probe
        if self.identities_folder is None:
            self.identities_folder = Path(tempfile.mkdtemp(prefix="fa2-identities-"))
        node.workerinput[protocol.IDENTITIES] = str(self.identities_folder / f"{node.gateway.id}.json")

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config, log):
        """xdist: loadgroup's order, with timing groups spread out and capped per GPU, and a group
        that proves slow shared with idle workers (grading/scheduler.py)."""
        if config.getvalue("dist") != "loadgroup":
            return None
        from grading.scheduler import GradingScheduling  # xdist's: imported only where xdist runs

        pinned = self.state.on_gpu and "CUDA_VISIBLE_DEVICES" not in os.environ  # as WorkerState.worker_gpu
        self.scheduler = GradingScheduling(config, log, gpus=torch.cuda.device_count() if pinned else 1,
                                           on_steal=lambda steal: self.say(steal.line()), identities=self.identities,
                                           on_promote=self.say, flash_timeout_s=self.state.rubric.timeout("flash"))
        return self.scheduler

    def pytest_runtest_logstart(self, nodeid, location):
        """xdist passes on each worker's start of a test: a Triton check that runs long moves its
        submission's Triton tracks up the queue (GradingScheduling.started)."""
        if self.scheduler is not None:
            self.scheduler.started(nodeid)

    def pytest_sessionstart(self, session):
        if not self.config.option.pyargs and not any(reaches_checks(self.config, arg) for arg in self.config.args):
            self.no_checks = True  # nothing of this session goes under reports/
            raise pytest.UsageError(
                f"grading collects no check: none of the paths given ({' '.join(self.config.args)}) holds the "
                f"grader's checks, which are in {CHECKS}. Leave the paths out (`pytest --impl DIR` grades "
                f"every check) or name files of that folder; -k selects checks by name.")
        if self.config.option.collectonly:
            return
        self.show_rubric()
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
        count = len(self.state.submissions)
        self.say(f"grading {count} submission{'s' * (count != 1)} with seed {self.state.seed}: "
                 + ", ".join(s.name for s in self.state.submissions))
        if self.state.skipped:
            self.say(f"skipped {len(self.state.skipped)} folder{'s' * (len(self.state.skipped) != 1)} that --impl "
                     f"matched and that hold no tests/adapters.py or adapters.py: "
                     + ", ".join(str(p) for p in self.state.skipped))

    # -- what was collected ------------------------------------------------------------------
    # Without xdist this process collects (and the worker's plugin beside it marks the checks);
    # under xdist the workers do, and xdist tells the controller what each collected.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        if not any(submission_of(item) for item in items):
            self.stop_without_checks(f"{len(items)} other test(s)" if items else "nothing")

    def pytest_collection_finish(self, session):
        if session.items:
            self.set_pending(submission_of(item) for item in session.items)

    @pytest.hookimpl(optionalhook=True)  # an xdist hook: `-p no:xdist` must still work
    def pytest_xdist_node_collection_finished(self, node, ids):
        """Before xdist hands the ids to the scheduler: the worker's identities of them. Every worker
        collects the same tests (xdist checks it), so one worker's file is read, not one per worker."""
        if not all(i in self.identities for i in ids):
            self.identities.update({nodeid: CheckIdentity.from_json(data) for nodeid, data
                                    in protocol.read_identities(node.workerinput[protocol.IDENTITIES]).items()})
        if not any(self.submission_of_id(i) for i in ids) and not narrowed(self.config):
            self.stop_without_checks(f"{len(ids)} other test(s)" if ids else "nothing")
        if not self.pending:
            self.set_pending(self.submission_of_id(i) for i in ids)

    def stop_without_checks(self, found: str):
        """Grading that collected no check stops (exit status 4) and writes no report."""
        self.no_checks = True
        raise pytest.UsageError(f"grading collected no check: {found} from {' '.join(self.config.args)}, where "
                                f"the grader's checks ({CHECKS}) were expected. Nothing was graded and no report "
                                f"was written; see the collection errors above, if any.")

    def submission_of_id(self, nodeid: str):
        """The submission a worker's test grades (its identity's), or None for any other test."""
        identity = self.identities.get(nodeid)
        return identity.submission if identity is not None else None

    def set_pending(self, names):
        """Pending checks per submission, from the submission of each collected test (None: not a
        grading test). Counted by exact name: a substring would count s10's tests as s1's."""
        counts = Counter(name for name in names if name is not None)
        self.pending = {s.name: counts[s.name] for s in self.state.submissions}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self.durations.mark("workers down")  # the last worker's, in the end

    # -- each report -------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report):
        sent = protocol.received(report)
        if (collected := sent.get(protocol.COLLECTED)) and not self.collected:
            for name, ids in collected["items"].items():
                self.collected.setdefault(name, set()).update(ids)
            self.modules.update(collected["modules"])
            self.groups.update(collected.get("groups") or {})
            self.save_collected()
        if facts := sent.get(protocol.RUNNER):
            self.note_runner(facts)
        if name := sent.get(protocol.SUBMISSION):
            self.durations.add(name, report.nodeid, report.duration, sent.get(protocol.CHECK))
            if report.start and report.stop:  # this session's span of the submission's tests: its wall clock
                span = self.clock.setdefault(name, [report.start, report.stop])
                span[:] = [min(span[0], report.start), max(span[1], report.stop)]
        if (sent_record := sent.get(protocol.CHECK)) is None:
            if report.failed and report.when != "teardown" and "[" in report.nodeid:
                self.say(f"{report.nodeid}: failed without a result (worker crash?)")
            self.tell_autotuned(facts)
            return
        record = CheckRecord.from_json(sent_record)
        # A runner that timed out fails every larger case of its track at once (SubmissionRunner.call):
        # a thief's runner would not know, and would wait out the timeout again. A check that
        # --time-limit cut ran no call: taken as a timeout, it kept the slowest submission's
        # tracks from being shared at the class's end (notes/grading-speed.md, "cut checks").
        if record.outcome == outcomes.TIMEOUT and not time_limit.is_cut(record) and self.scheduler is not None:
            self.scheduler.timed_out(report.nodeid)
        if record.outcome in (outcomes.PASSED, outcomes.FAILED) and self.scheduler is not None:
            self.scheduler.answered(report.nodeid, report.duration)
        self.tell_autotuned(facts)  # after answered: a case answered in time proves the kernels it moves
        store.write_check(self.state.reports, record)
        self.count_done(record.submission)

    def tell_autotuned(self, facts) -> None:
        if facts and facts.get("autotunes") and self.scheduler is not None:
            self.scheduler.autotuned(facts["submission"])

    def note_runner(self, facts):
        """The runner's facts, into info.json (written here only: the controller owns it)."""
        name = facts.get("submission")
        if name not in self.info:
            return
        info = self.info[name]
        if name not in self.runner_seen:  # this session's runner replaces the last session's facts
            self.runner_seen.add(name)
            problem = next((s.problem for s in self.state.submissions if s.name == name), None)
            info["ungradable"] = problem
            info.pop("runner_log_tail", None)
            info.pop("runner_logs", None)
        info.update({k: facts[k] for k in ("ungradable", "isolation") if facts.get(k) is not None})
        if facts.get("runner_logs"):
            info.setdefault("runner_logs", {}).update(facts["runner_logs"])
            info["runner_log_tail"] = joined_logs(info["runner_logs"])
        store.write_info(self.state.reports, name, info)

    def save_collected(self):
        """What a full run holds, per submission, into collected.json (the controller's file)."""
        if self.config.option.collectonly:
            return
        for s in self.state.submissions:
            tests = sorted(self.collected.get(s.name, ()))
            store.update_collected(self.state.reports, s.name, tests, self.modules,
                                   {t: self.groups[t] for t in tests if t in self.groups})

    def count_done(self, name):
        if name not in self.pending:
            return
        self.pending[name] -= 1
        self.assembled.pop(name, None)  # a check recorded after its results.json: the end assembles it again
        if self.pending[name] == 0:
            done = sum(1 for v in self.pending.values() if v <= 0)
            graded = self.assemble(name)
            self.say(f"[{done} of {len(self.pending)} submission{'s' * (len(self.pending) != 1)} done] {name}: "
                     f"{points(graded['score'])} / {points(graded['max_score'])}"
                     + (" (incomplete: not final)" if graded["extra_data"]["incomplete"] else ""))

    def assemble(self, name):
        """Write the submission's results.json (scoring.assemble), and remember what it was made from."""
        if self.note_wall_clock(name):
            store.write_info(self.state.reports, name, self.info[name])
        graded = scoring.assemble(self.state.reports, name, self.state.rubric)
        self.assembled[name] = (self.facts(name), graded)
        return graded

    def note_wall_clock(self, name) -> bool:
        """Its wall clock from its first test to its last, this session, into its info (in memory);
        False where it has none."""
        if name not in self.clock or name not in self.info:
            return False
        self.info[name]["wall_seconds"] = round(self.clock[name][1] - self.clock[name][0], 1)
        return True

    def facts(self, name) -> str:
        return json.dumps(self.info.get(name), sort_keys=True, default=str)

    def assembled_as_now(self, name):
        """The results count_done assembled, where nothing they are made from changed since, else
        None. Check files change only with a report's record (count_done forgets the results
        then); the info can change after the last check, by its test's teardown report: a runner's
        facts, or the wall clock, which ends with the teardown."""
        if name not in self.assembled:
            return None
        self.note_wall_clock(name)
        facts, graded = self.assembled[name]
        return graded if facts == self.facts(name) else None

    # -- what it prints ----------------------------------------------------------------------
    def show_rubric(self):
        """The point table at the start, so a wrong weight shows before grading; -q: its totals."""
        rubric, reporter = self.state.rubric, self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if self.config.get_verbosity() < 0:
            reporter.write_line(rubric.summary())
            return
        reporter.write_sep("-", f"rubric: {rubric.path}")
        for line in rubric.point_table().splitlines():
            reporter.write_line(line)

    def say(self, line: str) -> None:
        """A progress line through pytest's terminal reporter, on a line of its own. One that comes
        while pytest writes a row of test results (its dots) waits for the row to end, so that it
        never splits the row (show_waiting_lines)."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:  # -p no:terminal
            print(line, flush=True)
            return
        self.waiting_lines.append(line)
        self.show_waiting_lines(reporter)

    def show_waiting_lines(self, reporter, run_over: bool = False) -> None:
        """Write the progress lines that wait, when no row of results is half written; at the run's
        end (`run_over`), after ending the last row."""
        if not self.waiting_lines or reporter is None:
            return
        writer = getattr(reporter, "_tw", None)  # pytest's TerminalWriter: how far the current line has got
        if writer is not None and writer.width_of_current_line:
            if not run_over:
                return
            reporter.ensure_newline()  # ends a row that starts with its file's name (pytest's default verbosity)
            if writer.width_of_current_line:  # a row of -q's, which it leaves open
                reporter.write("\n")
        for line in self.waiting_lines:
            reporter.write_line(line)
        self.waiting_lines.clear()

    @pytest.hookimpl(trylast=True)  # after the terminal reporter has ended the row, when it ends one
    def pytest_runtest_logfinish(self, nodeid, location):
        self.show_waiting_lines(self.config.pluginmanager.get_plugin("terminalreporter"))

    # -- the end ---------------------------------------------------------------------------
    def pytest_sessionfinish(self, session):
        self.show_waiting_lines(self.config.pluginmanager.get_plugin("terminalreporter"), run_over=True)
        if self.probe:
            shutil.rmtree(Path(self.probe["path"]).parent, ignore_errors=True)
        if self.identities_folder is not None:
            shutil.rmtree(self.identities_folder, ignore_errors=True)
        if self.state.spent is not None:  # after its workers: they add to it to the end
            shutil.rmtree(self.state.spent.folder, ignore_errors=True)
        if self.state.oracles is not None:
            shutil.rmtree(self.state.oracles["path"], ignore_errors=True)
        if self.config.option.collectonly or self.no_checks:
            return
        self.durations.mark("scoring")
        for s in self.state.submissions:  # assembled once, unless it never finished or its facts moved
            graded = self.assembled_as_now(s.name) or self.assemble(s.name)
            self.summary.append((s.name, graded["score"], graded["max_score"], graded["output"]))
        # The class of the folder is this run's, written with its pages: a run that stopped before
        # grading (no check collected, a usage error) leaves the last run's class as it was.
        write_class(self.state.reports, [s.name for s in self.state.submissions], self.state.skipped,
                    keep_others=self.config.getoption("--keep-others"))
        build_reports(self.state.reports, student_view=self.config.getoption("--student-view"))
        self.durations.mark("reports written")

    def pytest_terminal_summary(self, terminalreporter):
        if not self.summary:
            return
        terminalreporter.section("grades")
        for name, score, max_score, output in self.summary:
            terminalreporter.write_line(f"{name:30s} {points(score):>7s} / {points(max_score):<6s}   {output}")
        for line in self.durations.lines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"reports: {self.state.reports / 'index.html'} "
                                    f"({time.monotonic() - self.started:.0f} s)")
        members = (read_class(self.state.reports) or {}).get("submissions")
        if others := left_out(self.state.reports, members):
            terminalreporter.write_line(
                f"its class page lists this run's submissions; {len(others)} graded into {self.state.reports} "
                f"before {'is' if len(others) == 1 else 'are'} left out ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}): --keep-others lists them too")
        if self.failures_not_shown:
            terminalreporter.write_line("why each check failed: in the reports (or here, with --tb=short)")
