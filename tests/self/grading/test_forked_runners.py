"""Which runners fork from the fork server (fa2_sandbox/harness/forked.py): every runner of a
student's code, its timing tracks' too; the timing reference alone starts afresh, the way its
passes were measured when the budgets were set (grading/session.py WorkerState.runner,
grading/checks/test_timing.py reference_runner)."""
from pathlib import Path
from types import SimpleNamespace

from grading import session
from grading.checks import test_timing
from grading.session import WorkerState
from grading.tracks import Track, timing_track


class Recorded:
    """SubmissionRunner's arguments, and no process."""

    def __init__(self, submission, **kwargs):
        self.submission, self.kwargs = submission, kwargs


def worker_state():
    state = SimpleNamespace(_runners={}, _kept={}, gpu_ledger=None, rubric=SimpleNamespace(timeout=lambda name: 120))
    state._switch_to = lambda name, track: None
    state.worker_env = lambda: {}
    state.kept_kernels = lambda root, name: None
    state.keep = lambda name, start: WorkerState.keep(state, name, start)
    return state


def test_a_students_runners_are_forked_its_timing_ones_too(monkeypatch):
    monkeypatch.setattr(session, "SubmissionRunner", Recorded)
    state, student = worker_state(), SimpleNamespace(name="student", root=Path("student"))
    for track in (timing_track("triton"), timing_track("pytorch"), Track("pytorch"), Track("triton-bfloat16-causal")):
        assert WorkerState.runner(state, student, track).kwargs.get("forked", True) is True, track


def test_the_timing_reference_starts_afresh(monkeypatch):
    monkeypatch.setattr(test_timing, "SubmissionRunner", Recorded)
    reference = test_timing.reference_runner(worker_state())
    assert reference.kwargs["forked"] is False
    assert reference.kwargs["learns_timeouts"] is False  # kept from one submission's check to the next
    assert reference.submission.name == "reference"


def test_a_worker_s_close_ends_its_fork_servers_and_their_folders(tmp_path, monkeypatch):
    """At the session's end, not at the interpreter's exit: an xdist worker could be gone before its
    atexit handlers ran, and a server's folder stayed behind in the temporary folder."""
    from fa2_sandbox.harness import forked

    closed = []
    monkeypatch.setitem(forked._servers, "an environment", SimpleNamespace(close=lambda: closed.append(True)))
    runner = SimpleNamespace(close=lambda: closed.append("runner"))
    state = SimpleNamespace(_runners={("student", "track"): runner}, _kept={})
    WorkerState.close(state)
    assert closed == ["runner", True] and forked._servers == {}
