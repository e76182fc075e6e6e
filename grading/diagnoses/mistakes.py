"""Attention done wrong in ways students really do it, in float64: the diagnoses compare a wrong
tensor with these to name the mistake.

Each function takes the case's inputs (q, k, v, dO), on whatever device they are, and returns o,
L, dq, dk and dv like reference.oracle.attention_and_grads. Masks follow the oracle: True hides a key, hidden
scores are filled with -1e6.
"""
import math

import torch

from reference.oracle import MASK_FILL, attention_and_grads, scores


def masked_attention_and_grads(q, k, v, do, hidden: torch.Tensor) -> dict:
    """Attention and its gradients with an arbitrary (Nq, Nk) mask of hidden keys."""
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(hidden, MASK_FILL)
    o = torch.softmax(s, dim=-1) @ v
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.double())
    return {"o": o.detach(), "L": torch.logsumexp(s, dim=-1).detach(), "dq": dq, "dk": dk, "dv": dv}


def diagonal_masked(q, k, v, do) -> dict:
    """Causal with j >= i hidden (`>=` for `>`): a query does not see its own key. Row 0 sees
    nothing, so compare from row 1 on."""
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    return masked_attention_and_grads(q, k, v, do, j >= i)


def tile_local_mask(q, k, v, do, tile: int, skip_above: bool) -> dict:
    """Causal mask built from indices within a tile (i mod T, j mod T) with square T x T tiles;
    `skip_above`: tiles above the diagonal are skipped, as the course asks."""
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    hidden = (j % tile) > (i % tile)
    if skip_above:
        hidden |= (j // tile) > (i // tile)
    return masked_attention_and_grads(q, k, v, do, hidden)


def backward_unmasked(q, k, v, do, tile: int | None = None) -> dict:
    """A causal forward, then a backward that recomputes P = exp(S - L) without the mask: over
    all keys, or (`tile`) over the keys of the T x T tiles it visits, i.e. unmasked inside the
    diagonal tiles only."""
    right = attention_and_grads(q, k, v, do, True)
    q, k, v, do = (t.double() for t in (q, k, v, do))
    scale = 1 / math.sqrt(q.shape[-1])
    p = torch.exp(q @ k.transpose(-1, -2) * scale - right["L"][..., None])  # P > 0 above the diagonal
    if tile is not None:
        i = torch.arange(q.shape[-2], device=q.device)[:, None]
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        p = p.masked_fill((j // tile) > (i // tile), 0.0)  # tiles above the diagonal are skipped
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (do * right["o"]).sum(-1, keepdim=True))
    return {**right, "dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale, "dv": p.transpose(-1, -2) @ do}


def delta_per_tile(q, k, v, do, is_causal: bool, tile: int) -> dict:
    """The right forward, then a backward whose D is rowsum(P * dP) over the keys of the current
    key tile of `tile` keys only, not over the whole row (dS_ij = P_ij (dP_ij - D_i of j's tile))."""
    right = attention_and_grads(q, k, v, do, is_causal)
    q, k, v, do = (t.double() for t in (q, k, v, do))
    scale = 1 / math.sqrt(q.shape[-1])
    p = torch.exp(scores(q, k, is_causal) - right["L"][..., None])
    dp = do @ v.transpose(-1, -2)
    key_tile = torch.arange(k.shape[-2], device=q.device) // tile
    per_tile = torch.zeros(*p.shape[:-1], int(key_tile[-1]) + 1, dtype=p.dtype, device=p.device)
    per_tile.index_add_(-1, key_tile, p * dp)
    ds = p * (dp - per_tile[..., key_tile])
    return {**right, "dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale}


def padded_keys(q, k, v, do, tile: int) -> dict:
    """Non-causal attention over keys zero-padded up to a multiple of `tile`: a kernel whose last
    key tile reads zeros past N_k (boundary_check padding) and never masks them, so every padded
    key adds exp(0 - m) to the row sum."""
    n_keys = k.shape[-2]
    pad = -n_keys % tile
    zeros = k.new_zeros((*k.shape[:-2], pad, k.shape[-1]))
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    kp, vp = torch.cat([k, zeros.double()], dim=-2), torch.cat([v, zeros.double()], dim=-2)
    s = q @ kp.transpose(-1, -2) / math.sqrt(q.shape[-1])
    o = torch.softmax(s, dim=-1) @ vp
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.double())
    return {"o": o.detach(), "L": torch.logsumexp(s, dim=-1).detach(), "dq": dq, "dk": dk, "dv": dv}


def heads_flattened(q, k, v, do, is_causal: bool) -> dict:
    """4-D (B, H, N, d) inputs reshaped to (B, H*N, d): the heads become one long sequence."""
    flat = [t.reshape(t.shape[0], -1, t.shape[-1]) for t in (q, k, v, do)]
    result = attention_and_grads(*flat, is_causal)
    shapes = {"o": q.shape, "L": q.shape[:-1], "dq": q.shape, "dk": k.shape, "dv": v.shape}
    return {name: result[name].reshape(shape) for name, shape in shapes.items()}


def lse_without_max(q, k, v, do, is_causal: bool) -> dict:
    """L = log(l) with l = sum exp(s - m): the running max m left out of L = m + log(l)."""
    right = attention_and_grads(q, k, v, do, is_causal)
    return {**right, "L": right["L"] - scores(q.double(), k.double(), is_causal).amax(dim=-1)}


def with_scale(q, k, v, do, is_causal: bool, scale: float) -> dict:
    """Scores q.k * scale instead of q.k / sqrt(d)."""
    factor = scale * math.sqrt(q.shape[-1])  # the oracle on q * factor: its dq is per unit of q * factor
    result = attention_and_grads(q * factor, k, v, do, is_causal)
    return {**result, "dq": result["dq"] * factor}


def base2_unscaled(q, k, v, do, is_causal: bool) -> dict:
    """A forward that takes exp2 of the scores without first multiplying them by log2(e): since
    2^s = e^(s ln 2), it computes softmax(S ln 2), attention scaled by ln 2 / sqrt(d) instead of
    1 / sqrt(d). Its L is that attention's natural-log LSE, (m + log2 l) * ln 2 as such kernels
    convert it back (one that stores m + log2 l leaves it in base 2: base2_unscaled_log2).

    Then a right backward on that o and L, as the handout writes it (the PyTorch backward most
    students pair with a Triton forward): P = exp(S - L), D = rowsum(dO * O). P's rows no longer
    sum to 1, so dq, dk and dv are wrong although the backward is not."""
    scale = 1 / math.sqrt(q.shape[-1])
    forward = with_scale(q, k, v, do, is_causal, math.log(2) * scale)
    q, k, v, do = (t.double() for t in (q, k, v, do))
    p = torch.exp(scores(q, k, is_causal) - forward["L"][..., None])
    ds = p * (do @ v.transpose(-1, -2) - (do * forward["o"]).sum(-1, keepdim=True))
    return {"o": forward["o"], "L": forward["L"], "dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale,
            "dv": p.transpose(-1, -2) @ do}


def base2_unscaled_log2(q, k, v, do, is_causal: bool) -> dict:
    """base2_unscaled with L left in base 2 (m + log2 l, never multiplied by ln 2). Only its L is
    meant to be compared: its gradients are base2_unscaled's, from a natural-log L."""
    result = base2_unscaled(q, k, v, do, is_causal)
    return {**result, "L": result["L"] / math.log(2)}


def oracle_of(mistake: str, inputs: tuple, case) -> dict:
    """The tensors of `mistake` ('non-causal', 'unscaled', 'scale-1/8', 'base2-unscaled', 'base2-unscaled-log2',
    'lse-without-max', 'diagonal-masked', 'backward-unmasked', 'backward-unmasked-T', 'delta-per-tile-T',
    'heads-flattened', 'padded-keys-T', 'tile-local-T' or 'tile-local-T-skip', with T a tile size)."""
    return {name: t.cpu() for name, t in _compute(mistake, *inputs, case).items()}


def _compute(mistake, q, k, v, do, case) -> dict:
    if mistake == "non-causal":
        return attention_and_grads(q, k, v, do, False)
    if mistake == "unscaled":
        return with_scale(q, k, v, do, case.is_causal, 1.0)
    if mistake == "scale-1/8":  # the course's d = 64 hard-coded
        return with_scale(q, k, v, do, case.is_causal, 1 / 8)
    if mistake == "base2-unscaled":  # exp2 without log2(e)
        return base2_unscaled(q, k, v, do, case.is_causal)
    if mistake == "base2-unscaled-log2":
        return base2_unscaled_log2(q, k, v, do, case.is_causal)
    if mistake == "lse-without-max":
        return lse_without_max(q, k, v, do, case.is_causal)
    if mistake == "diagonal-masked":
        return diagonal_masked(q, k, v, do)
    if mistake.startswith("backward-unmasked"):
        tile = mistake.rsplit("-", 1)[1]
        return backward_unmasked(q, k, v, do, int(tile) if tile.isdigit() else None)
    if mistake.startswith("delta-per-tile-"):
        return delta_per_tile(q, k, v, do, case.is_causal, int(mistake.rsplit("-", 1)[1]))
    if mistake == "heads-flattened":
        return heads_flattened(q, k, v, do, case.is_causal)
    if mistake.startswith("padded-keys-"):
        return padded_keys(q, k, v, do, int(mistake.rsplit("-", 1)[1]))
    if mistake.startswith("tile-local-"):
        tile = int(mistake.split("-")[2])
        return tile_local_mask(q, k, v, do, tile, mistake.endswith("-skip"))
    raise ValueError(f"unknown mistake {mistake!r}")

