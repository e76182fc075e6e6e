"""A pytest plugin for bench/grade_speed.py: when each test ran, and on which worker.

    FA2_TIMELINE=PATH python -m pytest -p bench.timeline ...

On the controller (or in a run without xdist) it keeps, for every test phase that took time, the
worker that ran it and pytest's own start and stop times, and writes them to PATH as JSON when
the session ends. grade_speed.py turns that into each worker's busy and idle time, which is
what bounds a run's wall time: the last worker to finish, and why.
"""
import json
import os
from pathlib import Path

_ROWS = []


def pytest_runtest_logreport(report):
    if not os.environ.get("FA2_TIMELINE") or not getattr(report, "start", None):
        return
    node = getattr(report, "node", None)  # set by xdist on the controller: the worker's handle
    worker = node.gateway.id if node is not None else "main"
    _ROWS.append({"worker": worker, "test": report.nodeid, "when": report.when,
                  "start": report.start, "stop": report.stop, "outcome": report.outcome})


def pytest_sessionfinish(session):
    path = os.environ.get("FA2_TIMELINE")
    if path and not hasattr(session.config, "workerinput"):  # the controller writes it, once
        Path(path).write_text(json.dumps(_ROWS))
