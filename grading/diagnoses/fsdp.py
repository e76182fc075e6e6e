"""Why an FSDP wrapper's gathered parameters differ from single-process training: one sentence,
from what the ranks held after the first step and at the end (grading/checks/test_fsdp.py asks)."""
import torch

from grading.baselines import (
    ATOL,
    FSDP_BATCH,
    FSDP_LR,
    FSDP_STEPS,
    PRECISIONS,
    RTOL,
    WORLD_SIZE,
    by_original_name,
    close,
    fsdp_first_step_grads,
    initial_params,
    max_diff,
    names,
    pick,
)


def explain(session, precision, ranks, tensors):
    """A sentence for why the gathered parameters differ from the baseline, or None."""
    dtype = PRECISIONS[precision]
    init = initial_params(session)
    afters = [by_original_name(pick(tensors, precision, r, "after1"), init) for r in range(len(ranks))]
    finals = [by_original_name(pick(tensors, precision, r, "final"), init) for r in range(len(ranks))]
    if dtype and any(set(s.get("param_dtypes", ())) & {"float16", "bfloat16"} for s in ranks):
        return ("the parameters the optimizer sees are not float32: keep the master weights (the shards) in "
                "float32 and cast only the gathered copies to compute_dtype.")
    if low := sorted({str(t.dtype).split(".")[-1] for f in finals for t in f.values() if t.dtype != torch.float32}):
        return (f"fsdp_gather_full_params returned {', '.join(low)} tensors: it should return the float32 "
                f"master weights, not their compute_dtype copies.")
    for r in range(len(ranks)):
        initial = by_original_name(pick(tensors, precision, r, "initial"), init)
        if len(initial) == len(init) and any(not close(initial[n], init[n]) for n in init):
            diff, n = max_diff(initial, init)
            return (f"right after get_fsdp, rank {r}'s fsdp_gather_full_params is not the model's initial parameters "
                    f"(max difference {diff:.2g} in {n}): the shards are cut or put back together wrongly (the "
                    f"full tensor is the shards in rank order, padding dropped, reshaped).")
    if all(close(final[n], init[n]) for final in finals for n in init):
        return ("the parameters never changed: optimizer.step() updated nothing (is the optimizer's "
                "parameters() the shards, and do the shards hold .grad after fsdp_on_after_backward?).")

    # The first step: SGD without momentum, so (p0 - p1) / lr is the gradient that was applied.
    if any(len(after) < len(init) for after in afters):
        return None
    full = fsdp_first_step_grads(session, dtype)
    per_rank = FSDP_BATCH // WORLD_SIZE
    local = [fsdp_first_step_grads(session, dtype, slice(r * per_rank, (r + 1) * per_rank)) for r in range(WORLD_SIZE)]
    # (p0 - p1) / lr carries float32's rounding of the parameters, over lr (2e-4 at lr 0.01 here)
    rounding = 4 * torch.finfo(torch.float32).eps * max(p.abs().max().item() for p in init.values()) / FSDP_LR
    atol, rtol = (1e-4 + rounding, 2e-2) if dtype else (ATOL + rounding, RTOL)  # fp16: only multiples and swaps

    def near(a, b):
        return bool(((a.double() - b.double()).abs() <= atol + rtol * b.double().abs()).all())

    def kind(got, n):
        for k in (1, WORLD_SIZE, 1 / WORLD_SIZE):
            if near(got, k * full[n]):
                return k
        # Each element is some rank's own-slice gradient (a shard updated with its rank's local
        # gradient, say): nothing was reduced across ranks.
        excess = torch.stack([(got.double() - l[n].double()).abs() - (atol + rtol * l[n].double().abs())
                              for l in local])
        return "local" if bool((excess.min(0).values <= 0).all()) else None

    for r, after in enumerate(afters):
        kinds = {n: kind((init[n] - after[n]) / FSDP_LR, n) for n in init}
        wrong = [n for n, k in kinds.items() if k != 1]
        if not wrong:
            continue
        if all(kinds[n] == "local" for n in wrong) and len(wrong) == len(kinds):
            return ("gradients are not reduced across ranks: in the first step each rank applied the gradient of "
                    "its own slice of the batch, not the average over all ranks.")
        if all(k == WORLD_SIZE for k in kinds.values()):
            return ("the parameters move by world_size times the expected update: gradients are summed over "
                    "ranks, not averaged (divide the reduced sum by the world size).")
        if all(k == 1 / WORLD_SIZE for k in kinds.values()):
            return (f"the first step's gradients are 1/{WORLD_SIZE} of the full-batch average: divided by the "
                    f"world size twice.")
        if len(wrong) == len(kinds) and None in kinds.values():
            return (f"in the first step, rank {r} applied to no parameter the full-batch average gradient (read off "
                    f"the parameters gathered after it): check the reduction, and how shards map to the full tensor.")
        how = {kinds[n] for n in wrong}
        what = ("the gradient of its own slice of the batch only (not reduced across ranks)" if how == {"local"}
                else f"{how.pop():g}x the full-batch average gradient" if len(how) == 1 and None not in how
                else "a gradient other than the full-batch average")
        hint = (": biases, and any parameter kept whole on every rank, need their gradients averaged too"
                if all(n.endswith("bias") for n in wrong) else "")
        others = "; the others were right" if len(wrong) < len(kinds) else ""
        return f"in the first step, rank {r} applied to {names(wrong)} {what}{others}{hint}."

    for r in range(1, len(ranks)):
        if any(not close(finals[r][n], finals[0][n]) for n in init):
            diff, n = max_diff(finals[r], finals[0])
            return (f"the first step is right, but after {FSDP_STEPS} steps the ranks' gathered parameters disagree "
                    f"(rank {r} differs from rank 0 by {diff:.2g} in {n}).")
    return (f"the first step is right but the parameters after {FSDP_STEPS} steps are not: gradients of later "
            f"steps are not reduced the same way (are pending reductions and .grad reset each step?).")
