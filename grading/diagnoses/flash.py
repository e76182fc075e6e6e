"""Turn a wrong tensor into one sentence a student can act on, plus a picture of where it is wrong.

Each rule compares the student's tensor with the oracle, or with the oracle of a known mistake
(non-causal attention, no 1/sqrt(d) scale, base-2 LSE, exp2 without log2(e), ...), and speaks only when the evidence
is clear. Otherwise the sentence says where the error concentrates.
"""
import math
import re

import torch

# What a backward's sentence says when its tensors are a right backward's on the forward's wrong
# answer: the check then points at the forward check of its case (grading/checks/test_flash.py).
WRONG_FORWARD = "a right backward run on a wrong forward"
TILE = 16  # rows per heatmap cell: fine enough to show a missing tail tile of any common size
# A known mistake is named only when the student's tensor is this many times nearer its answer
# than the true one (largest distances), so never for an error of rounding size. Where the
# mistake barely changes the answer, both are equally near and nothing is named: with scores x8
# (a one-hot softmax) the zero keys a padded last tile adds get weight exp(0 - 100) or less, so
# padded-keys attention equals the oracle (to float64's last digit, seeds 0..19), and an o that
# failed its mean bound by rounding "matched" it (issue 36: told its last key tile reads past N_k).
CLEAR_MARGIN = 4.0


def _close(a, b, tol=1e-2) -> bool:
    """Equal to 1% of b's largest magnitude: loose enough for bf16, tight enough to tell mistakes apart."""
    if a.shape != b.shape or a.numel() == 0 or not torch.isfinite(a).all():
        return False
    return (a - b).abs().max().item() <= tol * (1 + b.abs().max().item())


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


def _nearer(got, mistake, want) -> bool:
    """`got` matches `mistake` better than `want`, the true answer, by a clear margin."""
    return CLEAR_MARGIN * (got - mistake).abs().max().item() <= (got - want).abs().max().item()


def _tail_rows(err_rows: torch.Tensor, bound: float):
    """If the wrong rows are the last partial tile (after at least one good tile, at most 128
    rows long), the first wrong row index; else None. Row 0 of a causal case is trivially
    right, so a lone good first row proves nothing."""
    wrong = (err_rows > bound).nonzero().flatten()
    if len(wrong) == 0:
        return None
    first = int(wrong[0])
    tail = len(err_rows) - first
    # A partial tile is shorter than a tile, and a tile divides `first`: so tail < first.
    partial = first >= TILE and tail <= 128 and tail < first
    return first if partial and bool((err_rows[first:] > bound).float().mean() > 0.5) else None


def _good_then_bad(err_rows: torch.Tensor, bound: float):
    """The first wrong row when it is a power of two >= 16 and the rows before it are right
    (one good tile, then wrong), else None."""
    wrong = (err_rows > bound).nonzero().flatten()
    first = int(wrong[0]) if len(wrong) else 0
    return first if first >= TILE and first & (first - 1) == 0 else None


def _proportional(got, want):
    """c when got = c * want (to 1%) for some c other than 1, else None."""
    norm = (want * want).sum().item()
    if norm == 0 or not torch.isfinite(got).all():
        return None
    c = (got * want).sum().item() / norm
    return c if abs(c - 1) > 0.05 and _close(got, c * want) else None


def explain(verdicts: dict, tensors: dict, oracle: dict, case, mistaken) -> tuple[str, dict]:
    """One sentence about the first wrong tensor, and its error heatmap. `verdicts` maps every
    judged tensor to its verdict; `mistaken(name)` gives mistakes.oracle_of(name, ...) for this
    case's inputs (the caller caches it across submissions)."""
    name = next(n for n, v in verdicts.items() if not v.ok)
    verdict = verdicts[name]
    got = tensors[name].double()
    want = oracle[name].cpu()
    if got.shape != want.shape:
        return verdict.reason, None
    err = (got - want).abs()
    picture = heatmap(name, err)
    sentence = _sentence(name, verdict, verdicts, got, err, tensors, oracle, case, mistaken)
    return _with_the_others(sentence, name, verdicts), picture


def blames_the_forward(sentence: str) -> bool:
    """Whether a backward's sentence says its tensors come from a wrong forward."""
    return WRONG_FORWARD in sentence


def _and(words: list) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _named(tensor: str, sentence: str) -> bool:
    """Whether the sentence names `tensor` ("dq", or "dQ" as the swap's sentence writes it)."""
    spellings = {tensor, tensor[0] + tensor[1:].upper()}
    return any(re.search(rf"\b{re.escape(s)}\b", sentence) for s in spellings)


def _with_the_others(sentence: str, name: str, verdicts: dict) -> str:
    """The sentence about the first wrong tensor, and the other wrong tensors it does not name: a
    backward whose dq, dk and dv are all wrong says so, not dq alone."""
    others = [n for n, v in verdicts.items() if not v.ok and n != name and not _named(n, sentence)]
    if not others:
        return sentence
    return (f"{sentence} {_and(others)} {'is' if len(others) == 1 else 'are'} wrong too "
            f"(each tensor's error is below).")


class _Failure:
    """One wrong tensor and everything its rules compare it with."""

    def __init__(self, name, verdict, verdicts, got, err, tensors, oracle, case, mistaken):
        self.name, self.verdict, self.verdicts = name, verdict, verdicts
        self.got, self.err, self.tensors, self.oracle = got, err, tensors, oracle
        self.case, self.mistaken = case, mistaken
        self.want = oracle[name].cpu()
        self.d = case.head_dim

    def matches(self, mistake, from_row=0, tensor=None) -> bool:
        """`tensor` (by default the wrong one), from row `from_row` on, is clearly the answer of `mistake`."""
        tensor = tensor or self.name
        mine = self.got if tensor == self.name else self.tensors[tensor].double()
        truth = self.want if tensor == self.name else self.oracle[tensor].cpu()
        got_rows = _rows_from(mine, from_row, tensor)
        mistake_rows = _rows_from(self.mistaken(mistake)[tensor], from_row, tensor)
        return _close(got_rows, mistake_rows) and _nearer(got_rows, mistake_rows, _rows_from(truth, from_row, tensor))


def _rows_from(t, row, tensor):
    """Rows `row` onward: rows are the last axis of L, the second to last of the others."""
    return t[..., row:] if tensor == "L" else t[..., row:, :]


def _not_finite(f: _Failure):
    finite = torch.isfinite(f.got)
    if finite.all():
        return None
    case, name = f.case, f.name
    if case.score_shift < -100:
        return (f"{name} contains NaN or Inf where every score is near {case.score_shift:g}: exp(s - m) underflows "
                f"to 0 and the row sum l is 0. Start the running max m at -inf, not 0.")
    bad_rows = (~_rows_view(finite)).any(dim=(0, 2)).nonzero().flatten().tolist()
    if case.is_causal and bad_rows == [0] and case.n_queries > 1 and name not in ("dk", "dv"):
        return (f"{name} is NaN or Inf in query row 0 only: the first query sees no key, so the causal mask "
                f"hides the diagonal (j >= i instead of j > i).")
    return f"{name} contains NaN or Inf: look for exp of an unmasked -inf row or a division by a zero row sum."


def _lse_mistake(f: _Failure):
    if f.name != "L":
        return None
    ratio = (f.got / f.want).median().item()
    if abs(ratio - 1 / math.log(2)) < 0.02:
        return "L differs from the oracle by a factor of 1/ln 2: the LSE is stored in base 2."
    offset = f.got - f.want
    mean = offset.abs().mean().item()
    if offset.shape[-1] > 1 and offset.std().item() < 1e-3 * (1 + mean) and mean > 1e-3:
        if mean > 0.1:  # a row max is of order 1 or more; a rounding bias is not
            return (f"L is off by a constant {offset.mean().item():.3g}: the running max is missing from "
                    f"L = m + log(l).")
        return (f"L is off by the same {offset.mean().item():.3g} in every row: a systematic bias, not a missing "
                f"term. Look for a constant rounded to low precision (log2(e), ln 2) or L computed in "
                f"{f.case.dtype}.")
    if f.matches("lse-without-max"):
        return "L equals log(l) without the row max: the running max m is missing from L = m + log(l)."
    if f.matches("base2-unscaled-log2"):
        return ("L matches m + log2(l) of a softmax that uses exp2 on scores not multiplied by log2(e) = 1.4427: "
                "it computes softmax(S ln 2) instead of softmax(S), and L is left in base 2. Fold log2(e) into "
                "the softmax scale and store L in natural log, (m + log2(l)) * ln 2.")
    return None


def _causal_mistake(f: _Failure):
    if not f.case.is_causal:
        return None
    name = f.name
    if f.matches("non-causal"):
        return f"{name} equals non-causal attention: is_causal is ignored."
    tiles = ("", "-16", "-32", "-64", "-128")
    if name in ("dq", "dk", "dv") and any(f.matches(f"backward-unmasked{t}") for t in tiles):
        return (f"{name} matches a backward that recomputes P = exp(S - L) without the causal mask: the forward "
                f"is causal, the backward ignores is_causal.")
    if f.matches("diagonal-masked", from_row=1 if name in ("o", "L", "dq") else 0):
        return (f"{name} matches causal attention that also hides each query's own key: the mask uses j >= i "
                f"where it should use j > i.")
    return None


def _padded_keys(f: _Failure):
    case = f.case
    padded = [t for t in (16, 32, 64, 128)
              if not case.is_causal and case.n_keys % t and f.matches(f"padded-keys-{t}")]
    if not padded:
        return None
    # the tile whose padding fits best: 31 and 63 zero keys can both pass the 1% test
    tile = min(padded, key=lambda t: (f.got - f.mistaken(f"padded-keys-{t}")[f.name]).abs().max().item())
    return (f"{f.name} matches attention over {case.n_keys} keys plus {-case.n_keys % tile} zero keys: the "
            f"last key tile reads past N_k = {case.n_keys} and its zero padding enters the softmax sum. "
            f"Mask key positions >= N_k in non-causal mode too.")


def _scale_mistake(f: _Failure):
    name, d = f.name, f.d
    # exp2 without log2(e) scales the scores by ln 2 / sqrt(d), not 1 / sqrt(d). At d = 32 that is
    # 0.1225, within 2% of a hard-coded 1/8, so where both fit, the clearly nearer one is named, and
    # where neither is clearly nearer, both are (issue 34: exp2 was told its head dim is hard-coded).
    base2 = f.matches("base2-unscaled")
    eighth = d != 64 and f.matches("scale-1/8")
    if base2 and eighth:
        like_base2, like_eighth = f.mistaken("base2-unscaled")[name], f.mistaken("scale-1/8")[name]
        base2, eighth = _nearer(f.got, like_base2, like_eighth), _nearer(f.got, like_eighth, like_base2)
        if not (base2 or eighth):
            return (f"{name} matches attention whose scores are scaled by about 1/8 instead of 1/sqrt({d}): either "
                    f"the head dimension is hard-coded (1/8 = 1/sqrt(64)), or the softmax uses exp2 on scores not "
                    f"multiplied by log2(e) = 1.4427 (a scale of ln 2/sqrt({d}) = {math.log(2) / math.sqrt(d):.4f}). "
                    f"At d = {d} the two are too close to tell apart; the checks at other head dims say which.")
    if base2 and name in ("o", "L"):
        what = "the logsumexp of softmax(S ln 2) attention" if name == "L" else "softmax(S ln 2) attention"
        return (f"{name} matches {what}: the softmax uses exp2 but the scores were not multiplied by log2(e) = "
                f"1.4427, so it computes softmax(S ln 2) instead of softmax(S). Fold log2(e) into the softmax scale: "
                f"log2(e) / sqrt(d).")
    if base2:
        return _base2_forward_under_backward(f)
    if name in ("o", "L") and f.matches("unscaled"):
        return f"{name} matches attention without the 1/sqrt(d) scale: the scores are not scaled."
    if eighth:
        return (f"{name} matches attention scaled by 1/8 = 1/sqrt(64) although d = {d}: the head dimension is "
                f"hard-coded; use 1/sqrt(q.shape[-1]).")
    return None


def _base2_forward_under_backward(f: _Failure) -> str:
    """A gradient that matches the exp2-without-log2(e) mistake: the backward is right, its forward is not."""
    alike = [n for n in ("dq", "dk", "dv")
             if n == f.name or (n in f.verdicts and not f.verdicts[n].ok
                                and n in f.tensors and f.matches("base2-unscaled", 0, n))]
    return (f"{_and(alike)} {'matches' if len(alike) == 1 else 'match'} {WRONG_FORWARD}: P = exp(S - L) is "
            f"recomputed from the forward's L, and the forward's softmax uses exp2 on scores not multiplied by "
            f"log2(e) = 1.4427, so it computes softmax(S ln 2). Fold log2(e) into the forward's softmax scale: "
            f"the forward check of this case names the same mistake in o and L, and the backward comes right "
            f"with it.")


def _mixed_up_tensors(f: _Failure):
    name, tensors = f.name, f.tensors
    if len(f.case.batch) > 1 and f.matches("heads-flattened"):
        return (f"{name} matches attention over all heads at once: a (batch, heads, N, d) input was reshaped to "
                f"(batch, heads*N, d), so heads attend to each other. Flatten the leading dims instead: "
                f"reshape(-1, N, d).")
    if name in ("dq", "dk") and "dq" in tensors and "dk" in tensors and tensors["dq"].shape == tensors["dk"].shape:
        if _close(f.got, f.oracle["dk" if name == "dq" else "dq"].cpu()):
            return "dQ and dK are swapped."
    if f.got.abs().max().item() == 0 and f.want.abs().max().item() > 0:
        return (f"{name} is zero everywhere: nothing was written into it, or it was returned before it was "
                f"computed (an output allocated with zeros, filled later or never).")
    return None


def _constant_factor(f: _Failure):
    if (c := _proportional(f.got, f.want)) is None:
        return None
    name, d = f.name, f.d
    if abs(c / math.sqrt(d) - 1) < 0.02:
        return f"{name} is sqrt(d) = {math.sqrt(d):g} times the oracle: its 1/sqrt(d) scale is missing."
    if abs(c * math.sqrt(d) - 1) < 0.02:
        return f"{name} is 1/sqrt(d) = 1/{math.sqrt(d):g} of the oracle: the 1/sqrt(d) scale is applied twice."
    return f"{name} is {c:.4g} times the oracle everywhere: a constant factor is wrong."


def _wrong_delta(f: _Failure):
    verdicts = f.verdicts
    if not (f.name in ("dq", "dk") and all(n in verdicts for n in ("dq", "dk", "dv"))
            and not verdicts["dq"].ok and not verdicts["dk"].ok and verdicts["dv"].ok):
        return None
    # "One key tile" only on evidence: a dense backward has no tiles, and with a single key
    # tile a per-tile D is the whole row's.
    tiles = [t for t in (16, 32, 64, 128) if f.case.n_keys > t and f.matches(f"delta-per-tile-{t}")]
    if tiles:
        tile = min(tiles, key=lambda t: (f.got - f.mistaken(f"delta-per-tile-{t}")[f.name]).abs().max().item())
        return (f"dq and dk are wrong while dv is right: they match a D = rowsum(P * dP) taken over one key "
                f"tile of {tile} keys. D must be rowsum(dO * O) over the whole row (or rowsum(P * dP) "
                f"over all keys).")
    return ("dq and dk are wrong while dv is right, so the error is in dS = P * (dP - D): check that D is "
            "rowsum(dO * O) over the whole row and dP = dO V^T. D uses the forward's o: if o is wrong too, "
            "fix the forward first.")


def _accumulator_not_rescaled(f: _Failure):
    verdict = f.verdict
    if f.name == "o" and "L" in f.verdicts and f.verdicts["L"].ok and verdict.max_err > verdict.max_bound:
        return ("o is wrong while L is right: the row sums are right but the output accumulator is not. When the "
                "running max grows, rescale the accumulator by exp(m_old - m_new) as well as l.")
    return None


def _wrong_tiles(f: _Failure):
    name, case = f.name, f.case
    rows = _rows_view(f.err).amax(dim=(0, 2))
    tile = _good_then_bad(rows, f.verdict.max_bound) if name in ("o", "L", "dq") else None
    if tile is not None and case.is_causal and (f.matches(f"tile-local-{tile}-skip")
                                                or f.matches(f"tile-local-{tile}")):
        return (f"{name} matches a causal mask built from indices within each {tile} x {tile} tile: every tile "
                f"is masked as if it were on the diagonal. Compare global positions (tile start + index).")
    first = _tail_rows(rows, f.verdict.max_bound)
    if first is not None:
        axis = "key" if name in ("dk", "dv") else "query"
        return (f"{name} is wrong only for {axis} rows >= {first} of every batch: the last partial "
                f"{axis} tile is dropped or not masked.")
    if tile is not None:
        mask = (", and the causal mask of tiles below the diagonal (global positions, not indices within the "
                "tile)") if case.is_causal else ""
        return (f"{name} is right in the first {tile} query rows and wrong after them: check that the launch grid "
                f"reaches every query tile (swapped grid axes reach only a few){mask}.")
    return None


def _wrong_rows(f: _Failure) -> str:
    """Where no rule knows the mistake: how many rows are wrong, and the worst element."""
    name, verdict = f.name, f.verdict
    # Counted, not a percentage: 3 wrong rows of 4096 read "0%", as if nothing were wrong.
    per_row = _rows_view(f.err).amax(dim=2)  # every batch-head's rows
    wrong, total = int((per_row > verdict.max_bound).sum()), per_row.numel()
    if wrong == 0:  # failed on the mean error: small errors spread everywhere
        return (f"{name} is slightly wrong almost everywhere: its mean error {verdict.mean_err:.3g} exceeds "
                f"{verdict.mean_bound:.3g}, though no element exceeds the max bound.")
    axis = "key" if name in ("dk", "dv") else "query"
    return (f"{name} is wrong in {wrong} of its {total} {axis} rows, over all batch-heads (worst at index "
            f"{list(verdict.worst_index)}: oracle {verdict.oracle_at_worst:.4g}, got {verdict.actual_at_worst:.4g}).")


# Tried in this order, and the first rule that speaks is the sentence: a named mistake goes before
# a sentence that only says where the error is, and a rule may rely on the earlier ones not matching.
_RULES = (_not_finite, _lse_mistake, _causal_mistake, _padded_keys, _scale_mistake, _mixed_up_tensors,
          _constant_factor, _wrong_delta, _accumulator_not_rescaled, _wrong_tiles)


def _sentence(name, verdict, verdicts, got, err, tensors, oracle, case, mistaken) -> str:
    failure = _Failure(name, verdict, verdicts, got, err, tensors, oracle, case, mistaken)
    for rule in _RULES:
        if (sentence := rule(failure)) is not None:
            return sentence
    return _wrong_rows(failure)
