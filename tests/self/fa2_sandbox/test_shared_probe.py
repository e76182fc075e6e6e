"""The isolation probe runs once per grading run, in the controller, and its workers take its
answer (fa2_sandbox/harness/shared_probe.py); a worker asked anything else probes itself."""
import json

import pytest

from fa2_sandbox.harness import confinement, shared_probe

PARENT, LIMIT = "/tmp", 3 << 30


@pytest.fixture
def probes(monkeypatch):
    """sandbox's probe replaced by one that counts its calls (a real one starts a confined torch)."""
    calls = []

    def probe(scratch_parent, data_limit):
        calls.append((scratch_parent, data_limit))
        return {"mode": "userns", "network": True, "data_limit": True, "note": f"probe {len(calls)}"}

    monkeypatch.setattr(confinement, "_probe_isolation", probe)
    monkeypatch.setattr(confinement, "_ISOLATION", {})
    monkeypatch.setattr(confinement, "_ANSWERED_ELSEWHERE", {})
    return calls


def as_another_process(monkeypatch):
    """What a worker starts with: nothing this process's isolation() was told or found."""
    monkeypatch.setattr(confinement, "_ISOLATION", {})
    monkeypatch.setattr(confinement, "_ANSWERED_ELSEWHERE", {})


def test_a_worker_takes_the_controllers_answer(tmp_path, probes, monkeypatch):
    path = tmp_path / "answer.json"
    shared_probe.start(path, PARENT, LIMIT).join()
    as_another_process(monkeypatch)
    shared_probe.adopt(path, shared_probe.question(PARENT, LIMIT))
    assert confinement.isolation(PARENT, LIMIT)["note"] == "probe 1"
    assert probes == [(PARENT, LIMIT)], "the worker probed again"


def test_a_worker_waits_for_an_answer_still_coming(tmp_path, probes, monkeypatch):
    path = tmp_path / "answer.json"
    question = shared_probe.question(PARENT, LIMIT)
    shared_probe.adopt(path, question)  # before the controller has answered
    late = {"question": question, "isolation": {"mode": "namespace", "note": "the controller's, late"}}
    monkeypatch.setattr(shared_probe.time, "sleep", lambda s: path.write_text(json.dumps(late)))
    assert confinement.isolation(PARENT, LIMIT)["note"] == "the controller's, late"
    assert probes == []


def test_another_question_is_probed_again(tmp_path, probes, monkeypatch):
    path = tmp_path / "answer.json"
    shared_probe.start(path, PARENT, LIMIT).join()
    as_another_process(monkeypatch)
    shared_probe.adopt(path, shared_probe.question(PARENT, LIMIT))
    assert confinement.isolation(PARENT, LIMIT // 2)["note"] == "probe 2"  # this worker's runners' limit differs
    elsewhere = {**shared_probe.question(PARENT, LIMIT), "host": "another-host"}
    as_another_process(monkeypatch)
    shared_probe.adopt(path, elsewhere)
    assert confinement.isolation(PARENT, LIMIT)["note"] == "probe 3"


def test_a_failed_controller_probe_leaves_each_worker_its_own(tmp_path, probes, monkeypatch):
    path = tmp_path / "answer.json"
    monkeypatch.setattr(confinement, "_probe_isolation", lambda *a: 1 / 0)
    shared_probe.start(path, PARENT, LIMIT).join()
    assert "ZeroDivisionError" in path.read_text()
    monkeypatch.setattr(confinement, "_probe_isolation", lambda *a: {"mode": "none", "note": "the worker's own"})
    shared_probe.adopt(path, shared_probe.question(PARENT, LIMIT))
    assert confinement.isolation(PARENT, LIMIT)["note"] == "the worker's own"
