"""Class-wide numbers: how often each check, and each family of cases, fails.

Rates count submissions, not test instances: "60% of the class fails X" means 3 of 5
submissions that ran a check in X failed at least one of them. Skipped checks do not count, nor
do checks the grader itself failed on (not graded), nor ungradable submissions (they fail
everything, which says nothing about X).
"""
import re
from dataclasses import dataclass

from .results import PART_ORDER, PART_LABELS

# Case ids look like "bf16-113x203-d64-causal-4d-strided-x8" (fa2_adapters/wire/cases.py FlashCase.id).
_CASE = re.compile(r"^(?P<dtype>fp16|bf16|fp32|fp64)-(?P<nq>\d+)x(?P<nk>\d+)-d(?P<d>\d+)"
                   r"-(?P<mask>causal|full)(?P<rest>(?:-[\w.]+)*)$")


NO_FAMILIES = {"timing", "memory"}


def case_families(case: str) -> list:
    """Families a case id belongs to, e.g. ["odd sequence lengths", "causal", "bf16"]."""
    m = _CASE.match(case or "")
    if not m:
        return []
    nq, nk, d = int(m["nq"]), int(m["nk"]), int(m["d"])
    rest = m["rest"].split("-")
    families = [m["dtype"]]
    # 64 is the largest tile size students commonly pick: anything else leaves a ragged last tile.
    if nq % 64 or nk % 64:
        families.append("odd sequence lengths")
    if nq != nk:
        families.append("N_q ≠ N_k")
    if m["mask"] == "causal":
        families.append("causal")
    if d & (d - 1):
        families.append("head dim not a power of two")
    if "4d" in rest:
        families.append("4-D inputs")
    if "strided" in rest:
        families.append("strided inputs")
    if any(r.startswith("x") for r in rest):
        families.append("large scores")
    return families


@dataclass
class Rate:
    label: str  # e.g. "robustness / odd sequence lengths"
    part: str
    failed: int
    ran: int
    failed_names: list

    @property
    def fail_fraction(self):
        return self.failed / self.ran if self.ran else 0.0

    @property
    def pass_fraction(self):
        return 1.0 - self.fail_fraction


def _rates(submissions, keys_of) -> list:
    """keys_of(check) -> group keys; returns Rates sorted by pass rate ascending."""
    ran, failed, parts = {}, {}, {}
    for sub in submissions:
        if sub.ungradable:
            continue
        for check in sub.checks:
            if check.state in ("skipped", "ungraded"):
                continue
            for key in keys_of(check):
                ran.setdefault(key, set()).add(sub.name)
                parts.setdefault(key, check.part)
                if check.state == "failed":
                    failed.setdefault(key, set()).add(sub.name)
    order = {p: i for i, p in enumerate(PART_ORDER)}
    rates = [Rate(key, parts[key], len(failed.get(key, ())), len(ran[key]),
                  sorted(failed.get(key, ()))) for key in ran]
    rates.sort(key=lambda r: (r.pass_fraction, order.get(r.part, len(order)), r.label))
    return rates


def check_rates(submissions) -> list:
    """Grouped by (part, check, tier)."""
    def keys(c):
        part = PART_LABELS.get(c.part, c.part)
        return [" / ".join(x for x in (part, c.check, c.tier) if x)]
    return _rates(submissions, keys)


def family_rates(submissions) -> list:
    """Grouped by (part, tier, case family), e.g. "Triton FA2 / robustness / odd sequence lengths".

    The part stays in the key: a bf16 failure in PyTorch says nothing about bf16 in Triton.
    Timing and memory run one or two fixed shapes, so families say nothing the per-check
    table does not; they are left out.
    """
    def keys(c):
        if c.part in NO_FAMILIES:
            return []
        part = PART_LABELS.get(c.part, c.part)
        return [" / ".join(x for x in (part, c.tier, f) if x) for f in case_families(c.case)]
    return _rates(submissions, keys)


def histogram(submissions, bins: int = 10) -> list:
    """[(low_pct, high_pct, [names])]: scores as a percentage of each submission's max."""
    counts = [[] for _ in range(bins)]
    for sub in submissions:
        pct = 100.0 * sub.score / sub.max_score if sub.max_score else 0.0
        index = min(int(pct // (100 / bins)), bins - 1)  # 100% goes in the top bin
        counts[max(index, 0)].append(sub.name)
    width = 100 // bins
    return [(i * width, (i + 1) * width, names) for i, names in enumerate(counts)]
