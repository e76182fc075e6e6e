"""Where a grading run's time went: seconds by check kind and by submission, like `--durations`.

The controller adds every grading test's report (setup, call and teardown, as pytest timed them
in the worker that ran it), and the terminal summary prints the totals. Under xdist the tests
overlap, so the sums exceed the wall time; they still say which kinds of check cost the most.
"""
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

    def add(self, submission: str, nodeid: str, seconds: float, record: dict | None) -> None:
        self.by_submission[submission] += seconds
        if record is not None:
            kind = self._kind_of_test[nodeid] = kind_of(record)
            self.count[kind] += 1
            self.by_kind[kind] += seconds + self._setup.pop(nodeid, 0.0)
        elif nodeid in self._kind_of_test:  # teardown
            self.by_kind[self._kind_of_test[nodeid]] += seconds
        else:  # setup comes before the call that names the kind
            self._setup[nodeid] += seconds

    def lines(self, top: int = 10) -> list:
        """The slowest check kinds and submissions, one line each."""
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
        return lines
