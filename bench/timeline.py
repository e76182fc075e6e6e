"""A pytest plugin for bench/grade_speed.py: when each test ran, and on which worker.

    FA2_TIMELINE=PATH python -m pytest -p bench.timeline ...

On the controller (or in a run without xdist) it appends, for every test phase that took time,
the worker that ran it and pytest's own start and stop times to PATH, one JSON object a line, as
each report comes: a run stopped at grade_speed.py's limit keeps what it did (written only at the
end, the timeline of every stopped corpus run was lost). grade_speed.py turns that into each
worker's busy and idle time, which is what bounds a run's wall time: the last worker to finish,
and why.
"""
import json
import os


def pytest_runtest_logreport(report):
    path = os.environ.get("FA2_TIMELINE")
    if not path or not getattr(report, "start", None):
        return
    node = getattr(report, "node", None)  # set by xdist on the controller: the worker's handle
    worker = node.gateway.id if node is not None else "main"
    with open(path, "a") as f:
        f.write(json.dumps({"worker": worker, "test": report.nodeid, "when": report.when,
                            "start": report.start, "stop": report.stop, "outcome": report.outcome}) + "\n")
