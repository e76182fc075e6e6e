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
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from fa2_sandbox.harness import shared_probe
from fa2_sandbox.harness.client import runner_memory_limit
from grading import shards
from grading.check import check_id, declared_group
from grading.durations import Durations
from grading.recording import Recording, submission_of
from grading.results import store
from grading.results.record import points
from grading.session import GRADING, Grading, environment
from reporting.build import build_reports, left_out

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


class GradingPlugin(Recording):
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
        self.groups = {}  # test id -> its rubric group, known before it runs (check.declared_group)
        self._collected_sent = False
        self.info = {}  # submission name -> its info.json (controller only: the file's one writer)
        self.clock = {}  # submission name -> [its first test's start, its last test's end] (time.time, controller)
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
        # timing shard, one of its longest, last, and a lone submission ended late for it.
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
        if self.state.spent is not None:  # each submission's time (--time-limit)
            node.workerinput["grading_spent"] = str(self.state.spent.folder)
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
        count = len(self.state.submissions)
        self._say(f"grading {count} submission{'s' * (count != 1)} with seed {self.state.seed}: "
                  + ", ".join(s.name for s in self.state.submissions))
        if self.state.skipped:
            self._say(f"skipped {len(self.state.skipped)} folder{'s' * (len(self.state.skipped) != 1)} that --impl "
                      f"matched and that hold no tests/adapters.py or adapters.py: "
                      + ", ".join(str(p) for p in self.state.skipped))

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
                item.grading_group = self.groups[item.grading_nodeid] = declared_group(item, self.state.rubric)
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
            self._say(f"[{done} of {len(self.pending)} submission{'s' * (len(self.pending) != 1)} done] {name}: "
                      f"{points(graded['score'])} / {points(graded['max_score'])}"
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
        if not self.is_worker and self.state.spent is not None:  # after its workers: they add to it to the end
            shutil.rmtree(self.state.spent.folder, ignore_errors=True)
        if self.is_worker or self.config.option.collectonly or self.no_checks:
            return
        self.durations.mark("scoring")
        summary = []
        for s in self.state.submissions:
            graded = self._assemble(s.name)
            summary.append((s.name, graded["score"], graded["max_score"], graded["output"]))
        self.summary = summary
        # The class of the folder is this run's, written with its pages: a run that stopped before
        # grading (no check collected, a usage error) leaves the last run's class as it was.
        store.write_class(self.state.reports, [s.name for s in self.state.submissions], self.state.skipped,
                          keep_others=self.config.getoption("--keep-others"))
        build_reports(self.state.reports, student_view=self.config.getoption("--student-view"))
        self.durations.mark("reports written")

    def pytest_terminal_summary(self, terminalreporter):
        if self.is_worker or not getattr(self, "summary", None):
            return
        terminalreporter.section("grades")
        for name, score, max_score, output in self.summary:
            terminalreporter.write_line(f"{name:30s} {points(score):>7s} / {points(max_score):<6s}   {output}")
        for line in self.durations.lines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"reports: {self.state.reports / 'index.html'} "
                                    f"({time.monotonic() - self.started:.0f} s)")
        members = (store.read_class(self.state.reports) or {}).get("submissions")
        if others := left_out(self.state.reports, members):
            terminalreporter.write_line(
                f"its class page lists this run's submissions; {len(others)} graded into {self.state.reports} "
                f"before {'is' if len(others) == 1 else 'are'} left out ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}): --keep-others lists them too")
        if self._failures_not_shown:
            terminalreporter.write_line("why each check failed: in the reports (or here, with --tb=short)")
