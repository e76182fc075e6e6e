"""The per-submission time limit (--time-limit S), as Gradescope gives each submission its own.

A submission's time is what its checks took, summed over the processes that ran them: under
xdist one submission's tracks run on several workers at once, so no one process sees it all.
Each process that runs a check adds the check's seconds (setup, call and teardown, as pytest
timed them: its runner's start, the student's code, the grader's oracle) to a file per
submission in a folder the controller makes for the run, one line per phase written by a single
append (atomic for a line this short); reading sums the lines. With one worker, or without
xdist, that is the grading's wall clock, as on Gradescope.

Once a submission's time exceeds the limit, an advice check whose turn comes later is cut: it
fails saying so, earns nothing, and no other group gains its points. Only the checks before it in
the run's order of checks count (the collection's order, which every process shares, and which one
process runs them in): one process cuts a check once those before it have taken the limit, and
under xdist, where those before it count once they have finished, no check is cut that one process
running them in order would not cut, whichever of its submission's later checks a worker ran
first. When every finished check counted, a scheduler that starts a slow kernel's part early
(grading/scheduler.py autotuned) cut several times as many of kbjiang's advice checks, its PyTorch
slot's among them (notes/grading-speed.md, "largest kernels first"). A requirement check is
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

    def add(self, submission: str, seconds: float, position: int = 0) -> None:
        """Add a phase's `seconds` of the check at `position` in the run's order of checks."""
        fd = os.open(self._file(submission), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{position} {seconds:.3f}\n".encode())
        finally:
            os.close(fd)

    def of(self, submission: str, before: int | None = None) -> float:
        """The seconds `submission`'s checks have taken so far, in every process of the run: of
        those before position `before` in the run's order of checks, or of all of them."""
        try:
            lines = self._file(submission).read_text().splitlines()
        except FileNotFoundError:
            return 0.0
        entries = [line.split() for line in lines]
        return sum(float(seconds) for position, seconds in entries if before is None or int(position) < before)


CUT = "cut: "  # how a cut check's diagnosis begins


def cut_diagnosis(limit: float, spent: float) -> str:
    return (f"{CUT}this submission's time limit of {limit:g} s was spent (its checks before this one had taken "
            f"{spent:.0f} s when its turn came). The limit cuts advice checks only, never a requirement or a "
            f"timing check; this one earns nothing, and no other group gains its points.")


def is_cut(record) -> bool:
    """Whether a check was cut here rather than run: its outcome reads as a timeout, but no call ran,
    so its runner learnt nothing of the case's size (the scheduler's GradingScheduling.timed_out)."""
    return record.outcome == outcomes.TIMEOUT and (record.diagnosis or "").startswith(CUT)


def exempt(record) -> bool:
    """Checks the limit never cuts: requirements, and timing (bounded on its own)."""
    return not record.advice or record.part == "timing"
