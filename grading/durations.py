"""Where a grading run's time went: seconds by check kind and by submission, like `--durations`.

The controller adds every grading test's report (setup, call and teardown, as pytest timed them
in the worker that ran it), and the terminal summary prints the totals. Under xdist the tests
overlap, so the sums exceed the wall time; they still say which kinds of check cost the most.
The wall clock is split too: starting up, the checks, the workers stopping, scoring and reports.
"""
import time
from collections import defaultdict


def kind_of(record: dict) -> str:
    """'flash_triton::forward[handout]': the part, the check and the tier, without the case."""
    tier = record.get("tier") or ""
    return f"{record.get('part')}::{record.get('check')}" + (f"[{tier}]" if tier and tier != "default" else "")


class Durations:
    def __init__(self):
        self.by_kind = defaultdict(float)
        self.count = defaultdict(int)
        self.by_submission = defaultdict(float)
        self._kind_of_test = {}  # nodeid -> kind, learned from the check record on the call report
        self._setup = defaultdict(float)  # nodeid -> setup seconds, until its record names the kind
        # Wall-clock marks (time.monotonic) in the controller: the phases of the whole run.
        self.marks = {"started": time.monotonic()}
        self.windows = []  # how long each timing window paused the other runners (test_timing.py)

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic()

    def add(self, submission: str, nodeid: str, seconds: float, record: dict | None) -> None:
        now = time.monotonic()
        self.marks.setdefault("first result", now)
        self.marks["last result"] = now
        self.by_submission[submission] += seconds
        if record is not None:
            held = ((record.get("timing") or {}).get("window") or {}).get("held_s")
            if held is not None:
                self.windows.append(held)
            kind = self._kind_of_test[nodeid] = kind_of(record)
            self.count[kind] += 1
            self.by_kind[kind] += seconds + self._setup.pop(nodeid, 0.0)
        elif nodeid in self._kind_of_test:  # teardown
            self.by_kind[self._kind_of_test[nodeid]] += seconds
        else:  # setup comes before the call that names the kind
            self._setup[nodeid] += seconds

    # The wall clock's phases: each ends at its mark, and starts at the last mark before it that was set.
    PHASES = (("first result", "until the first result"), ("last result", "of checks"),
              ("workers down", "until the last worker stopped"), ("scoring", "until scoring began"),
              ("reports written", "scoring and writing reports"))

    def wall_clock(self) -> str:
        """'wall clock W s: A s until the first result, B s of checks, ...' (each phase's seconds)."""
        parts, since = [], self.marks["started"]
        for mark, what in self.PHASES:
            if mark in self.marks:
                parts.append(f"{self.marks[mark] - since:.0f} s {what}")
                since = self.marks[mark]
        total = time.monotonic() - self.marks["started"]
        return f"wall clock {total:.0f} s" + (": " + ", ".join(parts) if parts else "")

    def lines(self, top: int = 10) -> list:
        """The slowest check kinds and submissions, one line each, then the wall clock's phases."""
        if left := sum(self._setup.values()):  # tests that never recorded a check
            self.by_kind["(tests without a check record)"] += left
            self._setup.clear()
        if not self.by_kind:
            return []
        lines = [f"time by check kind (the {min(top, len(self.by_kind))} slowest of {len(self.by_kind)}):"]
        for kind, seconds in sorted(self.by_kind.items(), key=lambda kv: -kv[1])[:top]:
            count = self.count.get(kind, 0)
            lines.append(f"  {seconds:8.1f} s  {count:4d} check{'s' if count != 1 else ' '}  {kind}")
        ranked = sorted(self.by_submission.items(), key=lambda kv: -kv[1])
        lines.append(f"time by submission (the {min(top, len(ranked))} slowest of {len(ranked)}):")
        lines += [f"  {seconds:8.1f} s  {name}" for name, seconds in ranked[:top]]
        if self.windows:
            lines.append(self.timing_windows())
        return lines + [self.wall_clock()]

    def timing_windows(self) -> str:
        """'timing windows: N, the longest paused the other runners L s, all together T s'."""
        return (f"timing windows: {len(self.windows)}, the longest paused the other runners {max(self.windows):.1f} s, "
                f"all together {sum(self.windows):.1f} s")
