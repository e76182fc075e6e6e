"""The grading plugin of the process that runs the checks: an xdist worker, or the one process of a
run without workers (grading/pytest_plugin.py registers it there beside the controller's).

It parametrizes the checks over the submissions, gives each collected check its identity (its
track, record id and case: grading/check.py CheckIdentity) and its rubric group, tells the
controller each identity (an xdist worker, once collected), sorts the checks (grading/tracks.py),
runs again a check that the grader's own code broke, and sends what each check found to the
controller on its test report's user_properties: the check record, the runner's facts and, with
its first report, the tests it collected (grading/protocol.py names every key).

An exception raised by the grader's own code in a test (the harness, the oracle, a file read) is
not the student's failure: the test is run once more, and if the grader fails again the check is
recorded as "grader_error", unscored, and the submission is marked incomplete. What the student's
code does wrong reaches the tests as a runner Reply and fails through Check.fail; a test that
failed before it made its check (in a fixture, say) gets a stand-in record.
"""
import os
import traceback
from pathlib import Path

import pytest

from fa2_sandbox import GRADER_PACKAGES, PROJECT_ROOT
from fa2_sandbox.harness import shared_probe
from fa2_sandbox.wire import outcomes
from grading import protocol, tracks
from grading.check import TEST_STATE, TestState, identify, submission_of
from grading.declaration import declared_check
from grading.results.record import GRADER_ERROR, NOT_GRADED_HERE, CheckRecord, grader_error_diagnosis
from grading.session import WORKER_STATE

# The grader's own code, as a traceback names it: a checkout's folders or the installed packages.
OWN_PACKAGES = [str(PROJECT_ROOT / name) + os.sep for name in GRADER_PACKAGES if name != "submissions"]


def describe(exc: BaseException) -> str:
    """'KeyError: 'o' at grading/checks/test_flash.py:97': the error and where the grader raised it."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 300:
        text = text[:297] + "..."
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(tuple(OWN_PACKAGES))]
    frame = (ours or frames or [None])[-1]
    if frame is not None:
        where = os.path.relpath(frame.filename, PROJECT_ROOT) if frame in ours else frame.filename
        text += f" at {where}:{frame.lineno}"
    return text


def stand_in(item, identity) -> CheckRecord:
    """A record for a grading test that failed before it made its check (in a fixture, say)."""
    return CheckRecord(submission=identity.submission, part="grader", check=item.originalname, case=identity.case,
                       stand_in=True)


def record_of(item, report, call, name):
    """The check record this report settles, or None (teardown, or nothing to record)."""
    if not (report.when == "call" or (report.when == "setup" and not report.passed)):
        return None
    state = item.stash[TEST_STATE]
    if state.check is None and report.passed:
        return None
    record = state.check.record if state.check is not None else stand_in(item, state.identity)
    errors = state.errors
    if report.passed and record.outcome == outcomes.ERROR and not record.diagnosis:
        record.update(outcome=outcomes.PASSED, output=record.output or "passed")
    elif report.skipped and record.outcome not in (outcomes.SKIPPED, NOT_GRADED_HERE):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        record.update(outcome=outcomes.SKIPPED, output=f"skipped: {reason}")
    elif report.failed and (errors or report.when == "setup" or not record.diagnosis):
        if not errors:  # failed in setup (not retried), or through pytest.fail outside Check
            if call.excinfo is not None:
                message = describe(call.excinfo.value)
            else:
                message = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else "failed"
            errors = [message + (" (in setup)" if report.when == "setup" else "")]
        record.update(outcome=GRADER_ERROR, diagnosis=grader_error_diagnosis(errors),
                      output=str(report.longrepr)[-20000:], attempts=errors)  # the traceback, for staff
    if state.first_error and record.outcome != GRADER_ERROR:
        record.retried_after = state.first_error  # the first attempt's grader error
    record.check_id = state.identity.check_id
    return record


class WorkerPlugin:
    """Registered by grading/pytest_plugin.py under --impl where checks run."""

    def __init__(self, config):
        self.config = config
        self.state = config.stash[WORKER_STATE]
        # Test ids collected per submission, before -k / --deselect, and the modules collected
        # whole: what a complete result needs, and which old records are stale (see
        # store.current_records). Sent to the controller with the first report.
        self.collected = {}
        self.modules = set()
        self.groups = {}  # test id -> its rubric group, known before it runs (declaration.declared_check)
        self.collected_sent = False
        if probe := protocol.given(config, protocol.PROBE):  # the controller's (shared_probe.py)
            shared_probe.adopt(Path(probe["path"]), probe["question"])

    def pytest_configure(self, config):
        # Workers tag each test id with its xdist group (its submission's track), which xdist's worker
        # does only under loadgroup (the controller schedules by them: grading/controller.py). Only a
        # worker reads it.
        config.option.loadgroup = True

    def pytest_generate_tests(self, metafunc):
        if "submission" in metafunc.fixturenames:
            subs = self.state.submissions
            metafunc.parametrize("submission", subs, ids=[s.name for s in subs], scope="session")

    # -- collection --------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        """A checks module whose `grading` marker does not declare each of its tests (grading/
        declaration.py) fails to collect, with the sentence that says which: a collection error
        stops the run, under xdist too, where an error raised later would crash the worker."""
        report = yield
        if isinstance(collector, pytest.Module) and report.passed:
            for item in report.result:
                if isinstance(item, pytest.Function) and submission_of(item) is not None:
                    try:
                        declared_check(item, self.state.rubric)
                        tracks.declared_track(item, per_kernel=True)
                    except pytest.UsageError as exc:
                        report.outcome, report.longrepr, report.result = "failed", str(exc), []
                        break
        return report

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker tags ids with the group, and before -k
    def pytest_collection_modifyitems(self, config, items):
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
            if name is None:
                continue
            track = tracks.track_of(item, self.state.stubs[name], self.state.per_kernel_tracks) \
                if self.state.split_into_tracks else tracks.WHOLE
            state = item.stash[TEST_STATE] = TestState(identity=identify(item, track),
                                                        declared=declared_check(item, self.state.rubric))
            if grouping:
                item.add_marker(pytest.mark.xdist_group(state.identity.submission_track))
            self.groups[state.identity.check_id] = state.declared.group
            self.collected.setdefault(name, set()).add(state.identity.check_id)
            if not last_failed and not (partial and item.path.resolve() in partial):
                self.modules.add(item.module.__name__)

    # Last: pytest's own hook (fixtures.py, reorder_items) regroups the items by the session-scoped
    # `submission` parameter after every tryfirst hook, which undid this sort on a GPU run: a
    # lone submission's tracks went out in the order of its test modules, its one-test Triton
    # timing track (the longest) among the last.
    @pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
    def pytest_collection_modifyitems_heavy_first(self, items):
        # Every worker sorts alike, as xdist requires (the sorts are stable).
        if self.state.split_into_tracks:
            items.sort(key=lambda item: track_given(item).rank)
        else:  # a runner's distributed checks one after another: its ranks serve them all
            items.sort(key=lambda item: not (submission_of(item) and tracks.is_distributed(item)))

        def track_of_item(item):
            state = item.stash.get(TEST_STATE, None)
            return state.identity.submission_track if state is not None else None

        tracks.tracks_together(items, track_of_item)
        tracks.smallest_case_first(items, track_of_item)
        tracks.memory_early(items, track_of_item)

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker sends the ids to the controller
    def pytest_collection_finish(self, session):
        """An xdist worker tells the controller who each test it will run is: xdist's node id ->
        CheckIdentity, in the file the controller named (ControllerPlugin.pytest_configure_node),
        which it reads as this worker's collection comes in."""
        for position, item in enumerate(session.items):  # sorted and deselected alike in every process
            if TEST_STATE in item.stash:
                item.stash[TEST_STATE].position = position
        path = protocol.given(self.config, protocol.IDENTITIES)
        if path is None:
            return
        protocol.write_identities(path, {item.nodeid: item.stash[TEST_STATE].identity.to_json()
                                         for item in session.items if TEST_STATE in item.stash})

    # -- running -----------------------------------------------------------------------------
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
        state = item.stash[TEST_STATE]
        state.check = None
        try:
            item.runtest()
        except Exception as exc:
            state.errors = [first, describe(exc)]
            raise
        finally:
            state.first_error = first
        return None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        name = submission_of(item)
        if name is None:
            return
        if self.state.spent is not None:  # in the process that ran it: its submission's time
            self.state.spent.add(name, report.duration, item.stash[TEST_STATE].position)
        sent = [(protocol.SUBMISSION, name)]
        if not self.collected_sent:
            self.collected_sent = True
            sent.append((protocol.COLLECTED, {"items": {k: sorted(v) for k, v in self.collected.items()},
                                              "modules": sorted(self.modules), "groups": self.groups}))
        if facts := self.state.runner_facts.pop(name, None):
            sent.append((protocol.RUNNER, facts))
        if (record := record_of(item, report, call, name)) is not None:
            sent.append((protocol.CHECK, record.to_json()))
        protocol.send(report, sent)

    def pytest_sessionfinish(self, session):
        self.state.close()  # this process's runners


def track_given(item) -> tracks.Track:
    """The track collection gave a grading test (the whole submission's for any other test)."""
    state = item.stash.get(TEST_STATE, None)
    return state.identity.track if state is not None else tracks.WHOLE
