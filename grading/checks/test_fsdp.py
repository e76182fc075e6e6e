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

fp32: the data-parallel argument of test_distributed.py, so DDP's tolerance (grading/baselines.py: atol 1e-5).

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
FSDP that ignores compute_dtype lands within the rule too, so it is caught separately, under
every seed: no tensor the wrapper's forward produces is float16 (the ranks record the dtype of
every op's output in the forward, so this holds where the FSDP computes its layers with a module
of its own and their own forward never runs), or the layers it runs return float32 (the ranks
record each Linear's and the Embedding's output dtype). The handout asks for the gathered weights
to be cast to compute_dtype 'before communicating or using them for compute'. The numbers alone
cannot tell: where fp32 and fp16-compute training end within FP32_MATCH of each other, float32
training passes the fp16 rule (bench/distributed_sweep.py; notes/distributed-seed-sweep.md).

Without get_fsdp in the adapters (the 2025 template) the checks are skipped and carry no points.
"""
import pytest
import torch

from fa2_sandbox.wire.training import build_model
from grading.baselines import (
    FSDP_BATCH,
    FSDP_LR,
    FSDP_MODEL,
    FSDP_STEPS,
    PRECISIONS,
    WORLD_SIZE,
    by_original_name,
    close,
    max_diff,
    names,
    pick,
    train_baseline,
)
from grading.checks.distributed_checks import distributed_call, settle_scenario
from grading.diagnoses.fsdp import explain
from grading.tracks import DISTRIBUTED, Track

FP16_FACTOR, FP16_ATOL = 3.0, 2e-5
FP32_MATCH = 2e-6  # closer than this to fp32 training: float16 was never used
NUMEL_SLACK = 16
SHARDED_LAYERS = (torch.nn.Linear, torch.nn.Embedding)
TEMPLATE_2025 = "this submission follows the 2025 template, which has no FSDP"
LABELS = {"wrap": "get_fsdp", "forward": "the wrapper's forward", "backward": "loss.backward()",
          "after_backward": "fsdp_on_after_backward", "step": "optimizer.step()",
          "gather": "fsdp_gather_full_params", "setup": "setup"}


def track(params: dict, per_kernel: bool) -> Track:
    """One runner for the distributed checks: its ranks are kept from one call to the next."""
    return DISTRIBUTED


def check_of(test: str, params: dict) -> tuple:
    """(part, check, tier) of a test of this module, known at collection (test_flash.check_of)."""
    return "fsdp", test.removeprefix("test_fsdp_"), "default"


pytestmark = pytest.mark.grading(check_of=check_of, track=track)

def fsdp_run(session, submission):
    spec = {"model": FSDP_MODEL, "steps": FSDP_STEPS, "batch": FSDP_BATCH, "lr": FSDP_LR,
            "scenarios": [{"name": name, "compute_dtype": dtype} for name, dtype in PRECISIONS.items()]}
    return distributed_call(session, submission, "fsdp", spec, f"FSDP, {WORLD_SIZE} gloo ranks")


def gate_fsdp(c, session, submission):
    if "get_fsdp" not in session.functions[submission.name]:
        c.skip(TEMPLATE_2025)
    session.fail_if_stub(c, submission, "get_fsdp")


# -- reading what the ranks returned ----------------------------------------------------------


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


# -- checks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_fsdp_equivalence(session, submission, check, precision):
    """The gathered parameters after training match single-process training on the full batch."""
    c = check(precision)
    gate_fsdp(c, session, submission)
    reply, tensors = fsdp_run(session, submission)
    ranks = settle_scenario(c, reply, precision, LABELS)
    dtype = PRECISIONS[precision]
    expected = train_baseline(session, dtype)
    finals = gathered(c, ranks, tensors, precision, "final", expected)
    diffs = diffs_text(finals, expected) + layers_text(ranks)
    worst = max(max_diff(final, expected)[0] for final in finals)
    if dtype is None:
        if all(close(final[n], expected[n]) for final in finals for n in expected):
            c.ok(f"all {len(ranks)} ranks gather the parameters of single-process training on the full batch "
                 f"after {FSDP_STEPS} steps (max difference {worst:.1e}){layers_text(ranks)}")
            return
        c.fail(explain(session, precision, ranks, tensors) or
               f"the gathered parameters differ from single-process training (max difference {worst:.2g}).", diffs)

    fp32 = train_baseline(session)
    gap = max_diff(fp32, expected)[0]
    bound = FP16_FACTOR * gap + FP16_ATOL
    layer_dtypes = sorted({d for s in ranks for d in s.get("layer_dtypes", ())})
    seen = f"; the Linear and Embedding layers produced {', '.join(layer_dtypes)} outputs" if layer_dtypes else ""
    seen += layers_text(ranks)
    if worst <= bound:
        from_fp32 = max(max_diff(final, fp32)[0] for final in finals)
        # Three signs that nothing computed in float16. The first two hold under every seed: no
        # tensor the wrapper's forward produced was float16 (whatever computes it: the layers' own
        # forward or a module of the FSDP's own), or every layer that ran returned float32 (seen
        # when the FSDP still calls the layers' forward). The third, where the ranks recorded no
        # dtypes: the parameters are float32 training's, when float16 moves them measurably at
        # all (with the official tests' SGD rate the gap can be under FP32_MATCH).
        forward_dtypes = sorted({d for s in ranks for d in s.get("forward_dtypes", ())})
        forward_ignored_it = bool(forward_dtypes) and dtype not in forward_dtypes
        layers_ignored_it = bool(layer_dtypes) and dtype not in layer_dtypes
        if forward_ignored_it or layers_ignored_it or from_fp32 <= FP32_MATCH < gap:
            c.fail(f"compute_dtype={dtype} had no effect: "
                   + (f"the layers computed in {', '.join(layer_dtypes)}" if layers_ignored_it
                      else f"the wrapper's forward computed nothing in {dtype} (its operations produced "
                      f"{', '.join(forward_dtypes)} tensors only)" if forward_ignored_it
                      else f"the parameters match training entirely in float32 (max difference {from_fp32:.1e})")
                   + "; cast the gathered weights to it, as the handout says, 'before communicating or using them "
                     "for compute'.", as_float32_training(from_fp32, worst, gap) + seen)
        c.ok(f"all {len(ranks)} ranks within the fp16 rule after {FSDP_STEPS} steps: "
             f"{within_fp16_rule(worst, gap, bound)}{seen}")
        return
    c.fail(explain(session, precision, ranks, tensors) or
           f"the gathered parameters differ from fp16-compute training by more than float16 rounding explains "
           f"({worst:.2g}, allowed {bound:.2g}).", over_fp16_rule(worst, gap, bound) + seen + "\n" + diffs)


# -- the fp16 rule's figures, each worded the way its verdict went ---------------------------------

def fp16_allowance(gap: float, bound: float) -> str:
    return (f"{bound:.2g} ({FP16_FACTOR:g} x {gap:.2g}, how far float16 rounding alone moves training from "
            f"float32 training, + {FP16_ATOL:g})")


def within_fp16_rule(worst: float, gap: float, bound: float) -> str:
    """A pass: the difference from fp16-compute training, under its allowance."""
    return f"max difference from fp16-compute training {worst:.2g}, within the allowed {fp16_allowance(gap, bound)}"


def over_fp16_rule(worst: float, gap: float, bound: float) -> str:
    """A failure by the numbers: the allowance missed, and by how much."""
    return (f"max difference from fp16-compute training {worst:.2g}, over the allowed {fp16_allowance(gap, bound)} "
            f"by {worst - bound:.2g} ({worst / bound:.3g} times the allowance)")


def as_float32_training(from_fp32: float, from_fp16: float, gap: float) -> str:
    """A failure because nothing ran in float16: how near float32 training the parameters are, which
    the fp16 rule's allowance cannot show (float32 training is within it too)."""
    if from_fp32 < gap:
        return (f"max difference from float32 training {from_fp32:.2g}, under the {gap:.2g} by which computing in "
                f"float16 moves training away from it: the parameters are float32 training's (fp16-compute "
                f"training's are {from_fp16:.2g} away)")
    return (f"max difference from float32 training {from_fp32:.2g}, from fp16-compute training {from_fp16:.2g}: "
            f"float16 moves training only {gap:.2g} here, too little for the numbers to tell the two apart, so the "
            f"dtypes the ranks saw decide")



def test_fsdp_sharded(session, submission, check):
    """Each rank's parameters() hold about 1/world_size of the Linear layers' elements."""
    c = check("fp32")
    gate_fsdp(c, session, submission)
    reply, _ = fsdp_run(session, submission)
    c.settle_reply(reply)
    ranks = reply.result["scenarios"].get("fp32")
    if not ranks or any("numel" not in s for s in ranks):  # failed before get_fsdp returned
        settle_scenario(c, reply, "fp32", LABELS)
    model = build_model(FSDP_MODEL, session.seed)
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
