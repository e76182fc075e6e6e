"""DDP and sharded-optimizer checks, on 2 gloo ranks on the CPU.

The runner spawns the ranks (fa2_sandbox.runner.distributed_ops) and sends back what each one held: the
parameters and buffers right after wrapping, the gradients after the first step's
synchronisation, the final parameters, the optimizer state (elements, and how many parameters
have some) and a log of the collectives with the phase of the training step they were issued
in. This process trains the same models on the same batches in one process with plain torch
optimizers and judges.

The data-parallel argument: the loss is a mean over equal slices, so the average of the ranks'
gradients is the full-batch gradient, and a DDP run started from rank 0's weights must end
where one process trained on the whole batch ends. A sharded optimizer must end where the
unsharded optimizer ends, with every rank handling about 1/world_size of the parameters.

What the handout does not ask is advice, in checks of its own that no requirement's check
depends on: ddp::buffers (buffers broadcast too: the handout names the weights, and the models
of ddp::equivalence have buffers equal on every rank) and sharded_optimizer::state_balanced
(shards balanced by numel: the handout asks for about 1/world_size of the parameters, which
round-robin by count gives).

What a check reads beyond the official tests' interface (a wrapper's buffers, an optimizer's
.state) the ranks read under a guard: where the submission's structure has no such thing (a DDP
wrapper that is a plain class, a sharded optimizer that never calls Optimizer.__init__), only
the check that needs it says "could not be measured" (0 of 0), and equivalence is judged on the
parameters alone, as the official tests judge it.

One spawn per DDP flavour (all its models) and one for all the sharded scenarios, shared
between the checks (distributed_checks.distributed_call). Helpers the FSDP checks use too live
in grading/checks/distributed_checks.py, and the single-process baselines in grading/baselines.py.
"""

import pytest
import torch
import torch.nn.functional as F

from fa2_sandbox.wire import outcomes
from fa2_sandbox.wire.requests import data_seed, rank_model_seed
from fa2_sandbox.wire.training import DDP_FLAVOURS, build_model, make_batches
from grading.baselines import (
    DDP_BATCH,
    DDP_LR,
    DDP_STEPS,
    WORLD_SIZE,
    close,
    max_diff,
    names,
    one_thread,
    pick,
    train_single,
)
from grading.checks.distributed_checks import (
    distributed_call,
    judge_bucketing,
    judge_buffers,
    judge_state_balanced,
    judge_state_sharded,
    settle_scenario,
    state_unmeasured,
)
from grading.diagnoses.ddp import explain_ddp
from grading.tracks import DISTRIBUTED, Track

DDP_MODELS = ("toy", "tied")  # the official tests' models: ddp::equivalence and ddp::broadcast
BUFFERED_MODEL = "buffered"  # a buffer that differs per rank, for ddp::buffers only; run last in the same spawn
# ~2.6 KB: the toy model's 5 parameters land in 2 buckets, the tied model's 7 in 3, filled in either
# order and with a megabyte of 10**6 or 2**20 bytes alike, so a bucketed DDP that reduces each
# parameter alone is told from one that buckets (ddp::bucketing).
BUCKET_SIZE_MB = 0.0025
FLAVOURS = tuple(DDP_FLAVOURS)  # ddp (2026), individual and bucketed (2025)

SHARDED_MODEL = "uneven"  # numels 1024, 64, 2048, 32, 2048, 64, 256, 4: sharding by count is unbalanced
SHARDED_STEPS, SHARDED_BATCH = 10, 16
SHARDED_SCENARIOS = {
    "adamw": {"optimizer": "AdamW", "kwargs": {"lr": 1e-2, "weight_decay": 0.1}},
    "sgd-momentum": {"optimizer": "SGD", "kwargs": {"lr": 0.1, "momentum": 0.9}},
    "adamw-add-group": {"optimizer": "AdamW", "kwargs": {"lr": 1e-2, "weight_decay": 0.1},
                        "held_out": ["fc3.weight", "fc3.bias"], "add_after": 3},
}


# -- the runs ---------------------------------------------------------------------------------

def track(params: dict, per_kernel: bool) -> Track:
    """One runner for the distributed checks: its ranks are kept from one call to the next."""
    return DISTRIBUTED


def check_of(test: str, params: dict) -> tuple:
    """(part, check, tier) of a test of this module, known at collection (test_flash.check_of)."""
    if test.startswith("test_ddp_"):
        return "ddp", test.removeprefix("test_ddp_"), "default"
    return "sharded_optimizer", params.get("name") or test.removeprefix("test_sharded_"), "default"


pytestmark = pytest.mark.grading(check_of=check_of, track=track)

def ddp_run(session, submission, flavour):
    spec = {"flavour": flavour, "models": [*DDP_MODELS, BUFFERED_MODEL], "steps": DDP_STEPS, "batch": DDP_BATCH,
            "lr": DDP_LR, "bucket_size_mb": BUCKET_SIZE_MB}
    return distributed_call(session, submission, "ddp", spec, f"DDP {flavour}, {WORLD_SIZE} gloo ranks")


def sharded_run(session, submission):
    spec = {"model": SHARDED_MODEL, "steps": SHARDED_STEPS, "batch": SHARDED_BATCH,
            "scenarios": [{"name": name, **s} for name, s in SHARDED_SCENARIOS.items()]}
    return distributed_call(session, submission, "sharded", spec, f"sharded optimizer, {WORLD_SIZE} gloo ranks")


def flavours_defined(session, submission):
    defined = session.functions[submission.name]
    return [f for f in FLAVOURS if DDP_FLAVOURS[f][0] in defined]


def gate_flavour(c, session, submission, flavour, model=None):
    """Skip flavours the submission does not define; if it defines none, the 2026 flavour stands in
    and fails as not attempted (so every submission is graded out of the same points)."""
    defined = flavours_defined(session, submission)
    if flavour in defined:
        session.fail_if_stub(c, submission, DDP_FLAVOURS[flavour][0])
        return
    if defined or flavour != "ddp" or model not in (None, DDP_MODELS[0]):
        c.skip(f"{DDP_FLAVOURS[flavour][0]} is not defined in the adapters")
    wanted = [DDP_FLAVOURS[f][0] for f in FLAVOURS]
    c.fail(f"not attempted: {', '.join(wanted[:-1])} and {wanted[-1]} are all missing from {submission.adapters_file}.",
           outcome=outcomes.NOT_ATTEMPTED)


# -- DDP baselines ----------------------------------------------------------------------------

def ddp_labels(flavour):
    wrap, after, start = DDP_FLAVOURS[flavour]
    return {"wrap": wrap, "after_backward": after, "batch_start": start, "forward": "the forward",
            "backward": "loss.backward()", "step": "optimizer.step()", "setup": "setup"}


# -- DDP checks -------------------------------------------------------------------------------

@pytest.mark.parametrize("flavour,model_name", [(f, m) for f in FLAVOURS for m in DDP_MODELS],
                         ids=[f"{f}-{m}" for f in FLAVOURS for m in DDP_MODELS])
def test_ddp_equivalence(session, submission, check, flavour, model_name):
    """Every rank ends where single-process training on the full batch ends."""
    c = check(f"{flavour}-{model_name}")
    gate_flavour(c, session, submission, flavour, model_name)
    reply, tensors = ddp_run(session, submission, flavour)
    ranks = settle_scenario(c, reply, model_name, ddp_labels(flavour))
    expected = train_single(model_name, session.seed, data_seed("ddp", session.seed))
    finals = [pick(tensors, model_name, r, "final") for r in range(len(ranks))]
    if missing := [n for n in expected if n not in finals[0]]:
        c.fail(f"the wrapper does not expose the model's parameters {names(missing)} through named_parameters().")
    if all(close(final[n], expected[n]) for final in finals for n in expected):
        diff = max(max_diff(final, expected)[0] for final in finals)
        c.ok(f"all {len(ranks)} ranks match single-process training on the full batch after {DDP_STEPS} "
             f"steps (max difference {diff:.1e})")
        return
    sentence = explain_ddp(session, flavour, model_name, ranks, tensors)
    diffs = "; ".join(f"rank {r}: max difference {d:.2g} in {n}" for r, (d, n) in
                      enumerate(max_diff(final, expected) for final in finals))
    c.fail(sentence, f"final parameters against single-process training: {diffs}")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ddp_broadcast(session, submission, check, flavour):
    """Right after wrapping, every rank holds rank 0's initial parameters, frozen ones included."""
    c = check(flavour)
    gate_flavour(c, session, submission, flavour)
    reply, tensors = ddp_run(session, submission, flavour)
    c.settle_reply(reply)
    checked, unchecked = [], []
    for model_name in DDP_MODELS:
        ranks = reply.result["scenarios"].get(model_name)
        if not ranks or any(not pick(tensors, model_name, r, "initial") for r in range(len(ranks))):
            unchecked.append(model_name)  # failed before wrapping returned, or did not run
            continue
        checked.append(model_name)
        want = {n: p.detach() for n, p in build_model(model_name, session.seed).named_parameters()}
        for r in range(len(ranks)):
            own_params = dict(build_model(model_name, rank_model_seed(session.seed, r)).named_parameters())
            got = pick(tensors, model_name, r, "initial")
            bad = [n for n in want if not close(got[n], want[n])]
            if not bad:
                continue
            kept = [n for n in bad if close(got[n], own_params[n])]
            if r == 0:
                c.fail(f"rank 0's parameters {names(bad)} changed when wrapping: the broadcast must "
                       f"send rank 0's values (src=0).")
            if kept and len(kept) == len(want):
                c.fail(f"rank {r} kept its own initial weights ({model_name} model): parameters are not "
                       f"broadcast from rank 0 at construction.")
            if kept:
                frozen = [n for n in kept if not own_params[n].requires_grad]
                hint = ("frozen parameters (requires_grad=False) are used in forward and must be broadcast too"
                        if len(frozen) == len(kept) else "every parameter must be broadcast from rank 0")
                c.fail(f"rank {r} kept its own initial {names(kept)} ({model_name} model): {hint}.")
            c.fail(f"after wrapping, rank {r}'s {names(bad)} match neither rank 0's initial values nor "
                   f"its own ({model_name} model).")
    if not checked:
        settle_scenario(c, reply, DDP_MODELS[0], ddp_labels(flavour))
    note = (f"every rank holds rank 0's initial parameters, frozen ones included, after wrapping "
            f"({' and '.join(checked)} model)")
    c.ok(note + "".join(f"; the {m} model was not checked: its run stopped before wrapping returned"
                        for m in unchecked))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ddp_buffers(session, submission, check, flavour):
    """Beyond the handout (advice): buffers that differ across ranks at construction hold rank 0's
    values after wrapping (or, as torch's DDP does it, from the first forward on)."""
    c = check(flavour)
    gate_flavour(c, session, submission, flavour)
    reply, tensors = ddp_run(session, submission, flavour)
    c.settle_reply(reply)
    ranks = reply.result["scenarios"].get(BUFFERED_MODEL)
    if unread := next((f"rank {r}: {s['buffers_unread']}" for r, s in enumerate(ranks or [])
                       if s.get("buffers_unread")), None):
        c.not_measured(f"{unread}, so whether buffers are broadcast is not known (advice only).")
    if not ranks or any(not pick(tensors, BUFFERED_MODEL, r, "buffers") for r in range(len(ranks))):
        settle_scenario(c, reply, BUFFERED_MODEL, ddp_labels(flavour))  # failed before wrapping returned
        c.fail(f"the {BUFFERED_MODEL} model's buffers could not be read after wrapping.", outcome=outcomes.ERROR)
    sentence, note, evidence = judge_buffers(
        dict(build_model(BUFFERED_MODEL, session.seed).named_buffers()),
        [pick(tensors, BUFFERED_MODEL, r, "buffers") for r in range(len(ranks))],
        [pick(tensors, BUFFERED_MODEL, r, "buffers1") for r in range(len(ranks))],
        [dict(build_model(BUFFERED_MODEL, rank_model_seed(session.seed, r)).named_buffers())
         for r in range(len(ranks))])
    if sentence:
        c.fail(sentence, evidence)
    c.ok(f"{note} ({BUFFERED_MODEL} model)")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ddp_overlap(session, submission, check, flavour):
    """At least one gradient reduction is issued while loss.backward() is still running."""
    c = check(flavour)
    gate_flavour(c, session, submission, flavour)
    reply, _ = ddp_run(session, submission, flavour)
    ranks = settle_scenario(c, reply, DDP_MODELS[0], ddp_labels(flavour))
    after = DDP_FLAVOURS[flavour][1]
    counts = []
    for r, s in enumerate(ranks):
        reducing = [e for e in s["log"] if e["fn"] in ("all_reduce", "all_reduce_coalesced", "reduce",
                                                       "reduce_scatter", "reduce_scatter_tensor")
                    and e["step"] >= 0]
        during = [e for e in reducing if e["phase"] == "backward"]
        counts.append((len(during), len(reducing)))
        if not reducing:
            c.fail(f"rank {r} issued no all-reduce (or other reducing collective) through torch.distributed "
                   f"during training: gradients are not synchronized, or not in a way this check can see.")
        if not during:
            where = sorted({e["phase"] for e in reducing})
            c.fail("no all-reduce was issued before backward returned: communication does not overlap with "
                   "computation.", f"rank {r}: {len(reducing)} reducing collectives, issued in "
                   f"{', '.join(after if p == 'after_backward' else p for p in where)}")
    c.ok("; ".join(f"rank {r}: {d} of {n} reducing collectives issued during backward"
                   for r, (d, n) in enumerate(counts)))


REDUCING = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor")


def reducing_calls(log: list) -> list:
    """Per training step, the element counts of the reducing collectives issued in it."""
    steps = [[] for _ in range(DDP_STEPS)]
    for e in log:
        if e["fn"] in REDUCING and 0 <= e["step"] < DDP_STEPS:
            steps[e["step"]].append(e["numel"])
    return steps


def test_ddp_bucketing(session, submission, check):
    """The bucketed flavour reduces several parameters' gradients per collective where the bucket
    size allows it (the 2025 handout, ddp_overlap_bucketed: buckets of at most bucket_size_mb,
    'to reduce the total number of communication calls')."""
    c = check("bucketed")
    gate_flavour(c, session, submission, "bucketed")
    reply, _ = ddp_run(session, submission, "bucketed")
    model_name = DDP_MODELS[0]
    ranks = settle_scenario(c, reply, model_name, ddp_labels("bucketed"))
    calls = [reducing_calls(s["log"]) for s in ranks]
    if silent := [r for r, steps in enumerate(calls) if not any(steps)]:
        c.fail(f"rank {silent[0]} issued no all-reduce (or other reducing collective) through torch.distributed "
               f"during training: gradients are not synchronized, or not in a way this check can see.")
    sizes = [p.numel() * p.element_size() for p in build_model(model_name, session.seed).parameters()
             if p.requires_grad]
    sentence, evidence = judge_bucketing(sizes, BUCKET_SIZE_MB * 1024 ** 2, calls)
    if sentence:
        c.fail(sentence, f"{model_name} model: {evidence}")
    c.ok(f"{model_name} model: {evidence}")


# -- sharded optimizer ------------------------------------------------------------------------

def train_unsharded(session, scenario):
    """The scenario with the plain torch optimizer: (final parameters, optimizer)."""
    s = SHARDED_SCENARIOS[scenario]
    with one_thread():
        model = build_model(SHARDED_MODEL, session.seed)
        x, y = make_batches(SHARDED_MODEL, data_seed("sharded", session.seed), SHARDED_STEPS, SHARDED_BATCH)
        held = s.get("held_out", [])
        cls = getattr(torch.optim, s["optimizer"])
        optimizer = cls([p for n, p in model.named_parameters() if n not in held], **s["kwargs"])
        for step in range(SHARDED_STEPS):
            if held and step == s["add_after"]:
                optimizer.add_param_group({"params": [p for n, p in model.named_parameters() if n in held]})
            if held:
                model.zero_grad(set_to_none=True)
            else:
                optimizer.zero_grad()
            F.mse_loss(model(x[step]), y[step]).backward()
            optimizer.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}, optimizer


SHARDED_LABELS = {"construct": "get_sharded_optimizer", "add_param_group": "add_param_group",
                  "step": "the optimizer's step", "forward": "zero_grad or the forward",
                  "backward": "loss.backward()", "setup": "setup"}


def judge_sharded(c, session, submission, scenario):
    gate_sharded(c, session, submission)
    reply, tensors = sharded_run(session, submission)
    ranks = settle_scenario(c, reply, scenario, SHARDED_LABELS)
    expected, _ = train_unsharded(session, scenario)
    finals = [pick(tensors, scenario, r, "final") for r in range(len(ranks))]
    if all(close(final[n], expected[n]) for final in finals for n in expected):
        diff = max(max_diff(final, expected)[0] for final in finals)
        return f"all {len(ranks)} ranks match the unsharded torch.optim.{SHARDED_SCENARIOS[scenario]['optimizer']} " \
               f"after {SHARDED_STEPS} steps (max difference {diff:.1e})"
    start = {n: p.detach() for n, p in build_model(SHARDED_MODEL, session.seed).named_parameters()}
    diffs = "; ".join(f"rank {r}: max difference {d:.2g} in {n}" for r, (d, n) in
                      enumerate(max_diff(final, expected) for final in finals))
    for r in range(1, len(ranks)):
        if any(not torch.equal(finals[r][n], finals[0][n]) and not close(finals[r][n], finals[0][n]) for n in start):
            stale = {q: [n for n in start if close(finals[q][n], start[n])] for q in range(len(ranks))}
            q = max(stale, key=lambda q: len(stale[q]))
            detail = (f": rank {q} still holds the initial values of {names(stale[q])}" if stale[q] else "")
            c.fail(f"ranks disagree after step: updated parameters are not broadcast from their owners{detail}.", diffs)
    held = SHARDED_SCENARIOS[scenario].get("held_out", [])
    if held and all(close(finals[0][n], start[n]) for n in held):
        c.fail(f"the parameters added with add_param_group ({names(held)}) were never updated.", diffs)
    stale = [n for n in start if close(finals[0][n], start[n]) and not close(expected[n], start[n])]
    if stale:
        c.fail(f"{names(stale)} never changed on any rank: no rank updates them (are they assigned an owner?).", diffs)
    diff, name = max_diff(finals[0], expected)
    c.fail(f"the ranks agree but differ from the unsharded torch.optim.{SHARDED_SCENARIOS[scenario]['optimizer']} "
           f"(max difference {diff:.2g} in {name}): each parameter must get exactly the update the "
           f"unsharded optimizer gives it.", diffs)


def gate_sharded(c, session, submission):
    if "get_sharded_optimizer" not in session.functions[submission.name]:
        c.fail(f"not attempted: get_sharded_optimizer is missing from {submission.adapters_file}.",
               outcome=outcomes.NOT_ATTEMPTED)
    session.fail_if_stub(c, submission, "get_sharded_optimizer")


@pytest.mark.parametrize("scenario", ["adamw", "sgd-momentum"])
def test_sharded_equivalence(session, submission, check, scenario):
    """Every rank ends where the unsharded optimizer ends."""
    c = check(scenario)
    c.ok(judge_sharded(c, session, submission, scenario))


def test_sharded_add_param_group(session, submission, check):
    """A group added after 3 steps is trained like the unsharded optimizer trains it."""
    c = check("adamw")
    c.ok(judge_sharded(c, session, submission, "adamw-add-group"))


def state_split(session, ranks):
    """What the unsharded AdamW holds and what each rank holds: (parameters with state, their
    state elements, the largest parameter's elements, per rank: parameters, per rank: elements)."""
    _, full = train_unsharded(session, "adamw")
    per_param = [sum(v.numel() for v in s.values() if torch.is_tensor(v)) for s in full.state.values()]
    return (len(per_param), sum(per_param), max(per_param),
            [s.get("state_params", 0) for s in ranks], [s.get("state_numel", 0) for s in ranks])


@pytest.mark.parametrize("name", ["state_sharded", "state_balanced"])
def test_sharded_state(session, submission, check, name):
    """state_sharded (the handout: 'a subset of the parameters (approximately 1 / world_size)'):
    each rank's optimizer handles a non-empty part of the parameters, about 1/world_size of them
    by count or by size, so round-robin by count passes. state_balanced (advice, beyond the
    handout): each rank holds at most 1/world_size of the AdamW state plus the largest
    parameter's, i.e. shards balanced by size (numel), not by count."""
    c = check("adamw")
    gate_sharded(c, session, submission)
    reply, _ = sharded_run(session, submission)
    ranks = settle_scenario(c, reply, "adamw", SHARDED_LABELS)
    if unmeasured := state_unmeasured(ranks):
        c.not_measured(f"{unmeasured}. Equivalence is judged on the parameters alone.")
    judge = judge_state_sharded if name == "state_sharded" else judge_state_balanced
    sentence, evidence = judge(*state_split(session, ranks))
    if sentence:
        c.fail(sentence, evidence)
    c.ok(evidence)
