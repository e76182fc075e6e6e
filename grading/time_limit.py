"""The per-submission time limit (--time-limit S), as Gradescope gives each submission its own.

A submission's time is what its checks took, summed over the processes that ran them: under
xdist one submission's tracks run on several workers at once, so no one process sees it all.
Each process that runs a check adds the check's seconds (setup, call and teardown, as pytest
timed them: its runner's start, the student's code, the grader's oracle) to a file per
submission in a folder the controller makes for the run, one line per phase written by a single
append (atomic for a line this short); reading sums the lines. With one worker, or without
xdist, that is the grading's wall clock, as on Gradescope.

Once a submission's time exceeds the limit, an advice check whose turn comes later is cut: it
fails saying so, earns nothing, and no other group gains its points. A requirement check is
never cut, nor a timing check: its cost is bounded on its own (the `timing` timeout, then a
window of at most a few seconds: grading/checks/timed_window.py), and a class's timing should
be measured for every submission. The time counts only its own submission's checks, though a
class's load slows each of them: on a shared machine a submission's time still depends a
little on its neighbours, as a container's does on a shared host.
"""
import os
from pathlib import Path

from fa2_sandbox.wire import outcomes


class SpentTime:
    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def _file(self, submission: str) -> Path:
        return self.folder / submission  # a submission's name is a folder's: it holds no "/"

    def add(self, submission: str, seconds: float) -> None:
        fd = os.open(self._file(submission), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{seconds:.3f}\n".encode())
        finally:
            os.close(fd)

    def of(self, submission: str) -> float:
        """The seconds `submission`'s checks have taken so far, in every process of the run."""
        try:
            return sum(float(line) for line in self._file(submission).read_text().split())
        except FileNotFoundError:
            return 0.0


CUT = "cut: "  # how a cut check's diagnosis begins


def cut_diagnosis(limit: float, spent: float) -> str:
    return (f"{CUT}this submission's time limit of {limit:g} s was spent (its checks had taken {spent:.0f} s when "
            f"this one's turn came). The limit cuts advice checks only, never a requirement or a timing check; "
            f"this one earns nothing, and no other group gains its points.")


def is_cut(record) -> bool:
    """Whether a check was cut here rather than run: its outcome reads as a timeout, but no call ran,
    so its runner learnt nothing of the case's size (the scheduler's GradingScheduling.timed_out)."""
    return record.outcome == outcomes.TIMEOUT and (record.diagnosis or "").startswith(CUT)


def exempt(record) -> bool:
    """Checks the limit never cuts: requirements, and timing (bounded on its own)."""
    return not record.advice or record.part == "timing"
