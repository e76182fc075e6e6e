"""What passes between the grading controller and its xdist workers: every key and file, here.

xdist gives a worker one dict when it starts (`workerinput`, which the controller fills in
pytest_configure_node) and sends the controller each of the worker's test reports, whose
`user_properties` (a list of (key, value) pairs) must be plain JSON data. Without xdist the
controller's and the worker's plugins run in one process, each with its own state
(grading/controller.py ControllerState, grading/session.py WorkerState): the controller hands the
checks' side what it would give a worker (`hand_over`), and the worker's plugin sends on the test
reports as a worker does, which the controller's reads in the same process.

Both, from the command line (xdist gives each worker the controller's arguments), read with
`settings`: the rubric (--rubric), the submissions (--impl) and the time limit (--time-limit).

Controller -> worker, in workerinput (read with `given`; without workers SEED and SPENT are handed over):
  SEED        the base seed of every input (ControllerState: --seed, else the reports folder's secret one)
  SPENT       under --time-limit, the folder where each submission's check time is kept, which all
              the run's processes add to (grading/time_limit.py SpentTime)
  ORACLES     under xdist, {"path", "key"}: the folder where the workers share the CPU cases' float64
              oracles, and the key of their files' HMAC (grading/checks/shared_oracles.py)
  PROBE       {"path", "question"}: the sandbox's isolation probe, which the controller runs once
              while the workers start (fa2_sandbox/harness/shared_probe.py)
  IDENTITIES  the file the worker writes its tests' identities to (below)

Worker -> controller, on a test report's user_properties (`send`, read with `received`):
  SUBMISSION  the submission the test grades: on every report of a grading test
  COLLECTED   {"items": {submission: [test id]}, "modules": [module], "groups": {test id: rubric
              group}}: what the worker collected, on its first report only
  RUNNER      the runner's facts for the submission's info.json, when there are new ones, and
              "autotunes" once its Triton slot autotuned (the scheduler's: GradingScheduling.autotuned)
  CHECK       the check record, CheckRecord.to_json(), on the report that settles the check

Files:
  IDENTITIES  {xdist node id: CheckIdentity.to_json()}, written whole by the worker once it has
              collected (write_identities), read by the controller as that worker's collection
              comes in, before any test is scheduled (read_identities)
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from fa2_sandbox.harness.discover import NotASubmission, Submission, find_submissions
from grading.rubric import Rubric, RubricError

SEED = "grading_seed"
SPENT = "grading_spent"
ORACLES = "grading_oracles"
PROBE = "isolation_probe"
IDENTITIES = "grading_identities"

SUBMISSION = "grading_submission"
COLLECTED = "grading_collected"
RUNNER = "grading_runner"
CHECK = "grading_check"


HANDED_OVER = pytest.StashKey[dict]()  # without xdist: what the controller handed the checks' side


@dataclass(frozen=True)
class Settings:
    """What the controller and the processes that run the checks both read from the command line."""
    rubric: Rubric
    submissions: list[Submission]
    skipped: list  # folders a glob matched that hold no adapters file, left out
    time_limit: float | None


def settings(config) -> Settings:
    """The run's settings, read before anything is written (the reports folder, its seed): a rubric
    or a path that is no submission stops the run here, as pytest's usage error (exit status 4)."""
    try:
        rubric = Rubric(config.getoption("--rubric"))
    except RubricError as exc:  # pytest prints it, without a traceback
        raise pytest.UsageError(str(exc)) from None
    skipped = []
    try:
        submissions = find_submissions(config.getoption("--impl"), skipped)
    except NotASubmission as exc:
        raise pytest.UsageError(str(exc)) from None
    return Settings(rubric, submissions, skipped, config.getoption("--time-limit"))


def hand_over(config, values: dict):
    """Without xdist: give the checks' side of this process `values`, what a worker would find in its
    workerinput, so that it reads them with `given` as a worker does."""
    config.stash[HANDED_OVER] = dict(values)


def given(config, key: str, default=None):
    """What the controller gave this process's checks under `key`: an xdist worker's workerinput, or
    what it handed over in a run without workers; `default` where it gave nothing."""
    handed = config.workerinput if hasattr(config, "workerinput") else config.stash.get(HANDED_OVER, {})
    return handed.get(key, default)


def send(report, pairs: list):
    """Add `pairs`, [(a key of this module, its value)], to this report's user_properties. On the
    report only: item.user_properties is shared by all of a test's reports."""
    report.user_properties = [*report.user_properties, *pairs]


def received(report) -> dict:
    """What a worker sent on a report, by key ({} for a report of another plugin's test)."""
    return dict(report.user_properties)


def write_identities(path: str, identities: dict):
    """The worker's {node id: CheckIdentity.to_json()}, replacing the file whole or not at all."""
    written = Path(path).with_suffix(".partial")
    written.write_text(json.dumps(identities))
    os.replace(written, path)


def read_identities(path: str) -> dict:
    """What write_identities wrote; {} where the worker wrote none (its collection stopped early)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else {}
