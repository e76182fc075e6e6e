"""FlashAttention-2 checks, for the PyTorch slot and the Triton slot.

The runner runs the student's forward and backward on inputs drawn from the seed; this process
draws the same inputs and judges the tensors that come back against the float64 oracle.

Without a GPU the Triton slot runs under Triton's interpreter. The class runs the course case
there, or it does not: it does not when that case raises an error that names CUDA, the GPU or
NVIDIA (in its message or the line that raised it) or says the interpreter does not support what
the class called. Then every Triton check is "not graded here" (it needs a GPU); otherwise every
case is judged there, and an error of any other case fails as it would on a GPU
(flash_checks.needs_gpu has the whole rule).
"""
import dataclasses
from contextlib import nullcontext
from functools import partial

import pytest
import torch

from fa2_sandbox.wire import outcomes, requests
from fa2_sandbox.wire.cases import FLASH_SLOTS
from grading.checks.changed_inputs import changed_inputs, name_changed_inputs
from grading.checks.flash_checks import (
    SLOTS,
    expected,
    expected_tf32,
    fail_unanswered,
    flash_timeout,
    got_no_answer,
    mistaken,
    not_here_if_needs_gpu,
    oracle_bytes,
    run_case,
    settle,
    stored_as,
    traceback_of,
    what_failed,
)
from grading.diagnoses import flash as diagnose
from grading.matrix import COURSE_CASE, flash_cases, replay_cases, slot_device
from grading.tracks import Track, kernel_track, timing_track
from reference.tolerance import course_close, judge_attention

PARAMS = [(slot, tier, case) for slot in SLOTS for tier, case in flash_cases(slot, torch.cuda.is_available())]
IDS = [f"{slot}-{case.id}" for slot, _, case in PARAMS]
# The checks of one case of each slot name it as a parameter, so that on a GPU each joins its
# case's track (grading/tracks.py) and takes that track's reply and compiled kernels: in a
# track of their own they compiled and autotuned the case again.
# Hygiene: a handout shape (d=64, bf16), since odd lengths, which some classes refuse, must not
# hide its findings. Implementation: the slot's first case.
HYGIENE = [next(p for p in PARAMS if p[0] == slot and p[1] in ("handout", "bf16") and p[2].dtype == "bfloat16"
                and p[2].head_dim == 64) for slot in SLOTS]
IMPLEMENTATION = [next(p for p in PARAMS if p[0] == slot) for slot in SLOTS]
REPLAY = [(slot, tier, case) for slot in SLOTS for tier, case in replay_cases(slot, torch.cuda.is_available())]
ANSWERS = ("o", "L", "dq", "dk", "dv")


def track(params: dict, per_kernel: bool) -> Track:
    """The runner of a flash check (grading/tracks.py): the PyTorch slot's, or for the Triton slot
    the kernel its case compiles. runs_on_cuda joins the PyTorch slot's timing runner, which puts
    the class on CUDA anyway: the slot's own runner, on the CPU, then never starts CUDA (a context,
    and for a torch.compile'd class a second compile, in every PyTorch runner of a class)."""
    if params.get("device") == "cuda":
        return timing_track("pytorch")
    slot, case = params.get("slot", "pytorch"), params.get("case")
    return kernel_track(case, per_kernel) if slot == "triton" and case is not None else Track(slot)


def check_of(test: str, params: dict) -> tuple:
    """(part, check, tier) of the check a test of this module makes: known at collection, so a check
    that never ran still has its rubric group (grading/declaration.py)."""
    slot = params.get("slot", "pytorch")
    part = f"flash_{slot}"
    return {"test_forward": (part, "forward", params.get("tier")),
            "test_backward": (part, "backward", params.get("tier")),
            "test_runs_on_cuda": ("flash_pytorch", "runs_on_cuda", "cuda"),
            "test_hygiene": (part, "hygiene", "hygiene"),
            "test_no_library_attention": (part, "uses_triton" if slot == "triton" else "no_sdpa", "implementation"),
            "test_replay": (part, "replay", "replay")}[test]


pytestmark = pytest.mark.grading(check_of=check_of, track=track)

def judge(check, session, slot, tier, case, tensors, names):
    """Pass or fail `names` of `tensors` against the float64 oracle, by the rule of the tier."""
    device = slot_device(slot, session.on_gpu)
    with session.gpu_work(oracle_bytes(case), f"the oracle of {case.id}") if device == "cuda" else nullcontext():
        judge_on(check, session, slot, tier, case, tensors, names, device)


def judge_on(check, session, slot, tier, case, tensors, names, device):
    (q, k, v, do), (oracle, baseline) = expected(case, session.seed, device, session.oracles)
    if missing := [n for n in names if n not in tensors]:
        check.fail(f"no {', '.join(missing)} came back: the function returned None for {missing[0]}.")
    # The dtypes: the official tests' assert_close checks them (course tier), and so do the checks
    # beyond the handout; the handout asks for none, so its requirements judge the numbers alone and
    # the hygiene check advises on the dtype. L is judged with its storage rounding forgiven.
    off_dtype = []
    for name in names:
        want = torch.float32 if name == "L" else q.dtype
        if tensors[name].dtype == want:
            continue
        found = (f"{name} is {str(tensors[name].dtype).replace('torch.', '')}, expected "
                 f"{str(want).replace('torch.', '')}")
        if tier == "course" or (check.record.advice and name != "L"):
            check.fail(found + ".")
        off_dtype.append(found)
    got = {n: tensors[n] for n in names}
    mistake = partial(mistaken, case, session.seed, device, shared=session.oracles)
    verdicts = judge_attention(got, q, k, v, do, case.is_causal, (oracle, stored_as(baseline, got)),
                               **session.rubric.tolerances)
    tf32 = False
    if slot == "triton" and case.dtype == "float32" and tier != "course":  # the fp32 policy: tolerance.py
        relaxed = judge_attention(got, q, k, v, do, case.is_causal,
                                  (oracle, stored_as(expected_tf32(case, session.seed, device), got)),
                                  **session.rubric.tolerances)
        tf32 = all(v.ok for v in relaxed.values()) and not all(v.ok for v in verdicts.values())
        verdicts = relaxed
    check.update(verdicts={n: v.as_dict() for n, v in verdicts.items()}, precision="tf32" if tf32 else None)
    errors = "; ".join(f"{n}: max error {v.max_err:.2e}" for n, v in verdicts.items())
    if tier == "course":  # the official tests' rule alone; the relative rule only explains a failure
        if problems := [p for n in names if (p := course_close(n, tensors[n], oracle[n]))]:
            sentence, heatmap = (problems[0], None) if all(v.ok for v in verdicts.values()) else \
                diagnose.explain(verdicts, tensors, oracle, case, mistake)
            point_at_the_forward(check, case, sentence)
            check.fail(f"{sentence} (the official tests' tolerance is atol=rtol=1e-2)", "\n".join(problems),
                       heatmap=heatmap)
        check.ok(f"within the official tests' tolerance (atol=rtol=1e-2): {errors}")
        return
    bad = [v for v in verdicts.values() if not v.ok]
    if bad:
        sentence, heatmap = diagnose.explain(verdicts, tensors, oracle, case, mistake)
        point_at_the_forward(check, case, sentence)
        check.fail(sentence, "\n".join(v.reason for v in bad), heatmap=heatmap)
    note = ("; ".join(f"{n}: max error {v.max_err:.2e} (bound {v.max_bound:.2e})" for n, v in verdicts.items()))
    if off_dtype:
        note += f" ({'; '.join(off_dtype)}: the handout does not ask for a dtype, the hygiene check advises on it)"
    if tf32:
        note = ("computes its fp32 matmuls in TF32 (tl.dot's default on tensor cores), so it is judged against "
                "plain attention with TF32 matmuls, and no points are lost: " + note)
    check.ok(note)


def point_at_the_forward(check, case, sentence):
    """A backward wrong because its forward is: the page links it to the forward check of its case."""
    if check.record.check == "backward" and diagnose.blames_the_forward(sentence):
        check.update(see_also=f"{check.record.part}::forward[{case.id}]")


@pytest.mark.parametrize("slot,tier,case", PARAMS, ids=IDS)
def test_forward(session, submission, check, slot, tier, case):
    c = check(case)
    reply, tensors = settle(c, session, submission, slot, tier, case)
    if reply is None:
        return
    name_changed_inputs(c, reply, ("forward",))  # the backward's changes come after o and L were taken
    if reply.result["n_lse"] != 1:
        c.fail(f"expected exactly one saved tensor of shape {list(case.batch) + [case.n_queries]} (the "
               f"logsumexp L), found {reply.result['n_lse']}: save L with ctx.save_for_backward.")
    judge(c, session, slot, tier, case, tensors, ["o", "L"])


@pytest.mark.parametrize("slot,tier,case", PARAMS, ids=IDS)
def test_backward(session, submission, check, slot, tier, case):
    c = check(case)
    reply, tensors = settle(c, session, submission, slot, tier, case, phase="backward")
    if reply is None:
        return
    name_changed_inputs(c, reply)
    judge(c, session, slot, tier, case, tensors, ["dq", "dk", "dv"])


@pytest.mark.parametrize("device", ["cuda"])  # its track (`track`) reads it
def test_runs_on_cuda(session, submission, check, device):
    """The PyTorch class on CUDA tensors (the official tests run it on the CPU only): advice."""
    c = check(COURSE_CASE)
    if not session.on_gpu:
        c.not_here("it needs a GPU: this runs the course case on CUDA tensors (the official tests run the PyTorch "
                   "class on the CPU, as this grader does elsewhere)")
    session.fail_if_stub(c, submission, FLASH_SLOTS["pytorch"])
    reply, tensors = run_case(session, submission, "pytorch", COURSE_CASE, device=device)
    backward_error = reply.result.get("backward_error") or {}
    if reply.raised or backward_error.get("status") == outcomes.ERROR:  # a missing backward fails elsewhere
        message = reply.message if reply.raised else backward_error["message"]
        c.fail(f"on CUDA inputs the PyTorch class raised {message}. It is graded on the CPU, as the official "
               f"tests run it; to run on a GPU too, create every tensor with device=q.device.",
               reply.traceback, outcome=outcomes.ERROR)
    c.settle_reply(reply)
    name_changed_inputs(c, reply)
    if off := sorted(n for n, where in reply.result.get("devices", {}).items() if not where.startswith("cuda")):
        c.fail(f"on CUDA inputs the PyTorch class returned {', '.join(off)} on the CPU: create its tensors with "
               f"device=q.device.")
    oracle = expected(COURSE_CASE, session.seed, "cuda")[1][0]
    problems = [p for n in ("o", "dq", "dk", "dv") if n in tensors and (p := course_close(n, tensors[n], oracle[n]))]
    if problems:
        c.fail(f"on CUDA inputs the results differ from the oracle beyond the official tolerance: {problems[0]}",
               "\n".join(problems))
    c.ok("the course case runs on CUDA tensors and stays within the official tolerance")


@pytest.mark.parametrize("slot,tier,case", HYGIENE, ids=SLOTS)
def test_hygiene(session, submission, check, slot, tier, case):
    """Inputs untouched, output dtype equal to the input dtype, L in float32, same answer twice.

    The inputs are looked at in float32 too, on the case's float32 twin (a handout case of the slot,
    whose reply the PyTorch slot's runner shares): a change smaller than bf16's rounding step, such
    as scaling a row of q by 1 + 1e-4, leaves bf16 inputs bit for bit as they were."""
    c = check(case)
    reply, tensors = settle(c, session, submission, slot, tier, case)
    if reply is None:
        return
    changed, dtype = changed_inputs(reply), case.dtype
    if not changed:
        twin = dataclasses.replace(case, dtype="float32")
        changed, dtype = changed_inputs(run_case(session, submission, slot, twin)[0]), twin.dtype
    if changed:
        c.fail(f"{changed}, in {dtype}: the caller's q, k, v and dO must come back as they were given; compute into "
               f"new tensors, never into the inputs.")
    if tensors["o"].dtype != case.torch_dtype:
        c.fail(f"the output is {tensors['o'].dtype} for {case.dtype} inputs: cast it back to the input dtype.")
    if "L" in tensors and tensors["L"].dtype != torch.float32:
        c.fail(f"L is stored in {str(tensors['L'].dtype).replace('torch.', '')} for {case.dtype} inputs: keep the "
               f"logsumexp in float32, as the handout keeps l and m, since the backward's exp(S - L) needs its digits.")
    device = slot_device(slot, session.on_gpu)
    again = session.runner(submission).call(
        requests.Flash(slot, case, session.seed, device, backward=False),
        flash_timeout(session, slot, device))  # not run_case: its replies are cached, and this is a second call
    c.settle_reply(again)
    if not torch.equal(again.tensors["o"], tensors["o"]):
        diff = (again.tensors["o"].double() - tensors["o"].double()).abs().max().item()
        c.fail(f"the same inputs gave different outputs on two calls (max difference {diff:.3g}).")
    c.ok("inputs unchanged, dtype kept, L in float32, deterministic")


@pytest.mark.parametrize("slot,tier,case", IMPLEMENTATION, ids=SLOTS)
def test_no_library_attention(session, submission, check, slot, tier, case):
    """The Triton slot launches Triton kernels; neither slot calls SDPA, flash_attn or cuDNN."""
    c = check(case)
    reply, _ = settle(c, session, submission, slot, tier, case)
    forbidden = {**reply.result["forward"]["forbidden_ops"],
                 **reply.result.get("backward", {}).get("forbidden_ops", {})}
    if forbidden:
        c.fail(f"calls a library attention ({', '.join(sorted(forbidden))}) instead of implementing it.")
    if slot == "triton" and not reply.result["forward"]["triton_launches"]:
        c.fail("the Triton slot launched no Triton kernel in its forward.")
    c.ok(f"triton kernels launched: {reply.result['forward']['triton_launches'] or 'none'}")


def same_answers(first: dict, second: dict) -> tuple[list, list]:
    """(the tensors compared, those of them the second input got back unchanged: within 1e-3 of
    the first's norm, where fresh inputs move every answer by about its own size). A tensor that
    is constant in the first answer (all zeros, say) is not compared: that is a bug the forward
    and backward checks judge, not a replay."""
    compared, same = [], []
    for name in ANSWERS:
        a, b = first.get(name), second.get(name)
        if a is None or b is None or a.shape != b.shape or a.numel() < 2:
            continue
        a, b = a.double(), b.double()
        if not bool(torch.isfinite(a).all()) or a.min() == a.max():
            continue
        compared.append(name)
        if (b - a).norm() <= 1e-3 * a.norm():
            same.append(name)
    return compared, same


@pytest.mark.parametrize("slot,tier,case", REPLAY, ids=[f"{slot}-{case.id}" for slot, _, case in REPLAY])
def test_replay(session, submission, check, slot, tier, case):
    """A second, unseen input of a case, asked right after the case in the same runner, gets an
    answer of its own, not the first input's again (answers cached by shape, dtype or case).

    Replay judges a replay and needs two answers to compare. Where the slot is the template's stub
    the check does not apply: not measured, its points shared by the part's other checks
    (Rubric.weights). Where the class's own call went wrong (the first input raised, crashed or
    timed out, the second got no answer, or no answer varies with its input) it fails: a failure
    never moves points to checks that passed, so a class that raises on every case never scores
    more than one that answers wrongly. The case's forward check fails for the first input's failure
    too, and the page links to it. On a machine without a GPU, a Triton class that does not run
    there (flash_checks.needs_gpu) is not graded here, like the slot's other checks."""
    c = check(case)
    first = f"flash_{slot}::forward[{case.id}]"
    if FLASH_SLOTS[slot] in session.stubs[submission.name]:
        c.not_measured(f"{FLASH_SLOTS[slot]} raises NotImplementedError (not attempted), so there is no answer to "
                       f"replay; the slot's other checks fail for it as not attempted.")
    not_here_if_needs_gpu(c, session, submission, slot)
    reply, tensors = run_case(session, submission, slot, case)
    if got_no_answer(reply):
        fail_unanswered(c, reply, first, "compare")
    c.settle_reply(reply)  # the adapters did not import: every check's own finding
    again, again_tensors = run_case(session, submission, slot, case, second=True)
    if not again.ok:
        c.update(seconds=again.seconds)
        c.fail(f"a second, unseen input of this case, asked right after the first, got no answer "
               f"({what_failed(again)}), though the first input got one: every input of a case must get its own "
               f"answer.", traceback_of(again), outcome=again.outcome)
    compared, same = same_answers(tensors, again_tensors)
    if same:
        c.fail(f"returned the same {', '.join(same)} for a different input: a second, unseen input of this case, "
               f"asked right after the first, got the first one's answer back. The answers are cached (by shape, "
               f"dtype or case), not computed from the inputs: compute every call's answer from its own q, k, v.")
    if not compared:
        c.fail(f"no answer varies with its input (each is constant, or not finite), so a replayed answer cannot be "
               f"told from a new one; {first} and the case's backward check judge those answers, and this check, "
               f"which needs answers that vary, fails with them.")
    c.ok(f"a second, unseen input of the same case got answers of its own ({', '.join(compared)} compared)")
