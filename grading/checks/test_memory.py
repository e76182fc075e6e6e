"""Memory: the forward never holds an Nq x Nk score matrix; the backward recomputes P.

On a CPU the runner watches every aten op's output (a dispatch mode) and reports the largest;
that sees PyTorch code only, so the Triton slot is measured on a GPU, by peak device memory at
a length where one N x N matrix would dwarf everything else.

The Triton case is bf16. A class that raises in bf16 (a kernel that fails to compile for bf16
inputs, say) is measured on the same case in float32 instead: whether an N x N matrix is formed
is a matter of shape, not dtype, and the bf16 checks fail for the bf16 error already, not a
second time here. Only a class that runs in neither dtype fails here for raising, and its
diagnosis quotes what went wrong in each dtype: the float32 failure may be a bug of its own.
"""
import dataclasses

import pytest

from fa2_sandbox.wire import outcomes
from grading.checks.flash_checks import fail_unanswered, got_no_answer, run_case, traceback_of, what_failed
from grading.matrix import GPU_MEMORY_CASE, MEMORY_CASE, flash_cases, slot_device
from grading.tracks import Track

# On a GPU one N x N fp32 matrix is 1 GiB at N=16384. The PyTorch slot is measured on the CPU,
# where the official tests run it, with MEMORY_CASE.
GPU_CASES = {"triton": GPU_MEMORY_CASE}


def track(params: dict, per_kernel: bool) -> Track:
    """The PyTorch slot's memory joins the slot's track (its case is one of the slot's own, so the
    slot's reply serves it); the Triton slot's runs at N = 16384 in a runner of its own."""
    return Track("pytorch" if params["slot"] == "pytorch" else f"memory-{params['slot']}")


def check_of(test: str, params: dict) -> tuple:
    """(part, check, tier) of a test of this module, known at collection (test_flash.check_of)."""
    return "memory", params["phase"], "memory"


pytestmark = pytest.mark.grading(check_of=check_of, track=track)

def _limit_bytes(case) -> int:
    """Generous O(N d): 32 copies of q (fp32 accumulators, saved tensors, gradients), plus
    16 MiB of allocator slack. One batch row's q: the GPU cases have batch (1,). At the Triton
    case (N=16384, d=64, bf16) that is 32 x 2 MiB + 16 MiB = 80 MiB, under a tenth of the 1 GiB
    one N x N fp32 score matrix takes, so a single materialised matrix fails it."""
    q_bytes = case.n_queries * case.head_dim * case.torch_dtype.itemsize
    return 32 * q_bytes + (16 << 20)


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("slot", ["pytorch", "triton"])
def test_no_score_matrix(session, submission, check, slot, phase):
    on_cuda = slot_device(slot, session.on_gpu) == "cuda"  # the PyTorch class is graded on the CPU
    case = GPU_CASES[slot] if on_cuda else MEMORY_CASE
    c = check((f"{slot}-{case.id}", case))
    if slot == "triton" and not session.on_gpu:
        c.not_here("it needs a GPU: Triton's memory is measured on one; the interpreter's numpy arrays are "
                   "invisible on a CPU")
    reply, _ = run_case(session, submission, slot, case, warmup=on_cuda)
    note = ""
    if on_cuda and case.dtype != "float32" and raised(reply, phase):
        twin = dataclasses.replace(case, dtype="float32")
        fp32_reply, _ = run_case(session, submission, slot, twin, warmup=True)
        if not measured(fp32_reply, phase):
            # Quote both: the bf16 error alone hid a float32 failure of its own (issue 34), and
            # either one fixed lets this check measure the class.
            bf16_failed, fp32_failed = what_failed(reply), what_failed(fp32_reply)
            found = (f"in both {bf16_failed}" if bf16_failed == fp32_failed else
                     f"in {case.dtype} {bf16_failed}; in float32 {fp32_failed}")
            traces = [f"{dtype}:\n{trace}" for dtype, trace in ((case.dtype, traceback_of(reply)),
                                                               ("float32", traceback_of(fp32_reply))) if trace]
            c.update(seconds=reply.seconds + fp32_reply.seconds)
            fix = "fix it" if bf16_failed == fp32_failed else "fix either"
            c.fail(f"the {phase} must run in {case.dtype}, or else in float32, for its memory to be measured, and it "
                   f"ran in neither: {found}; {fix} and the memory is measured (the flash_triton checks of each "
                   f"dtype show the error).", "\n".join(traces), outcome=outcomes.ERROR)
        note = (f" Measured in float32: in {case.dtype} {what_failed(reply)}, which the slot's {case.dtype} "
                f"checks fail for already.")
        case, reply = twin, fp32_reply
    graded_case = case in [flash_case for _, flash_case in flash_cases(slot, session.on_gpu)]
    if graded_case and got_no_answer(reply):  # the slot's forward check of this case fails for it too
        fail_unanswered(c, reply, f"flash_{slot}::forward[{case.id}]", "measure")
    c.settle_reply(reply)
    if phase == "backward" and (error := reply.result.get("backward_error")):
        if graded_case and error["status"] == outcomes.ERROR:
            fail_unanswered(c, reply, f"flash_{slot}::backward[{case.id}]", "measure")
        c.fail(f"the backward raised {error['message']}", outcome=outcomes.NOT_ATTEMPTED if error["status"] ==
               outcomes.NOT_ATTEMPTED else outcomes.ERROR)
    seen = reply.result[phase]
    scores = case.n_queries * case.n_keys
    if on_cuda:
        limit, peak = _limit_bytes(case), seen["peak_bytes"]
        memory = {"n": [case.n_queries], "peak_bytes": [peak], "limit_bytes": [limit]}
        if peak > limit:
            c.fail(f"the {phase} peaked at {peak / 2**20:.0f} MiB of extra GPU memory at N={case.n_queries}, over the "
                   f"O(N d) limit of {limit / 2**20:.0f} MiB: an N x N matrix is materialised"
                   + (" (P saved for backward?)" if phase == "backward" else "") + "." + note, memory=memory)
        c.ok(f"peak {peak / 2**20:.1f} MiB (limit {limit / 2**20:.0f} MiB).{note}", memory=memory)
    elif seen["largest_numel"] >= scores:
        c.fail(f"the {phase} built a tensor of shape {seen['largest_shape']} ({seen['largest_numel']:,} elements), "
               f"at least one full {case.n_queries} x {case.n_keys} score matrix: FlashAttention works tile by tile.")
    else:
        c.ok(f"largest tensor {seen['largest_shape']} ({seen['largest_numel']:,} elements) < {scores:,}")


def measured(reply, phase) -> bool:
    """Whether `phase` ran, so that its memory was measured."""
    return reply.ok and phase in reply.result


def raised(reply, phase) -> bool:
    """Whether the class raised before `phase` was measured: an exception of its own, not a
    timeout or a crash (running out of memory is a crash: it says something about memory)."""
    if reply.raised:
        return True
    error = reply.result.get("backward_error") if reply.ok and phase == "backward" else None
    return bool(error) and error["status"] == outcomes.ERROR
