"""The grading plugin: active only under `pytest --impl PATH`.

It parametrizes the suite over submissions, keeps one runner per submission per worker, records
each check the moment it finishes, and at the end of the session assembles every submission's
results.json and builds the HTML reports. Under xdist a submission's checks stay on one worker
(`--dist loadgroup`), so its runner starts once, while a class spreads over all workers.
"""
import os
import platform
import sys
import time
from pathlib import Path

import pytest
import torch

from adapters.client import SubmissionRunner
from adapters.discover import defined_functions, find_submissions, stub_functions
from tests.grading import results
from tests.grading.rubric import Rubric


class Check:
    """What one test found, in the shape results.py writes. Tests fill it, then `settle()`."""

    def __init__(self, submission, part, check, case, tier, rubric):
        self.record = {"submission": submission.name, "part": part, "check": check, "case": case,
                       "tier": tier, "group": rubric.group_of(part, check, tier),
                       "source": rubric.source(rubric.group_of(part, check, tier)),
                       "advice": rubric.advice(rubric.group_of(part, check, tier)),
                       "name": f"{submission.name}::{part}::{check}" + (f"[{case}]" if case else ""),
                       "outcome": "error", "diagnosis": "", "output": "", "seconds": 0.0}

    def update(self, **fields):
        self.record.update({k: v for k, v in fields.items() if v is not None})

    def fail(self, diagnosis: str, evidence: str = "", outcome: str = "failed", **details):
        self.update(outcome=outcome, diagnosis=diagnosis,
                    output=diagnosis + ("\n" + evidence if evidence else ""), **details)
        pytest.fail(self.record["output"], pytrace=False)

    def ok(self, note: str = "", **details):
        self.update(outcome="passed", output=note or "passed", **details)

    def skip(self, reason: str):
        self.update(outcome="skipped", output=f"skipped: {reason}")
        pytest.skip(reason)

    def settle_reply(self, reply):
        """Fail the check if the runner call itself went wrong; otherwise return quietly."""
        self.update(seconds=reply.seconds)
        if reply.ok:
            return
        if reply.status == "not_attempted":
            self.fail(f"not attempted: {reply.message}", outcome="not_attempted")
        if reply.status in ("timeout", "crash", "import_error"):
            self.fail(reply.message, outcome=reply.status)
        self.fail(f"raised {reply.message}", reply.traceback, outcome="error")


class Grading:
    """Session state shared by the grading tests of one process (controller or worker)."""

    def __init__(self, config):
        self.config = config
        self.rubric = Rubric(config.getoption("--rubric"))
        self.reports = Path(config.getoption("--reports"))
        self.seed = config.getoption("--seed")
        self.on_gpu = torch.cuda.is_available()
        # Workers share the cores, and so do their runners: without this each one's float64
        # oracles and each runner's matmuls would use every core at once.
        self.threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
        torch.set_num_threads(self.threads)
        self.submissions = find_submissions(config.getoption("--impl"))
        self.functions = {s.name: defined_functions(s) for s in self.submissions}
        self.stubs = {s.name: stub_functions(s) for s in self.submissions}
        self._runners = {}
        self._replies = {}
        self._current = None

    def _switch_to(self, name: str):
        """A worker grades one submission's checks together (loadgroup): when the next one starts,
        close the last one's runner and drop its tensors, so a class of 100 holds one at a time."""
        if name == self._current:
            return
        for other in [n for n in self._runners if n != name]:
            self._runners.pop(other).close()
        self._replies = {key: value for key, value in self._replies.items() if key[0] == name}
        self._current = name

    def runner(self, submission) -> SubmissionRunner:
        self._switch_to(submission.name)
        if submission.name not in self._runners:
            env = {} if self.on_gpu else {"TRITON_INTERPRET": "1"}
            worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # pin workers to GPUs round-robin
            if self.on_gpu and torch.cuda.device_count() > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
                env["CUDA_VISIBLE_DEVICES"] = str(int(worker.lstrip("gw") or 0) % torch.cuda.device_count())
            env["OMP_NUM_THREADS"] = str(self.threads)
            self._runners[submission.name] = SubmissionRunner(submission, env=env,
                                                              import_timeout=self.rubric.timeout("import"))
        return self._runners[submission.name]

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
                   outcome="not_attempted")

    def call_cached(self, submission, key, request, timeout, what):
        """One runner call shared by the checks that need it (forward and backward, say)."""
        self._switch_to(submission.name)
        key = (submission.name, key)  # replies never cross submissions
        if key not in self._replies:
            runner = self.runner(submission)
            reply = runner.call(request, timeout, what)
            tensors = runner.load_tensors(reply) if reply.ok else {}
            self._replies[key] = (reply, tensors)
            self.note_runner(submission, runner, reply)
        return self._replies[key]

    def note_runner(self, submission, runner, reply):
        ungradable = reply.message if reply.status == "import_error" else None
        if submission.problem:
            ungradable = submission.problem
        results.write_info(self.reports, submission.name, {"ungradable": ungradable,
                                                            "runner_log_tail": runner.log_tail()})

    def close(self):
        for runner in self._runners.values():
            runner.close()


def environment(on_gpu: bool) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    return {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
            "triton": triton_version, "triton_interpreter": not on_gpu, "python": platform.python_version()}


class GradingPlugin:
    def __init__(self, config):
        self.config = config
        self.state = Grading(config)
        self.is_worker = hasattr(config, "workerinput")
        self.started = time.monotonic()
        self.pending = {}  # submission name -> checks not yet reported (controller only)

    # -- setup -----------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        # A submission's checks share one worker (and one runner): the controller schedules by
        # group, and workers tag each test id with its group, which they do only under loadgroup.
        if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load"):
            config.option.dist = "loadgroup"
        if self.is_worker:
            config.option.loadgroup = True

    def pytest_sessionstart(self, session):
        if self.is_worker:
            return
        for s in self.state.submissions:
            folder = self.state.reports / s.name
            for stale in (folder / "checks").glob("*.json") if folder.exists() else ():
                stale.unlink()
            if (folder / "info.json").exists():
                (folder / "info.json").unlink()
            results.write_info(self.state.reports, s.name, {
                "student": s.student, "seed": self.state.seed, "ungradable": s.problem,
                "environment": environment(self.state.on_gpu), "notes": s.notes})
        names = ", ".join(s.name for s in self.state.submissions) or "none"
        print(f"\ngrading {len(self.state.submissions)} submission(s) with seed {self.state.seed}: {names}")

    def pytest_generate_tests(self, metafunc):
        if "submission" in metafunc.fixturenames:
            subs = self.state.submissions
            metafunc.parametrize("submission", subs, ids=[s.name for s in subs], scope="session")

    @pytest.hookimpl(tryfirst=True)  # before xdist's worker tags ids with the group
    def pytest_collection_modifyitems(self, items):
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec and "submission" in callspec.params:
                item.add_marker(pytest.mark.xdist_group(callspec.params["submission"].name))

    @pytest.fixture(scope="session")
    def grading(self):
        yield self.state
        self.state.close()

    @pytest.fixture
    def check(self, request, grading, submission):
        """Factory: check(part, name, case_id, tier) -> Check, recorded for this test."""
        def make(part, name, case="", tier="default"):
            request.node.grading_check = Check(submission, part, name, case, tier, grading.rubric)
            return request.node.grading_check
        return make

    # -- recording -------------------------------------------------------------------------
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        check = getattr(item, "grading_check", None)
        if check is not None and (report.when == "call" or report.outcome != "passed"):
            if report.outcome == "passed" and check.record["outcome"] == "error":
                check.update(outcome="passed", output=check.record["output"] or "passed")
            if report.failed and check.record["outcome"] in ("passed", "error") and not check.record["diagnosis"]:
                message = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else "failed"
                check.update(outcome="error", diagnosis=f"the grader hit an error: {message}", output=str(report.longrepr))
            report.user_properties.append(("grading_check", check.record))

    def pytest_runtest_logreport(self, report):
        if self.is_worker:
            return
        record = dict(report.user_properties).get("grading_check")
        if record is None:
            if report.failed and report.when != "teardown" and "[" in report.nodeid:
                print(f"\n{report.nodeid}: failed without a result (worker crash?)", file=sys.stderr)
            return
        results.write_check(self.state.reports, record)
        if report.when == "call" or report.outcome != "passed":
            self._count_done(record["submission"])

    # -- progress --------------------------------------------------------------------------
    def pytest_collection_finish(self, session):
        if not self.is_worker:
            self._set_pending([item.nodeid for item in session.items])

    def pytest_xdist_node_collection_finished(self, node, ids):
        if not self.pending:
            self._set_pending(ids)

    def _set_pending(self, ids):
        for s in self.state.submissions:
            self.pending[s.name] = sum(1 for i in ids if i.endswith(f"@{s.name}") or f"[{s.name}" in i
                                       or f"-{s.name}]" in i or f"-{s.name}-" in i)

    def _count_done(self, name):
        if name not in self.pending:
            return
        self.pending[name] -= 1
        if self.pending[name] == 0:
            done = sum(1 for v in self.pending.values() if v <= 0)
            graded = results.assemble(self.state.reports, name, self.state.rubric)
            print(f"\n[{done} of {len(self.pending)} submissions done] {name}: "
                  f"{graded['score']:g} / {graded['max_score']:g}", flush=True)

    # -- the end ---------------------------------------------------------------------------
    def pytest_sessionfinish(self, session):
        if self.is_worker:
            return
        summary = []
        for s in self.state.submissions:
            graded = results.assemble(self.state.reports, s.name, self.state.rubric)
            summary.append((s.name, graded["score"], graded["max_score"], graded["output"]))
        self.summary = summary
        try:
            from reporting.build import build_reports
        except ImportError:
            return
        build_reports(self.state.reports, student_view=self.config.getoption("--student-view"))

    def pytest_terminal_summary(self, terminalreporter):
        if self.is_worker or not getattr(self, "summary", None):
            return
        terminalreporter.section("grades")
        for name, score, max_score, output in self.summary:
            terminalreporter.write_line(f"{name:30s} {score:7.2f} / {max_score:6.2f}   {output}")
        terminalreporter.write_line(f"reports: {self.state.reports / 'index.html'} "
                                    f"({time.monotonic() - self.started:.0f} s)")
