"""Timing budgets (GPU only): the student's time over the reference's, same device, same session.

Each side runs in its own runner; the harness times every forward+backward pass from outside, on
inputs drawn from fresh seeds, and judges the outputs of the last timed pass so that a cached
answer fails. How the passes are planned and timed, in a window of the GPU's time that pauses the
other runners for at most a few seconds whatever the student's speed: timed_window.py.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from fa2_sandbox.harness.client import PROJECT_ROOT, SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.harness.gpu_ledger import wait_for_idle_gpu
from fa2_sandbox.harness.watchdog import ahead_of_the_others, runner_pids
from fa2_sandbox.wire import outcomes, requests
from fa2_sandbox.wire.cases import FLASH_SLOTS, FlashCase, make_inputs
from grading.checks import timed_window as tw
from grading.checks.flash_checks import oracle_bytes, stored_as
from grading.tracks import Track, timing_track
from reference.tolerance import expected_attention, judge_attention

JUDGED_BATCH = 2


def track(params: dict, per_kernel: bool) -> Track:
    """Each slot's timing in a runner of its own: its window measures nothing else."""
    return timing_track(params["slot"])


def reference_runner(session) -> SubmissionRunner:
    """The runner of the reference solution, timed next to the student's, with the environment
    the grading plugin gives the student's runner (WorkerState.worker_env): the same GPU, so the
    ratio compares two kernels on one device, and the same thread budget. One per worker, kept
    from one timing check to the next (WorkerState.keep): the reference is the grader's own code, so
    no student's state can reach it, and a start of its own for each of a class's timing checks
    cost a runner start and its kernels' compiling every time. Started afresh, not forked: forked,
    its passes read longer in some windows of a class, and below their usual floor in
    others, which moved the ratios (notes/grading-speed.md, "forked timing runners measured and
    left out"); the students' own passes read the same either way. A call of it that timed out
    (on a busy machine) fails no later call: kept, it had failed every later submission's PyTorch
    budget on its worker as "not run" (notes/grading-speed.md, "the whole class, to its end")."""
    def start():
        reference = load_submission(PROJECT_ROOT / "submissions" / "reference")
        return SubmissionRunner(reference, env=session.worker_env(), import_timeout=session.rubric.timeout("import"),
                                kept_kernels=session.kept_kernels(reference.root, "timing"),
                                gpu_ledger=session.gpu_ledger, dense_backward=False, forked=False,
                                learns_timeouts=False)
    return session.keep("timing reference", start)


def judge_timed_outputs(c, session, reply, case):
    """Fail the check if the last timed pass's outputs are wrong: a cached or replayed answer. L is
    judged with its storage rounding forgiven, as in the flash checks (the handout asks no dtype)."""
    # Judged on the first JUDGED_BATCH batch rows: a cached or wrong answer shows there as well,
    # and the float64 oracle of all 64 would take gigabytes of GPU memory that workers share.
    rows = slice(0, JUDGED_BATCH)
    with session.gpu_work(oracle_bytes(replace(case, batch=(JUDGED_BATCH,))), f"the oracle of the timed {case.id}"):
        q, k, v, do = (t[rows] for t in make_inputs(case, reply.result["seed"], "cuda"))
        got = {n: t[rows] for n, t in reply.tensors.items()}
        oracle, baseline = expected_attention(q, k, v, do, case.is_causal)
        verdicts = judge_attention(got, q, k, v, do, case.is_causal, (oracle, stored_as(baseline, got)))
    if wrong := [v.reason for v in verdicts.values() if not v.ok]:
        c.fail("the outputs of the timed passes are wrong, so the time does not count.", "\n".join(wrong))


def window_bytes(case, warm_replies) -> int:
    """The GPU memory a timing window's calls need beside the runners it pauses (which keep
    theirs): what each side's warm-up call held at most (at least what a tiled class needs: the
    runner's word is only a hint), and a GiB for SDPA's tensors in this process (a quarter of that
    at the timing shape: eight tensors of 64 x 4096 x 64 in bf16). Not the whole allowance, room for
    a dense backward that most classes do not have: with it, 23 GiB of a 47 GiB ledger, windows
    waited for memory that the runners they paused held."""
    tiled = case.gpu_allowance_bytes(False)
    return sum(max(reply.gpu_peak, tiled) for reply in warm_replies) + (1 << 30)


def check_of(test: str, params: dict) -> tuple:
    """(part, check, tier) of a test of this module, known at collection (test_flash.check_of)."""
    return "timing", f"flash_{params['slot']}", "timing"


pytestmark = pytest.mark.grading(check_of=check_of, track=track)

def both(runners, asked, timeout, student_until=None):
    """One call on each runner at once (the requests `asked`), each in a thread of its own; their
    replies. `timeout`: the seconds of both calls, or a pair (the student's, the reference's);
    `student_until`: when the student's call ends whatever held it (SubmissionRunner.call)."""
    timeouts = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    untils = (student_until, None)
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda call: call[0].call(call[1], call[2], until=call[3]),
                             zip(runners, asked, timeouts, untils)))


def sdpa_peer(case, seed):
    """SDPA's forward+backward on the case's inputs, as (1, B, N, d) (its flash backend takes 4-D
    inputs only), run once: the peer every timing row shows, on a quiet GPU the same in every
    window. Drawn and run here, outside the window: a worker's first SDPA call loads its kernels.
    Returns the call, for `sdpa_median_ms` in the window."""
    import triton.testing  # noqa: F401  (imported here, outside the window)
    q, k, v, do = (t.unsqueeze(0) for t in make_inputs(case, seed, "cuda"))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def step():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case.is_causal).backward(do)
    step()
    return step


def sdpa_median_ms(step) -> float:
    """A short do_bench (10 ms of warm-up, 40 ms timed): the window's passes have just warmed the GPU."""
    from triton.testing import do_bench
    return do_bench(step, warmup=10, rep=40, return_mode="median")


@pytest.mark.parametrize("slot", ["triton", "pytorch"])
def test_budget(session, submission, check, slot):
    budget = session.rubric.budgets[f"flash_{slot}"]
    case = FlashCase(batch=(budget["batch"],), n_queries=budget["n"], n_keys=budget["n"], head_dim=budget["d"],
                     dtype=budget["dtype"], is_causal=budget["causal"])
    # The warm-up gets what the runners' start and import left of the limit: in a run of many
    # timing checks at once, a start, an import and a warm-up each given the whole limit held a worker
    # and the check queued behind it well past that limit (notes/grading-speed.md, "The timing-only run").
    began = time.monotonic()
    # Both runners start in this thread (a runner dies with the thread that started it: launcher.py's
    # PR_SET_PDEATHSIG), and side by side: the reference's is launched before check() starts the
    # student's. One after the other, two starts on a busy CPU took a large share of the limit.
    reference = reference_runner(session) if session.on_gpu else None
    if reference is not None and reference.process is None:
        reference.launch()
    c = check(case)
    if not session.on_gpu:
        c.not_here("it needs a GPU: timing budgets are measured on CUDA")
    session.fail_if_stub(c, submission, FLASH_SLOTS[slot])
    timeout = session.rubric.timeout("timing")
    student = session.runner(submission)
    if (failure := student.import_failure()) is not None:
        c.settle_reply(failure)
    reference.import_failure()
    runners = (student, reference)
    try:
        timing = measure_budget(c, session, submission, runners, slot, case, budget, timeout, began)
    finally:  # the prepared inputs left on the GPU go
        for runner in runners:
            if runner.process is not None:
                runner.call(requests.EndTiming(), timeout)
    judge_budget(c, budget, case, timing)


def measure_budget(c, session, submission, runners, slot, case, budget, timeout, began) -> dict:
    """Warm up and prepare both sides outside the window, time them in it, and judge the
    student's last outputs after it: the figures of the timing row (bench/grade_speed.py reads them).
    The warm-up ends `timeout` seconds after `began`, the check's start."""
    student, reference = runners
    # The student's warm-up ends `timeout` after the check began, whatever held it (its start, a
    # wait for the GPU, other checks' timing windows): credited with the windows' pauses, a cold
    # warm-up among many at a time ran far past the limit and held its worker's next check behind it
    # (notes/grading-speed.md, "The stall of a timing-only run, named and gone"). The
    # reference's own warm-up keeps the whole limit (its slowness is the grader's, never the student's).
    until = began + timeout
    warm_s = max(1.0, until - time.monotonic())
    warm = both(runners, [requests.WarmTiming(slot, case, session.seed, once_over_s=tw.WARM_ONCE_OVER_S)] * 2,
                (warm_s, timeout), student_until=until)
    if warm[0].timed_out:
        c.fail(f"its warm-up at the timing case ({case.id}: compiling, autotuning and a first forward+backward) "
               f"had not ended {timeout:.0f} s after the check began (its runner's start and import, and any wait "
               f"for the GPU, included), so no pass was timed; this advice check waits no longer, as the class's "
               f"other checks need the worker.", warm[0].message, outcome=outcomes.TIMEOUT, seconds=warm[0].seconds)
    c.settle_reply(warm[0])
    if not warm[1].ok:
        c.fail(f"the reference could not be timed here ({warm[1].message}), so no budget applies.",
               outcome=outcomes.ERROR)
    prepared = both(runners, [requests.PrepareTiming(slot, case, session.seed, n)
                              for n in (tw.MAX_PASSES, tw.REFERENCE_INPUTS)], timeout)
    c.settle_reply(prepared[0])
    if not prepared[1].ok:
        c.fail(f"the reference could not be timed here ({prepared[1].message}), so no budget applies.",
               outcome=outcomes.ERROR)
    sdpa = sdpa_peer(case, session.seed)
    # Raised: both runners, and this worker, whose thread stamps each stretch's end as the runner's
    # message comes (a stamp late by a few ms is a tenth of a stretch of 12 reference passes).
    # Before the window, not in it: finding their threads reads /proc while the others wait.
    timed = [os.getpid()] + [pid for runner in runners if (identity := runner.identity()) is not None
                             for pid in runner_pids(identity)]
    with ahead_of_the_others(timed) as raised, \
            session.gpu_ledger.window(window_bytes(case, warm), f"timing {submission.name} {slot}",
                                      say=student.note) as window:
        started = time.monotonic()
        (window["raised_threads"], window["real_time_threads"], window["real_time_refused"],
         window["raised_sessions"]) = raised
        window["in_flight_s"] = wait_for_idle_gpu(torch.cuda.current_device(), tw.IDLE_WAIT_S)
        m = tw.measure(student, reference, case, budget["ratio"], started + tw.WINDOW_S)
        time_left = started + tw.WINDOW_S - time.monotonic()
        sdpa_ms = sdpa_median_ms(sdpa) if m.stopped_after_s is None and time_left > tw.SDPA_S else None
        window["measured_s"] = time.monotonic() - started
    del sdpa
    ms = lambda values: round(tw.fastest(values), 3) if values else None  # noqa: E731
    timing = {"student_ms": ms(m.student_times),
              "reference_ms": ms(m.reference_ms), "sdpa_ms": sdpa_ms, "ratio": m.ratio, "budget": budget["ratio"],
              "student_passes": m.passes, "reference_passes": m.reference_passes,
              "student_stretches_ms": [round(t, 3) for t in m.student_ms],
              "reference_stretches_ms": [round(t, 3) for t in m.reference_ms],
              "reference_own_stretches": m.reference_own, "reference_rounds_before": m.reference_rounds_before,
              "first_ms": m.first_ms, "decided_early": m.decided_early, "stopped_after_s": m.stopped_after_s,
              "window": tw.window_record(window, m.steps), "student_chose": chosen_configs(warm[0])}
    c.update(timing=timing)  # kept whatever the verdict: the run's summary adds up the windows
    if m.failed == "student":
        c.settle_reply(m.failure)
    if m.failed == "reference":
        c.fail(f"the reference could not be timed here ({m.failure.message}), so no budget applies.",
               outcome=outcomes.ERROR)
    if m.stopped_after_s is None:
        outputs = student.call(requests.EndTiming(save=True), timeout)
        c.settle_reply(outputs)
        judge_timed_outputs(c, session, outputs, case)
    return timing


def chosen_configs(warm_reply) -> list:
    """What the student's autotuners chose in its warm-up (fa2_sandbox/runner/steady_autotune.py), as
    its runner said: kept so that runs can be compared, never judged."""
    chosen = warm_reply.result.get("chosen") if isinstance(warm_reply.result, dict) else None
    if not isinstance(chosen, list):
        return []
    return [{"kernel": str(c.get("kernel"))[:100], "config": str(c.get("config"))[:300]}
            for c in chosen[:16] if isinstance(c, dict)]


def against_budget(ratio, budget_ratio) -> str:
    """The time against its budget, in the direction it went: "7.9x the reference's time, over the
    budget of 3x by 4.9x" or "1.2x the reference's time, within the budget of 3x"."""
    if ratio is None:
        return ""
    if ratio > budget_ratio:
        return (f"{ratio:.2f}x the reference's time, over the budget of {budget_ratio:g}x by "
                f"{ratio - budget_ratio:.2f}x; ")
    return f"{ratio:.2f}x the reference's time, within the budget of {budget_ratio:g}x; "


def judge_budget(c, budget, case, timing):
    sdpa = f", SDPA {timing['sdpa_ms']:.3f} ms" if timing["sdpa_ms"] else ""
    ratio = None if timing["stopped_after_s"] is not None else timing["ratio"]
    evidence = (f"{against_budget(ratio, budget['ratio'])}student {timing['student_ms']} ms a pass "
                f"({timing['student_passes']} timed), reference {timing['reference_ms']} ms "
                f"({timing['reference_passes']} timed){sdpa} (fwd+bwd, {case.id}; the fastest of the stretches "
                f"between synchronizes)")
    if timing["stopped_after_s"] is not None:
        over = timing["stopped_after_s"] * 1000 / timing["reference_ms"]
        c.fail(f"one forward+backward pass had not finished after {timing['stopped_after_s']:.1f} s with the GPU to "
               f"itself, over {over:.0f}x the reference's {timing['reference_ms']} ms (the budget is "
               f"{budget['ratio']:g}x); timing stopped there so as not to hold the other checks.", evidence)
    if timing["decided_early"]:
        c.fail(f"its first timed forward+backward took {timing['first_ms']:.3f} ms, {timing['ratio']:.1f}x the "
               f"reference's: more than {tw.DECIDED:g} times the budget of {budget['ratio']:g}x, so no more passes "
               f"were timed.", evidence)
    if timing["ratio"] > budget["ratio"]:
        c.fail(f"forward+backward takes {timing['ratio']:.1f}x the reference's time, over the budget of "
               f"{budget['ratio']:g}x.", evidence)
    c.ok(evidence)
