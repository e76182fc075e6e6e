"""What the FlashAttention checks share: the runner call for one case, the float64 oracles, the
baseline's L in the dtype a submission stored it in, how a call that went wrong ends a check, and
when a Triton class needs a GPU to be judged at all.

test_flash.py, test_memory.py and test_timing.py import from here; no check imports another
check module.
"""
import re
from dataclasses import replace
from functools import lru_cache

from fa2_sandbox.wire import outcomes, requests
from fa2_sandbox.wire.cases import FLASH_SLOTS, make_inputs
from grading.diagnoses import mistakes
from grading.matrix import COURSE_CASE, WATCHED_CASES, replay_cases, slot_device
from reference.tolerance import expected_attention, tf32_attention_and_grads

SLOTS = tuple(FLASH_SLOTS)  # "pytorch", "triton"
POWER_OF_TWO_DIMS = (16, 32, 64, 128)  # the head dims the handout promises; any other may be refused


def expected(case, seed, device, shared=None):
    """Inputs, oracle and plain-PyTorch baseline of a case. `shared`: the run's SharedOracles
    (session.oracles), through which the run's workers compute a CPU case's once between them."""
    return _expected(case, seed, device, _on_cpu(shared, device))


def _on_cpu(shared, device):
    """`shared` for a case that runs on the CPU, where each oracle costs seconds of a core; None elsewhere."""
    return shared if device == "cpu" else None


# Every submission is graded on the same inputs, so a worker computes each case's oracle once for
# the whole class (all cases together: under 200 MiB), and on the CPU, where each costs seconds of
# a core, the run's workers share them (shared_oracles.py).
@lru_cache(maxsize=None)
def _expected(case, seed, device, shared):
    def compute():
        q, k, v, do = make_inputs(case, seed, device)
        return (q, k, v, do), expected_attention(q, k, v, do, case.is_causal)

    return compute() if shared is None else shared.get((case, seed, device), compute)


@lru_cache(maxsize=None)
def expected_tf32(case, seed, device):
    """Plain float32 attention with TF32 matmuls: the baseline of fp32 Triton results."""
    return tf32_attention_and_grads(*expected(case, seed, device)[0], case.is_causal)


@lru_cache(maxsize=32)  # each up to ~8 MB, more while computed; a class tries many mistakes
def mistaken(case, seed, device, mistake, shared=None):
    """What a known mistake gives on this case's inputs (for diagnoses). A class's wrong submissions
    fail the same cases and their diagnoses try the same mistakes on them: on the CPU the run's
    workers compute each once between them, through `shared`, as they do the oracles
    (notes/grading-speed.md, "The diagnoses' mistaken oracles, once per class")."""
    def compute():
        return mistakes.oracle_of(mistake, expected(case, seed, device, shared)[0], case)

    shared = _on_cpu(shared, device)
    return compute() if shared is None else shared.get((case, seed, device, mistake), compute)


def oracle_bytes(case) -> int:
    """GPU memory for a worker's float64 oracle of `case`: 1 GiB of slack and 6 float64 matrices
    of N_q x N_k (scores, P, dP, dS and the plain baseline's)."""
    return (1 << 30) + 6 * 8 * (case.work // case.head_dim)


def flash_timeout(session, slot, device) -> float:
    """A flash call's timeout: the Triton slot on a CPU runs under the (slow) interpreter."""
    return session.rubric.timeout("flash_interpreted" if slot == "triton" and device == "cpu" else "flash")


def run_case(session, submission, slot, case, warmup=False, device=None, second=False):
    """The runner's reply and tensors for one case, shared by the checks that read them.
    `warmup` runs the case once first, so compiling and autotuning stay out of measurements.

    A case of matrix.replay_cases that answered is asked again at once, on a second input that
    nothing else draws: in the same runner, with no other call between the two, whichever check
    asked first, so what the second answer shows is the same in every schedule. `second` returns
    its reply and tensors instead, or (None, None) where the case's own call failed."""
    device = device or slot_device(slot, session.on_gpu)
    request = requests.Flash(slot, case, session.seed, device, warmup=warmup, watch_ops=case in WATCHED_CASES)
    what = f"N={case.n_queries}x{case.n_keys}, d={case.head_dim}, {'causal' if case.is_causal else 'non-causal'}"
    timeout = flash_timeout(session, slot, device)
    answer = session.call_cached(submission, request, timeout, what)
    asked_again = answer[0].ok and not warmup and device == slot_device(slot, session.on_gpu) \
        and case in [c for _, c in replay_cases(slot, session.on_gpu)]
    if asked_again:
        again = session.call_cached(submission, replace(request, second_input=True), timeout, f"{what}, a second input")
    if second:
        return again if asked_again else (None, None)
    return answer


def stored_as(baseline: dict, got: dict) -> dict:
    """The baseline with its L rounded to the dtype the submission stored L in (bf16, say)."""
    if "L" in got and got["L"].dtype.is_floating_point and got["L"].dtype != baseline["L"].dtype:
        return {**baseline, "L": baseline["L"].to(got["L"].dtype)}
    return baseline


# -- refusing a head dim the handout does not promise -------------------------------------------
#
# The handout promises d in POWER_OF_TWO_DIMS, so a class may refuse any other head dim, and a
# check at such a dim then passes. Only a refusal does: an error that a real bug raises (an
# IndexError, a shape mismatch, a dtype mismatch in a bf16 path) fails with its own diagnosis.
# An error is a refusal when both hold:
#
# 1. It is the class's answer to this case, before any result: the forward raised (the runner's
#    last phase is "forward"; an error before it is the grader's setup or the adapter getter), or,
#    for the backward's checks, the backward raised (the forward's results are judged as usual).
# 2. It names the head dim, in the message the runner sends ("TypeName: first line"):
#    - in words: "head dim", "head_dim", "head dimension", "head size", "d_head", "dim_head"
#      (also in the exception's class name, e.g. UnsupportedHeadDim);
#    - as "d=48", "D = 48", "d == 48" or "d: 48" (the case's own head dim);
#    - or, from an AssertionError, ValueError or NotImplementedError (what code raises on
#      purpose), the head dim's value as a number of its own: "unsupported: 48", "48 not in
#      (16, 32, 64, 128)", but not inside a shape ("torch.Size([2, 35, 48])", "(2, 35, 48)"),
#      which a shape check names whatever went wrong.
#    Or it is Triton refusing a block that is not a power of two ("arange's range must be a power
#    of 2", in a CompilationError on a GPU or an InterpreterError under the interpreter): a kernel
#    written for the handout's head dims, whose tl.arange over d compiles only for powers of two.
#    (A block sized from a sequence length fails the same way at the odd lengths, which every
#    class must handle, so it is caught there.)
#
# A bare `assert d in (16, 32, 64, 128)` names nothing: its message is empty, and it fails.

HEAD_DIM_WORDS = re.compile(r"head[\s_-]?(dim|size)|\bd_?head\b|\bdim_?head\b", re.IGNORECASE)
DELIBERATE = ("AssertionError", "ValueError", "NotImplementedError")
SHAPE = re.compile(r"[\[(][^\[\]()]*,[^\[\]()]*[\])]")  # (2, 35, 48), [2, 35, 48]: a shape or a list
TRITON_REFUSALS = ("CompilationError", "InterpreterError")
TRITON_POWER_OF_TWO = "must be a power of 2"


def without_quoted_source(message: str) -> str:
    """The message without the source it quotes in backticks (a Triton error quotes the kernel's
    line: fa2_sandbox/runner/errors.py triton_place): the words of the student's code, a HEAD_DIM
    or a comment naming the GPU, say nothing of why it raised."""
    return re.sub(r"`[^`]*`", "``", message)


def names_head_dim(message: str, traceback: str, head_dim: int) -> bool:
    """Whether an error ("TypeName: first line", and its traceback) refuses `head_dim` (rule 2)."""
    message = without_quoted_source(message)
    kind, _, text = message.partition(": ")
    value = rf"(?<![\w.]){head_dim}(?![\w.])"
    if HEAD_DIM_WORDS.search(message) or re.search(rf"\b[dD]\s*(=|==|:)\s*{value}", text):
        return True
    if kind in DELIBERATE and re.search(value, SHAPE.sub("", text)):
        return True
    return kind in TRITON_REFUSALS and TRITON_POWER_OF_TWO in f"{message}\n{traceback}"


def refusal(reply, case, phase="forward"):
    """The message of the class refusing `case`'s head dim, or None (the rule above). `phase` is
    the check's: a backward check also takes the backward's own refusal."""
    if case.head_dim in POWER_OF_TWO_DIMS:
        return None
    if reply.raised and next(reversed(reply.phases), None) == "forward":
        error = {"message": reply.message, "traceback": reply.traceback}
    elif reply.ok and phase == "backward" and reply.result.get("backward_error"):
        error = reply.result["backward_error"]
    else:
        return None
    if names_head_dim(error["message"], error.get("traceback", ""), case.head_dim):
        return error["message"]
    return None


# -- a Triton class that needs a GPU -------------------------------------------------------------
#
# Without a GPU the Triton class runs under Triton's interpreter, on CPU tensors. Many classes
# cannot: they assert q.is_cuda (the official tests run the class on CUDA only), create tensors
# on "cuda", or call what the interpreter lacks. Such a class is not wrong, and only a GPU can
# judge it. The rule, on a machine without a GPU:
#
#   The class runs the course case (B=4, N=128, d=64, float32, non-causal) under the
#   interpreter, or it does not. It does not when that case raises an error of the machine:
#   one whose message, or the line that raised it, names CUDA, the GPU or NVIDIA ("assert
#   q.is_cuda", "Torch not compiled with CUDA enabled"), or that says the interpreter does
#   not support what the class called ("inline_asm not supported in interpreter mode").
#
# Where it does not, every check of the slot is "needs a GPU" (not graded here); where only the
# course case's backward raises such an error, the backward checks are. Where it does, every case
# is judged under the interpreter, as on a GPU: an error of another case, even one that names
# CUDA, is the class's own. So is any other error of the course case (a KeyError, a compile
# error): it fails as it would on a GPU, except in the course tier, whose checks are "not graded
# here" whatever the class raises there (settle), as the official tests skip the Triton class
# without a GPU. On a GPU none of this applies.

MACHINE_WORDS = re.compile(r"cuda|gpu|nvidia", re.IGNORECASE)
INTERPRETER_LACKS = re.compile(r"not supported in interpreter", re.IGNORECASE)


def raising_line(traceback: str) -> str:
    """The source line of the last frame of a formatted traceback: the line that raised."""
    lines = traceback.splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    return lines[frames[-1] + 1].strip() if frames and frames[-1] + 1 < len(lines) else ""


def machine_error(message: str, traceback: str) -> bool:
    """Whether an error ("TypeName: first line", and its traceback) is the machine's, not the
    class's: the rule above."""
    message = without_quoted_source(message)
    return bool(MACHINE_WORDS.search(message) or MACHINE_WORDS.search(raising_line(traceback))
                or INTERPRETER_LACKS.search(message))


def needs_gpu(session, submission, slot, phase="forward"):
    """What shows that the Triton class cannot be judged on this machine (the rule above), quoting
    its error, or None. `phase` is the check's: a backward check also takes the backward's error."""
    if slot != "triton" or session.on_gpu:
        return None
    reply, _ = run_case(session, submission, slot, COURSE_CASE)
    backward_error = (reply.result.get("backward_error") or {}) if reply.ok and phase == "backward" else {}
    course = "the course case, B=4, N=128, d=64, float32,"
    if reply.status == outcomes.ERROR and machine_error(reply.message, reply.traceback):
        return f"{course} raised {reply.message}"
    if backward_error.get("status") == outcomes.ERROR and \
            machine_error(backward_error["message"], backward_error.get("traceback", "")):
        return f"the backward of {course} raised {backward_error['message']}"
    return None


def not_here_if_needs_gpu(check, session, submission, slot, phase="forward"):
    """End `check` as not graded here where the class needs a GPU to be judged (needs_gpu)."""
    if why := needs_gpu(session, submission, slot, phase):
        check.not_here(f"it needs a GPU: the class does not run under the CPU's Triton interpreter ({why})")


def settle(check, session, submission, slot, tier, case, phase="forward"):
    """The reply and tensors of a case, or end the check the way the call went wrong. On a machine
    without a GPU, a Triton class that does not run there (needs_gpu) is not graded here."""
    session.fail_if_stub(check, submission, FLASH_SLOTS[slot])
    not_here_if_needs_gpu(check, session, submission, slot, phase)
    reply, tensors = run_case(session, submission, slot, case)
    if refused := refusal(reply, case, phase):
        check.ok(f"refused d={case.head_dim} cleanly, which the handout allows: {refused}")
        return None, None
    if (reply.raised or reply.crashed) and tier == "course" and slot == "triton" \
            and not session.on_gpu:
        check.not_here(f"it needs a GPU: the official tests run the Triton class on CUDA only, and under the CPU "
                   f"interpreter it {'raised ' if reply.raised else ''}{reply.message}")
    if check.record.check != "forward" and got_no_answer(reply):
        fail_unanswered(check, reply, f"{check.record.part}::forward[{case.id}]")
    check.settle_reply(reply)
    backward_error = (reply.result.get("backward_error") or {}) if phase == "backward" else {}
    if backward_error.get("status") == outcomes.NOT_ATTEMPTED:
        check.fail(f"not attempted: the backward raised {backward_error['message']}", outcome=outcomes.NOT_ATTEMPTED)
    if backward_error:
        check.fail(f"the backward raised {backward_error['message']}", backward_error.get("traceback", ""),
                   outcome=outcomes.ERROR)
    return reply, tensors


def what_failed(reply) -> str:
    """What went wrong in a flash call that measured nothing, as words that can follow "in float32 "
    (the memory check) or stand in parentheses (the replay check)."""
    if reply.ok:  # the forward ran; the backward raised
        return f"the backward raised {reply.result['backward_error']['message']}"
    if reply.raised:
        return f"the forward raised {reply.message}"
    if reply.timed_out:
        return f"the call {reply.message}"  # "timed out after 300 s in forward (N=...)"
    if reply.crashed:
        return f"the runner crashed: {reply.message}"
    if reply.not_attempted:
        return f"not attempted: {reply.message}"
    return reply.message  # the adapters did not import: their own sentence


# -- a check whose case never got an answer -------------------------------------------------------
#
# The forward check of a case fails for its call's failure (it raised, crashed or timed out). Every
# other check that reads the case's answer (the backward, hygiene, the memory and replay checks)
# fails too, as the official tests fail the backward when the forward raises, and no such check
# ever shares its points out (README.md, next to "could not be measured"); but its sentence says
# in plain words that its case got no answer and what happened to the call, rather than repeat the
# error as if it were its own. It names no other check: the check that made the call may not be on
# the student's page (advice cut by a time limit, a check never run, one hidden until the due date),
# so the record keeps its name (see_also) and the page links to it only where it is there.
def got_no_answer(reply) -> bool:
    """Whether a case's call raised, crashed or timed out (the adapters' import failing, or the
    template's stub, is every check's own finding)."""
    return reply.unanswered


def fail_unanswered(check, reply, cause: str, verb: str = "judge"):
    """Fail `check` for an answer its case never got, saying what happened to the case's call.
    `cause`: the check that made the call ("flash_pytorch::forward[<case>]"), for the page's link."""
    check.update(seconds=reply.seconds, see_also=cause)
    trace = traceback_of(reply)
    check.fail(f"no answer to {verb}: {what_failed(reply)}. This check needs the case's answer, so it fails with "
               f"it" + ("; the traceback is below." if trace else "."),
               trace, outcome=reply.outcome if not reply.ok else outcomes.ERROR)


def traceback_of(reply) -> str:
    """The traceback of what went wrong: the backward's where the forward ran."""
    if reply.ok:
        return (reply.result.get("backward_error") or {}).get("traceback", "")
    return reply.traceback
