"""FSDP checks (the 2026 edition's get_fsdp), on 2 gloo ranks on the CPU.

The runner spawns the ranks (fa2_sandbox.runner.distributed_ops.fsdp_rank). Every rank builds the
official FSDP tests' model (token ids -> Embedding -> RMSNorm -> Linear -> ReLU -> RMSNorm -> Linear
-> lm_head) from the submission's cs336_basics.model classes, as the official tests do: the
handout's FSDP wraps "any Linear or Embedding layer" of the course's model, and students find those
by their cs336_basics classes (a model of torch.nn.Linear layers left such an FSDP sharding nothing).
It wraps it with get_fsdp (compute_dtype None, then float16), trains it for a few SGD steps on
the cross-entropy of the last position's logits (the official tests' loss) over the wrapper's
parameters(), on its slice of each global batch, and returns fsdp_gather_full_params right after
wrapping, after the first step and at the end, plus the size and dtypes of parameters(). This
process trains the same model (fa2_sandbox/wire/toy_models.py's twin of the course's layers,
with the same weights) on the full batches and judges.

fp32: the data-parallel argument of test_distributed.py, so DDP's tolerance (distributed_checks: atol 1e-5).

fp16 compute: the baseline is single-process training with the same casting (each Linear's and
the Embedding's weight cast to float16 as the official tests' hooks do; the activations follow,
since the model starts from an Embedding; the loss in float32, fp32 master weights and SGD). The
order of float16 roundings still differs (each rank's half-batch gradient is rounded on its
own, the reduction may run in fp16 or fp32), so the rule scales with how much float16 moves the
result at all: with gap = max |fp32 baseline - fp16 baseline| over the parameters,
    max |gathered - fp16 baseline| <= FP16_FACTOR * gap + FP16_ATOL.
With the official tests' training (3 SGD steps at lr 0.01, 20 sequences), over eight seeds the
reference sits at 5.5e-7 to 1.2e-6 from the fp16 baseline (0.004 to 0.95 gap) and iddahmlauzi's
corpus FSDP at 3.1e-7 or less, while the gap ranges from 8.3e-7 to 1.4e-4: the bound is never
under FP16_ATOL, 16x the worst of them. (At lr 0.1 and 5 steps, the old MLP's setting, one seed of
eight put the reference at 170 gap: float16 roundings carried through ReLUs and the softmax.) An
FSDP that ignores compute_dtype lands within the rule too, so it is caught separately: the layers
it runs return float32 (the ranks record each Linear's and the Embedding's output dtype), or,
where its layers' own forward never runs, its parameters match float32 training to FP32_MATCH
while float16 moves them by more than that.

Without get_fsdp in the adapters (the 2025 template) the checks are skipped and carry no points.
"""
import pytest
import torch
import torch.nn.functional as F

from fa2_sandbox.wire.training import build_model, make_batches, training_loss
from grading.checks.distributed_checks import (
    ATOL,
    RTOL,
    WORLD_SIZE,
    close,
    distributed_call,
    max_diff,
    names,
    one_thread,
    pick,
    settle_scenario,
)
from grading.shards import DISTRIBUTED

FSDP_MODEL = "course"
FSDP_STEPS, FSDP_BATCH, FSDP_LR = 3, 20, 0.01  # the official test_fsdp.py's steps, batch and SGD rate
PRECISIONS = {"fp32": None, "fp16": "float16"}
FP16_FACTOR, FP16_ATOL = 3.0, 2e-5
FP32_MATCH = 2e-6  # closer than this to fp32 training: float16 was never used
NUMEL_SLACK = 16
SHARDED_LAYERS = (torch.nn.Linear, torch.nn.Embedding)
TEMPLATE_2025 = "this submission follows the 2025 template, which has no FSDP"
LABELS = {"wrap": "get_fsdp", "forward": "the wrapper's forward", "backward": "loss.backward()",
          "after_backward": "fsdp_on_after_backward", "step": "optimizer.step()",
          "gather": "fsdp_gather_full_params", "setup": "setup"}


def shard(params: dict, per_kernel: bool) -> str:
    """One runner for the distributed checks: its ranks are kept from one call to the next."""
    return DISTRIBUTED


def fsdp_run(grading, submission):
    spec = {"model": FSDP_MODEL, "model_seed": grading.seed, "data_seed": grading.seed + 3,
            "steps": FSDP_STEPS, "batch": FSDP_BATCH, "lr": FSDP_LR,
            "scenarios": [{"name": name, "compute_dtype": dtype} for name, dtype in PRECISIONS.items()]}
    return distributed_call(grading, submission, "fsdp", spec, f"FSDP, {WORLD_SIZE} gloo ranks")


def gate_fsdp(c, grading, submission):
    if "get_fsdp" not in grading.functions[submission.name]:
        c.skip(TEMPLATE_2025)
    grading.fail_if_stub(c, submission, "get_fsdp")


# -- baselines --------------------------------------------------------------------------------

def cast_compute(model, dtype):
    """Make each Linear/Embedding compute with its weight cast to `dtype` from the fp32 parameter
    (autograd casts the gradient back), as the official tests' _apply_mixed_precision_hooks do."""
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.forward = lambda x, m=layer: F.linear(x, m.weight.to(dtype))
        elif isinstance(layer, torch.nn.Embedding):
            layer.forward = lambda x, m=layer: F.embedding(x, m.weight.to(dtype), m.padding_idx)


def train_baseline(grading, dtype=None, lr=FSDP_LR, steps=FSDP_STEPS, rows=slice(None)):
    """Single-process SGD on rows of each global batch, computing in `dtype` (None: fp32)."""
    with one_thread():
        model = build_model(FSDP_MODEL, grading.seed)
        if dtype is not None:
            cast_compute(model, getattr(torch, dtype))
        x, y = make_batches(FSDP_MODEL, grading.seed + 3, FSDP_STEPS, FSDP_BATCH)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            optimizer.zero_grad()
            training_loss(FSDP_MODEL, model(x[step, rows]), y[step, rows]).backward()
            optimizer.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def initial_params(grading):
    return {n: p.detach().clone() for n, p in build_model(FSDP_MODEL, grading.seed).named_parameters()}


# -- reading what the ranks returned ----------------------------------------------------------

def by_original_name(got: dict, want: dict) -> dict:
    """got renamed to want's names: exact, or a unique key ending in ".<name>" (a wrapper prefix)."""
    out = {}
    for n in want:
        if n in got:
            out[n] = got[n]
        elif len(found := [k for k in got if k.endswith("." + n)]) == 1:
            out[n] = got[found[0]]
    return out


def gathered(c, ranks, tensors, precision, kind, want):
    """Per rank, {name: tensor} from fsdp_gather_full_params; fails the check if unusable."""
    out = []
    for r, s in enumerate(ranks):
        raw = pick(tensors, precision, r, kind)
        if s.get("not_tensors"):
            c.fail(f"fsdp_gather_full_params returned non-tensor values for {names(s['not_tensors'])}.")
        got = by_original_name(raw, want)
        if missing := [n for n in want if n not in got]:
            c.fail(f"fsdp_gather_full_params does not return {names(missing)}: it must map the original "
                   f"module's parameter names to full tensors.",
                   f"rank {r} returned: {names(sorted(raw)) or 'nothing'}")
        if wrong := [n for n in want if got[n].shape != want[n].shape]:
            n = wrong[0]
            c.fail(f"fsdp_gather_full_params returned {n} with shape {tuple(got[n].shape)}, not "
                   f"{tuple(want[n].shape)}: the full parameter is the unpadded shards, concatenated in "
                   f"rank order and reshaped.")
        out.append(got)
    return out


def layers_text(ranks) -> str:
    """Where the ranks' model took its layers from (the submission's cs336_basics, or why not)."""
    return f"; the model was built from {ranks[0]['layers']}" if ranks and ranks[0].get("layers") else ""


def diffs_text(finals, want) -> str:
    return "; ".join(f"rank {r}: max difference {d:.2g} in {n}" for r, (d, n) in
                     enumerate(max_diff(final, want) for final in finals))


# -- diagnoses --------------------------------------------------------------------------------

def first_step_grads(grading, dtype, rows=slice(None)):
    """The gradient SGD used in the first step, read off the parameters: (p0 - p1) / lr."""
    init, after = initial_params(grading), train_baseline(grading, dtype, steps=1, rows=rows)
    return {n: (init[n] - after[n]) / FSDP_LR for n in init}


def explain(grading, precision, ranks, tensors):
    """A sentence for why the gathered parameters differ from the baseline, or None."""
    dtype = PRECISIONS[precision]
    init = initial_params(grading)
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
    full = first_step_grads(grading, dtype)
    local = [first_step_grads(grading, dtype, slice(r * FSDP_BATCH // WORLD_SIZE, (r + 1) * FSDP_BATCH // WORLD_SIZE))
             for r in range(WORLD_SIZE)]
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


# -- checks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_fsdp_equivalence(grading, submission, check, precision):
    """The gathered parameters after training match single-process training on the full batch."""
    c = check("fsdp", "equivalence", precision)
    gate_fsdp(c, grading, submission)
    reply, tensors = fsdp_run(grading, submission)
    ranks = settle_scenario(c, reply, precision, LABELS)
    dtype = PRECISIONS[precision]
    expected = train_baseline(grading, dtype)
    finals = gathered(c, ranks, tensors, precision, "final", expected)
    diffs = diffs_text(finals, expected) + layers_text(ranks)
    worst = max(max_diff(final, expected)[0] for final in finals)
    if dtype is None:
        if all(close(final[n], expected[n]) for final in finals for n in expected):
            c.ok(f"all {len(ranks)} ranks gather the parameters of single-process training on the full batch "
                 f"after {FSDP_STEPS} steps (max difference {worst:.1e}){layers_text(ranks)}")
            return
        c.fail(explain(grading, precision, ranks, tensors) or
               f"the gathered parameters differ from single-process training (max difference {worst:.2g}).", diffs)

    fp32 = train_baseline(grading)
    gap = max_diff(fp32, expected)[0]
    bound = FP16_FACTOR * gap + FP16_ATOL
    rule = (f"max difference from fp16-compute training {worst:.2g}, allowed {FP16_FACTOR:g} x {gap:.2g} "
            f"(fp32 vs fp16-compute training) + {FP16_ATOL:g} = {bound:.2g}")
    layer_dtypes = sorted({d for s in ranks for d in s.get("layer_dtypes", ())})
    seen = f"; the Linear and Embedding layers produced {', '.join(layer_dtypes)} outputs" if layer_dtypes else ""
    seen += layers_text(ranks)
    if worst <= bound:
        from_fp32 = max(max_diff(final, fp32)[0] for final in finals)
        # Two signs that nothing computed in float16: every layer that ran returned float32 (seen
        # when the FSDP still calls the layers' forward), or the parameters are float32 training's
        # (when float16 moves them measurably at all: with the official tests' SGD rate the gap
        # can be under FP32_MATCH).
        layers_ignored_it = bool(layer_dtypes) and dtype not in layer_dtypes
        if layers_ignored_it or from_fp32 <= FP32_MATCH < gap:
            c.fail(f"compute_dtype={dtype} had no effect: "
                   + (f"the layers computed in {', '.join(layer_dtypes)}" if layers_ignored_it
                      else f"the parameters match training entirely in float32 (max difference {from_fp32:.1e})")
                   + "; cast the gathered weights to it, as the handout says, 'before communicating or using them "
                     "for compute'.", rule + seen)
        c.ok(f"all {len(ranks)} ranks within the fp16 rule after {FSDP_STEPS} steps: {rule}{seen}")
        return
    c.fail(explain(grading, precision, ranks, tensors) or
           f"the gathered parameters differ from fp16-compute training by more than float16 rounding explains "
           f"({worst:.2g}, allowed {bound:.2g}).", rule + seen + "\n" + diffs)


def test_fsdp_sharded(grading, submission, check):
    """Each rank's parameters() hold about 1/world_size of the Linear layers' elements."""
    c = check("fsdp", "sharded", "fp32")
    gate_fsdp(c, grading, submission)
    reply, _ = fsdp_run(grading, submission)
    c.settle_reply(reply)
    ranks = reply.result["scenarios"].get("fp32")
    if not ranks or any("numel" not in s for s in ranks):  # failed before get_fsdp returned
        settle_scenario(c, reply, "fp32", LABELS)
    model = build_model(FSDP_MODEL, grading.seed)
    weights = [layer.weight for layer in model.modules() if isinstance(layer, SHARDED_LAYERS)]
    total = sum(p.numel() for p in model.parameters())
    sharded = sum(p.numel() for p in weights)
    tensors = len(list(model.parameters()))
    # The weights must be split; biases and other small parameters may stay whole on every rank.
    bound = sharded // WORLD_SIZE + (total - sharded) + (WORLD_SIZE - 1) * tensors + NUMEL_SLACK
    held = [s["numel"] for s in ranks]
    evidence = (f"elements in the wrapper's parameters() per rank: {held}; the model has {total} ({sharded} in "
                f"Linear/Embedding weights); allowed per rank {bound}{layers_text(ranks)}")
    if all(h >= total for h in held):
        c.fail(f"every rank's parameters() hold the whole model ({held[0]} elements of {total}): the parameters "
               f"are not sharded, so neither is the optimizer.", evidence)
    if over := [r for r, h in enumerate(held) if h > bound]:
        r = over[0]
        c.fail(f"rank {r}'s parameters() hold {held[r]} of the model's {total} elements, more than the {bound} "
               f"allowed (1/{WORLD_SIZE} of the Linear weights, plus every other parameter whole).", evidence)
    if sum(held) < total:
        c.fail(f"together the ranks' parameters() hold {sum(held)} elements, fewer than the model's {total}: some "
               f"parameters are not given to the optimizer on any rank.", evidence)
    c.ok(evidence)
