"""Recording: each grading test's check record, from the worker that ran it to the controller
that writes it under reports/, with the runner's facts (info.json) and what a full run holds
(collected.json). A test that the grader's own code broke is run once more, and then recorded as a
grader error, never as the student's failure; a test that failed before it made its check gets a
stand-in record.

Workers send what they find on the test reports' user_properties: the check record as
"grading_check" (CheckRecord.to_json(): user_properties must stay plain JSON data), the runner's
facts as "grading_runner" and, once, the tests they collected as "grading_collected".
"""
import os
import traceback

import pytest

from fa2_sandbox import GRADER_PACKAGES, PROJECT_ROOT
from fa2_sandbox.wire import outcomes
from grading.check import check_id
from grading.results import scoring, store
from grading.results.record import GRADER_ERROR, NOT_GRADED_HERE, CheckRecord, grader_error_diagnosis

LOG_TAILS_CHARS = 24000  # all of a submission's runner logs together, in results.json


def joined_logs(logs: dict) -> str:
    """The runners' log tails as one text: one runner's as it is; several (one per shard) each
    under its shard's name, the last LOG_TAILS_CHARS / n characters of each."""
    if len(logs) == 1:
        return next(iter(logs.values()))
    share = LOG_TAILS_CHARS // len(logs)
    return "\n".join(f"--- the runner of {shard or 'the submission'} ---\n{tail[-share:]}"
                     for shard, tail in sorted(logs.items()))


def submission_of(item):
    """The name of the submission a grading test grades, or None for any other test."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "submission" not in callspec.params:
        return None
    return callspec.params["submission"].name


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


class Recording:
    """The recording hooks of GradingPlugin (grading/plugin.py), which holds the state they use."""

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
        if report.passed and record.outcome == outcomes.ERROR and not record.diagnosis:
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
        if self.state.spent is not None:  # in the process that ran it: its submission's time
            self.state.spent.add(name, report.duration)
        # On this report only (not item.user_properties, which all its reports share).
        sent = [("grading_submission", name)]
        if self.is_worker and not self._collected_sent:
            self._collected_sent = True
            sent.append(("grading_collected", {"items": {k: sorted(v) for k, v in self.collected.items()},
                                               "modules": sorted(self.modules), "groups": self.groups}))
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
            self.groups.update(collected.get("groups") or {})
            self._save_collected()
        if facts := sent.get("grading_runner"):
            self._note_runner(facts)
        if name := sent.get("grading_submission"):
            self.durations.add(name, report.nodeid, report.duration, sent.get("grading_check"))
            if report.start and report.stop:  # this session's span of the submission's tests: its wall clock
                span = self.clock.setdefault(name, [report.start, report.stop])
                span[:] = [min(span[0], report.start), max(span[1], report.stop)]
        if (sent_record := sent.get("grading_check")) is None:
            if report.failed and report.when != "teardown" and "[" in report.nodeid:
                self._say(f"{report.nodeid}: failed without a result (worker crash?)")
            return
        record = CheckRecord.from_json(sent_record)
        # A runner that timed out fails every larger case of its group at once (SubmissionRunner.call):
        # a thief's runner would not know, and would wait out the timeout again.
        if record.outcome == outcomes.TIMEOUT and self.scheduler is not None and "@" in report.nodeid:
            self.scheduler.timed_out(report.nodeid.rsplit("@", 1)[1], report.nodeid)
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
            tests = sorted(self.collected.get(s.name, ()))
            store.update_collected(self.state.reports, s.name, tests, self.modules,
                                   {t: self.groups[t] for t in tests if t in self.groups})

    def _assemble(self, name):
        if name in self.clock and name in self.info:  # the wall clock from its first test to its last, this session
            self.info[name]["wall_seconds"] = round(self.clock[name][1] - self.clock[name][0], 1)
            store.write_info(self.state.reports, name, self.info[name])
        return scoring.assemble(self.state.reports, name, self.state.rubric)
