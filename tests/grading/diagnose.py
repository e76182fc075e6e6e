"""Turn a wrong tensor into one sentence a student can act on, plus a picture of where it is wrong.

Each rule compares the student's tensor with the oracle, or with the oracle of a known mistake
(non-causal attention, no 1/sqrt(d) scale, base-2 LSE, ...), and speaks only when the evidence
is clear. Otherwise the sentence says where the error concentrates.
"""
import math
import torch

from reference.oracle import attention_and_grads

TILE = 16  # rows per heatmap cell: fine enough to show a missing tail tile of any common size


def _close(a, b, tol=1e-2) -> bool:
    return a.shape == b.shape and bool(torch.isfinite(a).all()) and (a - b).abs().max().item() <= tol * (1 + b.abs().max().item())


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """(batch, rows, features) whatever the leading dims."""
    if t.dim() == 1:
        return t[None, :, None]
    if t.dim() == 2:
        return t[:, :, None]
    return t.reshape(-1, t.shape[-2], t.shape[-1])


def heatmap(name: str, err: torch.Tensor) -> dict:
    """Max error per (row tile, batch-head): rows are query tiles for o, L, dq; key tiles for dk, dv."""
    e = _rows_view(err).amax(dim=-1)  # (batch, rows)
    n = e.shape[1]
    starts = list(range(0, n, TILE))
    values = [[float(e[b, s:s + TILE].max()) for b in range(min(e.shape[0], 16))] for s in starts]
    return {"tensor": name, "row_label": "key tile" if name in ("dk", "dv") else "query tile",
            "col_label": "batch x head", "row_starts": starts, "col_starts": list(range(len(values[0]))),
            "values": values}


def _tail_rows(err_rows: torch.Tensor, bound: float):
    """If the wrong rows are the last partial tile (after at least one good tile, at most 128
    rows long), the first wrong row index; else None. Row 0 of a causal case is trivially
    right, so a lone good first row proves nothing."""
    wrong = (err_rows > bound).nonzero().flatten()
    if len(wrong) == 0:
        return None
    first = int(wrong[0])
    tail = len(err_rows) - first
    return first if first >= TILE and tail <= 128 and bool((err_rows[first:] > bound).float().mean() > 0.5) else None


def explain(verdict, tensors: dict, inputs: tuple, oracle: dict, case) -> tuple[str, dict]:
    """One sentence about the first wrong tensor, and its error heatmap."""
    inputs = tuple(t.cpu() for t in inputs)
    oracle = {key: value.cpu() for key, value in oracle.items()}
    name = verdict.reason.split(" ", 1)[0]
    got = tensors[name].double()
    want = oracle[name]
    err = (got - want).abs() if got.shape == want.shape else None
    picture = heatmap(name, err) if err is not None else None
    if err is None:
        return verdict.reason, None
    if not torch.isfinite(got).all():
        return f"{name} contains NaN or Inf: look for exp of an unmasked -inf row or a division by a zero row sum.", picture

    if name == "L":
        ratio = (got / want).median().item()
        if abs(ratio - 1 / math.log(2)) < 0.02:
            return "L differs from the oracle by a factor of 1/ln 2: the LSE is stored in base 2.", picture
        offset = got - want
        if offset.shape[-1] > 1 and offset.std().item() < 1e-3 * (1 + offset.abs().mean().item()) and offset.abs().mean() > 1e-3:
            return f"L is off by a constant {offset.mean().item():.3g}: the running max is missing from L = m + log(l).", picture

    q, k, v, do = inputs
    if case.is_causal and _close(got, attention_and_grads(q, k, v, do, False)[name]):
        return f"{name} equals non-causal attention: is_causal is ignored.", picture
    if name in ("o", "L"):
        unscaled = attention_and_grads(q * math.sqrt(case.head_dim), k, v, do, case.is_causal)
        if _close(got, unscaled[name]):
            return f"{name} matches attention without the 1/sqrt(d) scale: the scores are not scaled.", picture
    if name in ("dq", "dk") and "dq" in tensors and "dk" in tensors and tensors["dq"].shape == tensors["dk"].shape:
        other = "dk" if name == "dq" else "dq"
        if _close(got, oracle[other]):
            return "dQ and dK are swapped.", picture

    rows = _rows_view(err).amax(dim=(0, 2))
    first = _tail_rows(rows, verdict.max_bound)
    if first is not None:
        axis = "key" if name in ("dk", "dv") else "query"
        return (f"{name} is wrong only for {axis} rows >= {first} of every batch: the last partial "
                f"{axis} tile is dropped or not masked.", picture)
    share = (rows > verdict.max_bound).float().mean().item()
    if share == 0:  # failed on the mean error: small errors spread everywhere
        return (f"{name} is slightly wrong almost everywhere: its mean error {verdict.mean_err:.3g} exceeds "
                f"{verdict.mean_bound:.3g}, though no element exceeds the max bound.", picture)
    return (f"{name} is wrong in {share:.0%} of its rows (worst at index {list(verdict.worst_index)}: "
            f"oracle {verdict.oracle_at_worst:.4g}, got {verdict.actual_at_worst:.4g}).", picture)

