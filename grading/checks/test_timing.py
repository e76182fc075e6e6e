"""Timing budgets (GPU only): the student's time over the reference's, same device, same session.

Each side runs in its own runner; the harness times the runner call from outside, between the
runner's 'timed' and 'saving' messages, over inputs rotated through fresh seeds, and judges the
outputs of the last timed call so that a cached answer fails.

Both sides first compile and autotune at once (one call each, not measured): one after the
other this was the longest test of a submission (notes/grading-speed.md). The measured calls, and
SDPA's beside them, then run in a window of the GPU's time (gpu_ledger.py): the other runners on
the GPU are paused, and their kernels already in flight finish first. In a class run without
it, SDPA's own time for this case varied many times over with the neighbours' kernels.
The two sides still take turns, call by call, so what drift is left weighs on both alike.
"""
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from fa2_sandbox.harness.client import PROJECT_ROOT, SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.harness.gpu_ledger import wait_for_idle_gpu
from fa2_sandbox.wire.cases import FLASH_SLOTS, FlashCase, make_inputs
from grading.checks.flash_checks import medians_ms, oracle_bytes
from reference.tolerance import judge_attention

JUDGED_BATCH = 2


def shard(params: dict, per_kernel: bool) -> str:
    """Each slot's timing in a runner of its own: its window measures nothing else."""
    return f"timing-{params['slot']}"


def last_seed(seed, budget):
    return seed + 1000 * (budget["repeats"] - 1) + budget["iters"] - 1


def reference_runner(grading) -> SubmissionRunner:
    """The runner of the reference solution, timed next to the student's, with the environment
    the grading plugin gives the student's runner (Grading.worker_env): the same GPU, so the
    ratio compares two kernels on one device, and the same thread budget. One per worker, kept
    from one timing check to the next (Grading.keep): the reference is the grader's own code, so
    no student's state can reach it, and a start of its own for each of a class's timing checks
    cost a runner start and its kernels' compiling every time."""
    def start():
        reference = load_submission(PROJECT_ROOT / "submissions" / "reference")
        return SubmissionRunner(reference, env=grading.worker_env(), import_timeout=grading.rubric.timeout("import"),
                                kept_kernels=grading.kept_kernels(reference.root, "timing"),
                                gpu_ledger=grading.gpu_ledger, dense_backward=False)
    return grading.keep("timing reference", start)


def judge_timed_outputs(c, grading, reply, case, request, budget):
    """Fail the check if the last timed call's outputs are wrong: a cached or replayed answer."""
    # Judged on the first JUDGED_BATCH batch rows: a cached or wrong answer shows there as well,
    # and the float64 oracle of all 64 would take gigabytes of GPU memory that workers share.
    rows = slice(0, JUDGED_BATCH)
    judged = replace(case, batch=(JUDGED_BATCH,))
    with grading.gpu_work(oracle_bytes(judged), f"the oracle of the timed {judged.id}"):
        q, k, v, do = make_inputs(case, last_seed(request["seed"], budget), "cuda")
        wrong = [v.reason for v in judge_attention({n: t[rows] for n, t in reply.tensors.items()}, q[rows], k[rows],
                                                   v[rows], do[rows], case.is_causal).values() if not v.ok]
    if wrong:
        c.fail("the outputs of the timed calls are wrong, so the time does not count.", "\n".join(wrong))


def window_bytes(case, warm_replies) -> int:
    """The GPU memory a timing window's calls need beside the runners it pauses (which keep
    theirs): what each side's warm-up call held at most (at least what a tiled class needs: the
    runner's word is only a hint), and a GiB for SDPA's tensors in this process (a quarter of that
    at the timing shape: eight tensors of 64 x 4096 x 64 in bf16). Not the whole budget, room for
    a dense backward that most classes do not have: with it, 23 GiB of a 47 GiB ledger, windows
    waited for memory that the runners they paused held."""
    tiled = case.gpu_budget_bytes(False)
    return sum(max(reply.gpu_peak, tiled) for reply in warm_replies) + (1 << 30)


def check_of(test: str, params: dict) -> tuple:
    """(part, check, tier) of a test of this module, known at collection (test_flash.check_of)."""
    return "timing", f"flash_{params['slot']}", "timing"


def warm_up(runner, request, timeout):
    """One call of one iteration: the runner's start, compiling and autotuning, unmeasured. Its
    reply is not read: a failure comes back again from the measured calls, and a timeout is
    remembered by the runner, which then fails those calls at once."""
    return runner.call({**request, "seeds": [request["seed"]]}, timeout)


def sdpa_median_ms(case, seed) -> float:
    """SDPA's forward+backward on the case's inputs, as (1, B, N, d): its flash backend takes 4-D
    inputs only. The peer every timing row shows: on an idle H100 it is the same in every row."""
    from triton.testing import do_bench
    q, k, v, do = (t.unsqueeze(0) for t in make_inputs(case, seed, "cuda"))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    return do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal)
                    .backward(do), return_mode="median")


@pytest.mark.parametrize("slot", ["triton", "pytorch"])
def test_budget(grading, submission, check, slot):
    budget = grading.rubric.budgets[f"flash_{slot}"]
    case = FlashCase(batch=(budget["batch"],), n_queries=budget["n"], n_keys=budget["n"], head_dim=budget["d"],
                     dtype=budget["dtype"], is_causal=budget["causal"])
    c = check("timing", f"flash_{slot}", case, "timing")
    if not grading.on_gpu:
        c.not_here("it needs a GPU: timing budgets are measured on CUDA")
    grading.fail_if_stub(c, submission, FLASH_SLOTS[slot])
    request = {"op": "time_flash", "slot": slot, "case": case.to_json(), "seed": grading.seed, "device": "cuda"}
    timeout = grading.rubric.timeout("timing")
    # Both runners start here, in this thread: a runner dies with the thread that started it
    # (launcher.py's PR_SET_PDEATHSIG), and the pool's threads end. The reference's only if the
    # student's adapters import.
    student = grading.runner(submission)
    if (failure := student.import_failure()) is not None:
        c.settle_reply(failure)
    reference = reference_runner(grading)
    reference.import_failure()
    with ThreadPoolExecutor(2) as pool:
        warm = list(pool.map(lambda runner: warm_up(runner, request, timeout), (student, reference)))
    with grading.gpu_ledger.window(window_bytes(case, warm), f"timing {submission.name} {slot}",
                                   say=student.note) as window:
        window["in_flight_s"] = wait_for_idle_gpu(torch.cuda.current_device())
        started = time.monotonic()
        (student_ms, reply), (reference_ms, ref_reply) = medians_ms((student, reference), request, timeout, budget)
        sdpa_ms = sdpa_median_ms(case, last_seed(request["seed"], budget)) if reply.ok else None
        window["measured_s"] = time.monotonic() - started
    c.settle_reply(reply)
    judge_timed_outputs(c, grading, reply, case, request, budget)
    if reference_ms is None:
        c.fail(f"the reference could not be timed here ({ref_reply.message}), so no budget applies.", outcome="error")
    ratio = student_ms / reference_ms
    # The window's own figures, for bench/grade_speed.py: how long it waited once both sides were
    # warm, for the kernels in flight, how many runners it paused and how long it measured.
    timing = {"student_ms": student_ms, "reference_ms": reference_ms, "sdpa_ms": sdpa_ms,
              "ratio": ratio, "budget": budget["ratio"], "window": {k: round(v, 2) for k, v in window.items()}}
    evidence = (f"student {student_ms:.3f} ms, reference {reference_ms:.3f} ms, SDPA {sdpa_ms:.3f} ms "
                f"(fwd+bwd, {case.id})")
    if ratio > budget["ratio"]:
        c.fail(f"forward+backward takes {ratio:.1f}x the reference's time, over the budget of {budget['ratio']:g}x.",
               evidence, timing=timing)
    c.ok(evidence, timing=timing)
