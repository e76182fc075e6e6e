"""A runner call's deadline moves by the time its runner spent compiling an autotuner's configs.

A flash call's timeout (rubric.yaml, 300 s) stops a kernel that hangs or crawls. An autotuned
kernel compiles every config before its first answer, and beside a class those compiles share the
cores with every other runner's: one submission's float32 d=128 call, five configs a kernel,
answered within a minute of the timeout in four class runs on one kind of machine, and timed out in
two runs on a machine whose Python runs a third slower (notes/grading-speed.md, "The autotuner's
compile and the flash timeout"). The same code, answering the same case, passed or failed with the
machine and the class beside it.

So the runner tells the harness when it compiles an autotuner's configs side by side (the grader's own
code: fa2_sandbox/runner/parallel_autotune.py sends an event "compiling", on and then off), and the
call's deadline moves by that time, at most MAX_CREDIT times the call's timeout. The kernel's own
running still has the whole timeout; a call that hangs sends no such event and ends on time. A
runner is the student's process and could send the event itself: it gains at most MAX_CREDIT times
the timeout, once per call, which only slows the class and never passes a check. A deadline that
`until` bounds (a timing warm-up's) moves no further than `until`.
"""
import time

MAX_CREDIT = 1.0  # of the call's timeout


class CompileCredit:
    """What one call's runner said of its compiling, and how much of it the deadline has had."""

    def __init__(self, timeout: float):
        self.cap = MAX_CREDIT * timeout
        self.since = None  # when the compile under way began (time.monotonic)
        self.done_s = 0.0  # compiles that ended
        self.credited = 0.0

    def heard(self, message: dict) -> None:
        """An event "compiling": {"on": true} as a compile begins, {"on": false} as it ends."""
        now = time.monotonic()
        if message.get("on") is True and self.since is None:
            self.since = now
        elif message.get("on") is False and self.since is not None:
            self.done_s += now - self.since
            self.since = None

    def owed(self) -> float:
        """The seconds of compiling not yet added to the deadline, up to the cap; counted as added."""
        so_far = self.done_s + (time.monotonic() - self.since if self.since is not None else 0.0)
        total = min(so_far, self.cap)
        owed = max(0.0, total - self.credited)
        self.credited += owed
        return owed
