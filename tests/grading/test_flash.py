"""FlashAttention-2 checks, for the PyTorch slot and the Triton slot.

The runner runs the student's forward and backward on inputs drawn from the seed; this process
draws the same inputs and judges the tensors that come back against the float64 oracle.
"""
from functools import lru_cache, partial

import pytest
import torch

from adapters.cases import make_inputs
from reference.tolerance import expected_attention, judge_attention
from tests.grading import diagnose, mistakes
from tests.grading.matrix import flash_cases

SLOTS = ("pytorch", "triton")
ADAPTERS = {slot: f"get_flashattention_autograd_function_{slot}" for slot in SLOTS}
PARAMS = [(slot, tier, case) for slot in SLOTS for tier, case in flash_cases(slot, torch.cuda.is_available())]
IDS = [f"{slot}-{case.id}" for slot, _, case in PARAMS]
POWER_OF_TWO_DIMS = (16, 32, 64, 128)


# Every submission is graded on the same inputs, so a worker computes each case's oracle once for
# the whole class (all cases together: under 200 MiB).
@lru_cache(maxsize=None)
def expected(case, seed, device):
    """Inputs, oracle and plain-PyTorch baseline of a case."""
    q, k, v, do = make_inputs(case, seed, device)
    return (q, k, v, do), expected_attention(q, k, v, do, case.is_causal)


@lru_cache(maxsize=32)  # each up to ~8 MB, more while computed; a class tries many mistakes
def mistaken(case, seed, device, mistake):
    """What a known mistake gives on this case's inputs (for diagnoses)."""
    return mistakes.oracle_of(mistake, expected(case, seed, device)[0], case)


def run_case(grading, submission, slot, case, warmup=False):
    """The runner's reply and tensors for one case, shared by the checks that read them.
    `warmup` runs the case once first, so compiling and autotuning stay out of measurements."""
    interpreted = slot == "triton" and not grading.on_gpu
    timeout = grading.rubric.timeout("flash_interpreted" if interpreted else "flash")
    request = {"op": "flash", "slot": slot, "case": case.to_json(), "seed": grading.seed,
               "device": "cuda" if grading.on_gpu else "cpu", "warmup": warmup}
    what = f"N={case.n_queries}x{case.n_keys}, d={case.head_dim}, {'causal' if case.is_causal else 'non-causal'}"
    return grading.call_cached(submission, ("flash", slot, case), request, timeout, what)


def settle(check, grading, submission, slot, case):
    grading.fail_if_stub(check, submission, ADAPTERS[slot])
    reply, tensors = run_case(grading, submission, slot, case)
    if not reply.ok and reply.status == "error" and case.head_dim not in POWER_OF_TWO_DIMS:
        check.ok(f"refused d={case.head_dim} cleanly, which the handout allows: {reply.message}")
        return None, None
    check.settle_reply(reply)
    return reply, tensors


def judge(check, grading, case, tensors, names, fp32_course_tolerance=True):
    device = "cuda" if grading.on_gpu else "cpu"
    (q, k, v, do), (oracle, baseline) = expected(case, grading.seed, device)
    if missing := [n for n in names if n not in tensors]:
        check.fail(f"no {', '.join(missing)} came back: the function returned None for {missing[0]}.")
    verdicts = judge_attention({n: tensors[n] for n in names}, q, k, v, do, case.is_causal, (oracle, baseline),
                               **grading.rubric.tolerances)
    check.update(verdicts={n: v.as_dict() for n, v in verdicts.items()})
    for name in names:
        if tensors[name].dtype != (torch.float32 if name == "L" else q.dtype):
            want = "float32" if name == "L" else str(q.dtype).replace("torch.", "")
            check.fail(f"{name} is {str(tensors[name].dtype).replace('torch.', '')}, expected {want}.")
    bad = [v for v in verdicts.values() if not v.ok]
    if bad:
        sentence, heatmap = diagnose.explain(verdicts, tensors, oracle, case,
                                             partial(mistaken, case, grading.seed, device))
        check.fail(sentence, "\n".join(v.reason for v in bad), heatmap=heatmap)
    if case.dtype == "float32" and fp32_course_tolerance:
        for name in names:
            if not torch.allclose(tensors[name].double(), oracle[name].cpu(), atol=1e-2, rtol=1e-2):
                check.fail(f"{name} misses the course's own tolerance (atol=rtol=1e-2).")
    check.ok("; ".join(f"{n}: max error {v.max_err:.2e} (bound {v.max_bound:.2e})" for n, v in verdicts.items()))


@pytest.mark.parametrize("slot,tier,case", PARAMS, ids=IDS)
def test_forward(grading, submission, check, slot, tier, case):
    c = check(f"flash_{slot}", "forward", case.id, tier)
    reply, tensors = settle(c, grading, submission, slot, case)
    if reply is None:
        return
    if reply.result["n_lse"] != 1:
        c.fail(f"expected exactly one saved tensor of shape {list(case.batch) + [case.n_queries]} (the "
               f"logsumexp L), found {reply.result['n_lse']}: save L with ctx.save_for_backward.")
    judge(c, grading, case, tensors, ["o", "L"])


@pytest.mark.parametrize("slot,tier,case", PARAMS, ids=IDS)
def test_backward(grading, submission, check, slot, tier, case):
    c = check(f"flash_{slot}", "backward", case.id, tier)
    reply, tensors = settle(c, grading, submission, slot, case)
    if reply is None:
        return
    judge(c, grading, case, tensors, ["dq", "dk", "dv"])


@pytest.mark.parametrize("slot", SLOTS)
def test_hygiene(grading, submission, check, slot):
    """Inputs untouched, output dtype equal to the input dtype, same answer twice."""
    tier, case = next((t, c) for t, c in flash_cases(slot, grading.on_gpu) if t == "robustness" and c.dtype == "bfloat16")
    c = check(f"flash_{slot}", "hygiene", case.id, "hygiene")
    reply, tensors = settle(c, grading, submission, slot, case)
    if reply is None:
        return
    if not reply.result["inputs_unchanged"]:
        c.fail("the inputs changed during forward or backward: something writes into q, k, v or dO in place.")
    if tensors["o"].dtype != case.torch_dtype:
        c.fail(f"the output is {tensors['o'].dtype} for {case.dtype} inputs: cast it back to the input dtype.")
    again = grading.runner(submission).call(
        {"op": "flash", "slot": slot, "case": case.to_json(), "seed": grading.seed,
         "device": "cuda" if grading.on_gpu else "cpu", "backward": False},
        grading.rubric.timeout("flash_interpreted" if slot == "triton" and not grading.on_gpu else "flash"))
    c.settle_reply(again)
    second = grading.runner(submission).load_tensors(again)
    if not torch.equal(second["o"], tensors["o"]):
        diff = (second["o"].double() - tensors["o"].double()).abs().max().item()
        c.fail(f"the same inputs gave different outputs on two calls (max difference {diff:.3g}).")
    c.ok("inputs unchanged, dtype kept, deterministic")


@pytest.mark.parametrize("slot", SLOTS)
def test_no_library_attention(grading, submission, check, slot):
    """The Triton slot launches Triton kernels; neither slot calls SDPA, flash_attn or cuDNN."""
    tier, case = flash_cases(slot, grading.on_gpu)[0]
    c = check(f"flash_{slot}", "uses_triton" if slot == "triton" else "no_sdpa", case.id, "implementation")
    reply, _ = settle(c, grading, submission, slot, case)
    forbidden = {**reply.result["forward"]["forbidden_ops"], **reply.result.get("backward", {}).get("forbidden_ops", {})}
    if forbidden:
        c.fail(f"calls a library attention ({', '.join(sorted(forbidden))}) instead of implementing it.")
    if slot == "triton" and not reply.result["forward"]["triton_launches"]:
        c.fail("the Triton slot launched no Triton kernel in its forward.")
    c.ok(f"triton kernels launched: {reply.result['forward']['triton_launches'] or 'none'}")
