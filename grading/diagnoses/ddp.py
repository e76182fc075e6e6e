"""Why a DDP wrapper's ranks did not end where single-process training ends: one sentence, from
what the ranks held at each step (grading/checks/test_distributed.py asks)."""
from fa2_sandbox.wire import requests
from fa2_sandbox.wire.training import DDP_FLAVOURS, build_model
from grading.baselines import (
    DDP_BATCH,
    DDP_LR,
    DDP_STEPS,
    WORLD_SIZE,
    close,
    ddp_first_step_grads,
    max_diff,
    names,
    pick,
    train_single,
)


def shared_parameters(model) -> set:
    """Names (as named_parameters() gives them) of parameters used by more than one module."""
    uses = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        uses.setdefault(id(p), []).append(n)
    first = {id(p): n for n, p in model.named_parameters()}
    return {first[i] for i, ns in uses.items() if len(ns) > 1}


def grad_factor(got, want):
    """k such that got is k times want, for the multiples a broken reduction produces."""
    if not want.abs().max() > 0:
        return 1 if close(got, want) else None
    for k in (1, WORLD_SIZE, 1 / WORLD_SIZE, WORLD_SIZE ** 2):
        if close(got, k * want):
            return k
    return None


def rows_of(rank):
    local = DDP_BATCH // WORLD_SIZE
    return slice(rank * local, (rank + 1) * local)


def explain_ddp(session, flavour, model_name, ranks, tensors):
    """A sentence for why the ranks did not end where single-process training ends."""
    seed, data_seed = session.seed, requests.data_seed("ddp", session.seed)
    after = DDP_FLAVOURS[flavour][1]
    start = {n: p.detach() for n, p in build_model(model_name, seed).named_parameters()}
    start_buffers = dict(build_model(model_name, seed).named_buffers())
    for r in range(1, len(ranks)):
        initial = pick(tensors, model_name, r, "initial")
        buffers = pick(tensors, model_name, r, "buffers")
        if any(not close(initial[n], start[n]) for n in start):
            return (f"rank {r} did not start from rank 0's parameters (see ddp::broadcast), "
                    f"so the ranks trained different models.")
        if changed := [n for n, b in start_buffers.items() if n in buffers and not close(buffers[n], b)]:
            return (f"after wrapping, rank {r}'s buffer {names(changed)} differs from rank 0's although it is "
                    f"the same on every rank at construction: the wrapper changed it.")

    full = ddp_first_step_grads(model_name, seed, data_seed)
    shared = shared_parameters(build_model(model_name, seed))
    for r in range(len(ranks)):
        grads = pick(tensors, model_name, r, "grads0")
        if missing := [n for n in full if n not in grads]:
            return f"after {after} on the first step, rank {r} has no gradient for {names(missing)}."
        local = ddp_first_step_grads(model_name, seed, data_seed, rows_of(r))
        if all(close(grads[n], local[n]) for n in full) and not all(close(local[n], full[n]) for n in full):
            return (f"gradients are not all-reduced: after {after}, rank {r} holds the gradient of its own "
                    f"slice of the batch, so each rank takes a different step.")
        factors = {n: grad_factor(grads[n], full[n]) for n in full}
        if all(k == WORLD_SIZE for k in factors.values()):
            return (f"parameters differ from single-process training by {WORLD_SIZE}x the expected update: "
                    f"gradients are summed, not averaged (divide the all-reduced sum by the world size).")
        if all(k == 1 / WORLD_SIZE for k in factors.values()):
            return (f"the synchronized gradients are 1/{WORLD_SIZE} of the full-batch average: "
                    f"they are divided by the world size twice.")
        wrong = [n for n, k in factors.items() if k != 1]
        if wrong:
            how = {k for k in (factors[n] for n in wrong)}
            what = (f"{how.pop():g}x the full-batch average" if len(how) == 1 and None not in how
                    else "not the full-batch average")
            tied = [n for n in wrong if n in shared]
            hint = (": a parameter shared by two modules must be reduced once" if tied and set(wrong) <= shared
                    else "")
            others = "; the others are right" if len(wrong) < len(factors) else ""
            return (f"after {after} on the first step, the gradient of {names(wrong)} on rank {r} is "
                    f"{what}{others}{hint}.")

    finals = [pick(tensors, model_name, r, "final") for r in range(len(ranks))]
    frozen = [n for n, p in build_model(model_name, seed).named_parameters() if not p.requires_grad]
    if changed := [n for n in frozen if not close(finals[0][n], start[n])]:
        return f"the frozen parameter {names(changed)} (requires_grad=False) changed during training."
    for r in range(1, len(ranks)):
        if any(not close(finals[r][n], finals[0][n]) for n in start):
            diff, name = max_diff(finals[r], finals[0])
            return (f"rank {r} ends with parameters different from rank 0's (max difference {diff:.2g} in "
                    f"{name}) although the first step's gradients were right.")
    summed = train_single(model_name, seed, data_seed, lr=DDP_LR * WORLD_SIZE)
    if all(close(finals[0][n], summed[n]) for n in summed):
        return (f"parameters differ from single-process training by {WORLD_SIZE}x the expected update: "
                f"gradients are summed, not averaged.")
    expected = train_single(model_name, seed, data_seed)
    diff, name = max_diff(finals[0], expected)
    return (f"the first step's gradients are right but the parameters after {DDP_STEPS} steps differ from "
            f"single-process training (max difference {diff:.2g} in {name}): gradients of later steps are "
            f"not synchronized the same way (is per-step state reset?).")
