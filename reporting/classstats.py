"""Class-wide numbers: how often each check, and each family of cases, fails.

Rates count submissions, not test instances: "60% of the class fails X" means 3 of 5
submissions that ran a check in X failed at least one of them. Skipped checks do not count, nor
do checks the grader itself failed on (not graded), nor ungradable submissions (they fail
everything, which says nothing about X).

Parts are named by their labels and ordered as the submissions' results.json files list them
(the rubric's order).
"""
import re
from dataclasses import dataclass

from fa2_sandbox.wire import outcomes

NO_FAMILIES = {"timing", "memory"}
# fa2_sandbox/wire/cases.py SHORT, not imported: that module needs torch, and the reports none.
SHORT_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
# Only for results.json files older than case fields: their case ids, e.g.
# "bf16-113x203-d64-causal-4d-strided-x8" (FlashCase.id), read back.
_CASE = re.compile(r"^(?P<dtype>fp16|bf16|fp32|fp64)-(?P<nq>\d+)x(?P<nk>\d+)-d(?P<d>\d+)"
                   r"-(?P<mask>causal|full)(?P<rest>(?:-[\w.]+)*)$")


def families(dtype: str, n_queries: int, n_keys: int, head_dim: int, is_causal: bool, dims: int = 3,
             noncontiguous: bool = False, large_scores: bool = False) -> list:
    """Families of an attention case, e.g. ["bf16", "odd sequence lengths", "causal"].
    dims: how many dimensions q, k and v have (3 for (B, N, d))."""
    found = [dtype]
    # 64 is the largest tile size students commonly pick: anything else leaves a ragged last tile.
    if n_queries % 64 or n_keys % 64:
        found.append("odd sequence lengths")
    if n_queries != n_keys:
        found.append("N_q ≠ N_k")
    if is_causal:
        found.append("causal")
    if head_dim & (head_dim - 1):
        found.append("head dim not a power of two")
    if dims != 3:
        found.append(f"{dims}-D inputs")
    if noncontiguous:
        found.append("strided inputs")
    if large_scores:
        found.append("large scores")
    return found


def fields_families(fields: dict) -> list | None:
    """Families from a record's case fields (FlashCase.to_json()), or None when they do not
    describe an attention case (a DDP flavour has none; results.json is untrusted)."""
    try:
        return families(SHORT_DTYPES.get(fields["dtype"], str(fields["dtype"])), int(fields["n_queries"]),
                        int(fields["n_keys"]), int(fields["head_dim"]), fields.get("is_causal") is True,
                        dims=len(fields["batch"]) + 2, noncontiguous=fields.get("noncontiguous") is True,
                        large_scores=float(fields.get("score_scale", 1.0)) != 1.0)
    except (KeyError, TypeError, ValueError):
        return None


def case_families(case: str) -> list:
    """Families of a case known only by its id (an older results.json), read back from the id."""
    m = _CASE.match(case or "")
    if not m:
        return []
    rest = m["rest"].split("-")
    dims = next((int(r[:-1]) for r in rest if re.fullmatch(r"\d+d", r)), 3)
    return families(m["dtype"], int(m["nq"]), int(m["nk"]), int(m["d"]), m["mask"] == "causal", dims=dims,
                    noncontiguous="strided" in rest, large_scores=any(r.startswith("x") for r in rest))


def check_families(check) -> list:
    """Families of a check's case: from its case fields, or from its case id where it has none."""
    if check.case_fields:
        return fields_families(check.case_fields) or []
    return case_families(check.case)


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


def _part_order(submissions) -> dict:
    """{part key: position}: the parts in the order the class's results.json files list them."""
    order = {}
    for sub in submissions:
        for part in sub.parts:
            order.setdefault(part.key, len(order))
    return order


def _label(sub, key) -> str:
    part = sub.part(key)
    return part.label if part else key


def _rates(submissions, keys_of) -> list:
    """keys_of(submission, check) -> group keys; returns Rates sorted by pass rate ascending."""
    ran, failed, parts = {}, {}, {}
    for sub in submissions:
        if sub.ungradable:
            continue
        for check in sub.checks:
            if check.state in (outcomes.STATE_SKIPPED, outcomes.STATE_UNGRADED, outcomes.STATE_NOT_HERE):
                continue
            for key in keys_of(sub, check):
                ran.setdefault(key, set()).add(sub.name)
                parts.setdefault(key, check.part)
                if check.state == outcomes.STATE_FAILED:
                    failed.setdefault(key, set()).add(sub.name)
    order = _part_order(submissions)
    rates = [Rate(key, parts[key], len(failed.get(key, ())), len(ran[key]),
                  sorted(failed.get(key, ()))) for key in ran]
    rates.sort(key=lambda r: (r.pass_fraction, order.get(r.part, len(order)), r.label))
    return rates


def check_rates(submissions) -> list:
    """Grouped by (part, check, tier)."""
    def keys(sub, c):
        return [" / ".join(x for x in (_label(sub, c.part), c.check, c.tier) if x)]
    return _rates(submissions, keys)


def family_rates(submissions) -> list:
    """Grouped by (part, tier, case family), e.g. "Triton FA2 / robustness / odd sequence lengths".

    The part stays in the key: a bf16 failure in PyTorch says nothing about bf16 in Triton.
    Timing and memory run one or two fixed shapes, so families say nothing the per-check
    table does not; they are left out.
    """
    def keys(sub, c):
        if c.part in NO_FAMILIES:
            return []
        return [" / ".join(x for x in (_label(sub, c.part), c.tier, f) if x) for f in check_families(c)]
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
