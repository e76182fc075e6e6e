"""A timing budget's measurement: forward+backward passes timed from outside the runners, in a
window of the GPU's time whose length does not depend on the student's speed.

A window pauses every other runner on the GPU (gpu_ledger.py), so its length is what the class
pays. Measured as 5 runner calls of 13 passes for the student, then the reference, the windows of
a class run lasted 65 times the student's pass (long, for a slow kernel), and drawing
inputs and writing outputs inside them left the GPU idle most of that time
(notes/grading-speed.md, "A window lasted as long as the student and held everyone"). Now:

- Outside the window, nothing is paused. Each side compiles, autotunes and warms up (runner op
  warm_timing), then draws the inputs of every pass it may run (prepare_timing): MAX_PASSES for
  the student, two rounds for the reference. How many of them run is decided in the window, from
  the student's first pass there: a pass timed under load, or one that includes compiling, says
  nothing reliable about the kernel (planned from the warm-up, every class run timed one pass).
- In the window, at most WINDOW_S from its start (`measure`):
  1. the reference's passes;
  2. the student's first pass, alone. A first pass over DECIDED times the budget and at least
     EARLY_MIN_MS long is a verdict no noise could change, so nothing more runs. A shorter one is
     not decided alone (its other passes hold the window at most MAX_PASSES x EARLY_MIN_MS, and
     the deadline bounds them): a pass synchronized by itself at a window's start is not the
     kernel's time. On a 2-GPU host one first pass read many times what the same kernel's
     passes read in every other run, the reference reading several times its own time beside it:
     decided at once, it failed a kernel within the budget (notes/grading-speed.md, "A false
     failure, and its fix"). Earlier, on a busy CPU, first passes read up to several times the
     same kernel's later passes (notes/grading-speed.md, "The first pass is a poor witness");
  3. the rest of the student's passes, as many as that first pass says fit, synchronized in three
     stretches (see `fastest` for which is the student's time). Between two synchronizes the
     passes queue on the device as in a training loop, so each pass's Python and launches overlap
     the kernels before it; synchronized one by one, the reference read well over its do_bench
     time in a class run (notes/grading-speed.md, "Call 2 timed every pass synchronized alone");
  4. the reference's passes again, so the two rounds bracket the student's (each round in two
     stretches), if the time left holds them.
  The student's calls may last only until the window's deadline, less RESERVE_S. A pass still
  running then is stopped, with its runner: it fails the budget, with the time it had run as its
  figure.
- After the window, the last pass's outputs are fetched and judged (end_timing).

The reference's configs at the timing case are fixed (reference/flash_triton.py PINNED), so its
time in one window is its time in every other: no autotune run under load picks it.

A stretch's time holds what its ends cost: the synchronize, the phase message's way from the
runner to the grader on a CPU that a class keeps nearly all busy, the first launch. In short
stretches the reference read well over its do_bench time on the idle GPU while SDPA, timed in
the same windows with CUDA events, read its idle time (notes/grading-speed.md, "The reference's
reading, and the fix"). So the reference's stretches are REFERENCE_STRETCH passes
long, cycling over the REFERENCE_INPUTS it prepared: it is the grader's own code, which caches
nothing, so its time does not depend on seeing an input twice. The student's passes keep an
input each, never seen before: a class that remembered one could answer a second time for free.
"""
import time
from dataclasses import dataclass, field

from fa2_sandbox.wire import requests
from fa2_sandbox.wire.cases import FlashCase

WINDOW_S = 3.0  # the longest a window pauses the other runners
IDLE_WAIT_S = 0.5  # of which waiting for the paused runners' kernels in flight may take
WARM_ONCE_OVER_S = 1.5  # a first warm-up pass longer than this is not repeated (a slow kernel's second costs)
RESERVE_S = 0.5  # what the window keeps after the student's passes: the reference's second round, SDPA
SDPA_S = 0.15  # SDPA's peer figure (test_timing.py), its inputs drawn and its kernels loaded before
REFERENCE_GRACE_S = 10.0  # how far past the deadline a reference call may run before it is stopped
MAX_PASSES = 12  # the student's (each holds its inputs on the GPU until it runs: 128 MiB at the timing case)
REFERENCE_STRETCH = 12  # the reference's passes per stretch: enough that the stretch's ends weigh little
REFERENCE_PASSES = 2 * REFERENCE_STRETCH  # per round, timed in two stretches
REFERENCE_INPUTS = 6  # prepared by the reference and cycled over by its passes
DECIDED = 2.0  # a first pass this many times over the budget, and EARLY_MIN_MS long, fails it at once
EARLY_MIN_MS = 500.0  # about three times the longest disturbance of a first pass seen ("A false failure")


def pass_times_ms(phases: dict) -> list:
    """A pass's milliseconds in each stretch between two synchronizes, from the phase messages
    "timed", "pass i", "pass j", ... (i, j: the passes done when each was sent)."""
    if "timed" not in phases:
        return []
    marks = [(0, phases["timed"])] + sorted((int(name.split()[1]), at) for name, at in phases.items()
                                            if name.startswith("pass ") and name.split()[1].isdigit())
    return [(after - before) * 1000 / (j - i) for (i, before), (j, after) in zip(marks, marks[1:]) if j > i]


def stretches(passes: int, count: int) -> int:
    """Passes per synchronize that make `count` timed stretches of `passes` passes (fewer if short)."""
    return max(1, -(-passes // count))


def window_record(window: dict, steps: dict) -> dict:
    """What a check keeps of its window: the seconds rounded to hundredths, anything else (why real
    time was refused, or None; a flag) as it came."""
    def rounded(record: dict) -> dict:
        return {k: round(v, 2) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                for k, v in record.items()}

    return {**rounded(window), "steps": rounded(steps)}


def fastest(values: list) -> float:
    """A side's time: its fastest stretch. What disturbs a stretch in a class run (a paused
    runner's kernel still on the GPU, a launch or a stamp late on a busy CPU) only ever slows it,
    and the reference's first stretch after the window's idle wait reads slower than its others.
    Between two class runs the medians of the stretches moved the ratios more than the fastest
    stretches did: a window's disturbed stretches were enough to move its median
    (notes/grading-speed.md, "The reference's reading, and the ratios"). The student's side is
    judged the same way, which can only favour it."""
    return min(values)


@dataclass
class Measured:
    """What one window measured: a pass's milliseconds per timed stretch (the student's first
    pass, alone, apart), and how the measurement ended."""
    student_ms: list = field(default_factory=list)
    reference_ms: list = field(default_factory=list)
    first_ms: float | None = None  # the student's first pass, synchronized alone
    passes: int = 0  # the student's, the first included
    reference_passes: int = 0
    decided_early: bool = False  # the student's first pass was over DECIDED times the budget
    stopped_after_s: float | None = None  # the student's call was stopped at the deadline after this long
    failed: str = ""  # "student" or "reference": whose call failed (raised, crashed)
    failure: object = None  # that call's reply
    steps: dict = field(default_factory=dict)  # step -> seconds it took: where a window's time went
    # The reference runner's own record of its stretches and of the rounds it timed before each
    # round (fa2_sandbox/runner/stretch_clock.py): kept for the run's summary, never judged.
    reference_own: list = field(default_factory=list)
    reference_rounds_before: list = field(default_factory=list)

    @property
    def student_times(self) -> list:
        """The student's stretches, or its first pass alone where no more were timed."""
        return self.student_ms or ([self.first_ms] if self.first_ms is not None else [])

    @property
    def ratio(self) -> float | None:
        if not self.student_times or not self.reference_ms:
            return None
        return fastest(self.student_times) / fastest(self.reference_ms)


def measure(student, reference, case: FlashCase, budget_ratio: float, deadline: float, clock=time.monotonic,
            student_passes: int = MAX_PASSES, reference_passes: int = REFERENCE_PASSES,
            device: str = "cuda") -> Measured:
    """Steps 1 to 4 above, in the window, before `deadline` (on `clock`), at `case` on `device`, for
    which the runners have prepared `student_passes` and REFERENCE_INPUTS inputs. The
    reference's calls are the grader's own code: they are never stopped at the deadline (its
    second round is left out when the time left would not hold it)."""
    m = Measured()

    def timed(runner, passes, per_sync, until, cycle=False):
        return runner.call(requests.TimePasses(case, passes, per_sync, cycle, device), max(until - clock(), 0.05))

    def reference_round(step) -> bool:
        started = clock()
        reply = timed(reference, reference_passes, stretches(reference_passes, 2), deadline + REFERENCE_GRACE_S,
                      cycle=True)
        m.steps[step] = clock() - started
        if not reply.ok:
            m.failed, m.failure = "reference", reply
            return False
        m.reference_ms += pass_times_ms(reply.phases)
        m.reference_passes += reference_passes
        m.reference_own += (reply.result or {}).get("own_stretches", [])
        m.reference_rounds_before.append((reply.result or {}).get("rounds_before"))
        return True

    def student_round(step, passes) -> bool:
        started = clock()
        reply = timed(student, passes, stretches(passes, 3), deadline - RESERVE_S)
        m.steps[step] = clock() - started
        times = pass_times_ms(reply.phases)
        m.passes += passes if reply.ok else len(times)
        if reply.timed_out:
            m.stopped_after_s = m.steps[step]
        elif not reply.ok:
            m.failed, m.failure = "student", reply
        return reply.ok, times

    if not reference_round("reference"):
        return m
    ok, times = student_round("student's first pass", 1)
    if not ok:
        return m
    m.first_ms = times[0]
    if m.first_ms > DECIDED * budget_ratio * fastest(m.reference_ms) and m.first_ms >= EARLY_MIN_MS:
        m.decided_early = True
        return m
    fit = int((deadline - RESERVE_S - clock()) / (m.first_ms / 1000))  # by the first pass, on a quiet GPU
    if (rest := min(student_passes - 1, fit)) > 0:
        ok, m.student_ms = student_round("student's passes", rest)
        if not ok:
            return m
    if deadline - clock() > m.steps["reference"] + SDPA_S:
        reference_round("reference again")
    return m
