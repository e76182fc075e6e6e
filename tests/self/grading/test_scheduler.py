"""The xdist scheduler of a grading run (grading/scheduler.py): loadgroup's order, timing tracks
spread and capped per GPU, and the queued tail of a track that proves slow shared with idle workers.

The unit tests drive the scheduler with fake workers that behave as xdist's do (xdist/remote.py):
each runs its tests in the order it got them, starts one only while holding the next (or once shut
down), and gives up asked-for tests only if all of them are still queued behind those two."""
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from fa2_sandbox.wire.cases import FlashCase
from grading import protocol
from grading.check import CheckIdentity, identify
from grading.scheduler import LARGE, GradingScheduling, later_half, spread_timing
from grading.tracks import Track

ROOT = Path(__file__).resolve().parents[3]
FLASH = "grading/checks/test_flash.py"


class Worker:
    """A fake xdist worker: what the scheduler sends it, and its queue."""

    def __init__(self, number: int, sent: list):
        self.gateway = SimpleNamespace(id=f"gw{number}")
        self.shutting_down = False
        self.queue = []  # indices not yet run; the first is running once `until` is set
        self.until = None  # when its running test ends
        self.took = None  # how long it takes
        self.ran = []
        self.asked = []  # steal requests not yet answered
        self._sent = sent  # every worker's sends, in order: (worker id, indices)

    def send_runtest_some(self, indices):
        self.queue += indices
        self._sent.append((self.gateway.id, list(indices)))

    def send_steal(self, indices):
        self.asked.append(list(indices))

    def shutdown(self):
        self.shutting_down = True

    def answer(self, indices) -> list:
        """xdist's steal: all the asked-for tests if all are still queued behind the running and the next one."""
        queued = self.queue[2:] if self.until is not None else self.queue[1:]
        if not all(i in queued for i in indices):
            return []
        self.queue = [i for i in self.queue if i not in indices]
        return indices


def fake_config(workers: int):
    return SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=False))


# node id -> CheckIdentity, as the workers send them to the controller, which gives them to the
# scheduler (ControllerPlugin.pytest_xdist_node_collection_finished). Ids are unique across tests.
IDENTITIES = {}


def nodeid_of(test: str, case: str, track: str, submission: str = "alice", size: int | None = None,
              kernel: str = "") -> str:
    """A flash check's xdist id, its identity noted in IDENTITIES: it shares its call with the other
    tests of its `case`, whose size is `size` and whose Triton kernel is `kernel`."""
    identity = CheckIdentity(check_id=f"grading.checks.test_flash::{test}[{submission}-{case}]",
                             submission=submission, track=Track(track), case=case, case_size=size, kernel=kernel)
    nodeid = f"{FLASH}::{test}[{submission}-{case}]@{identity.submission_track}"
    IDENTITIES[nodeid] = identity
    return nodeid


def pairs(track: str, cases: int, submission: str = "alice") -> list:
    """Forward and backward of `cases` cases of one track, as the plugin orders them."""
    return [nodeid_of(test, f"case{k}", track, submission)
            for k in range(cases) for test in ("test_forward", "test_backward")]


def timing(submission: str, slot: str = "triton") -> list:
    identity = CheckIdentity(check_id=f"grading.checks.test_timing::test_budget[{submission}-{slot}]",
                             submission=submission, track=Track(f"timing-{slot}"), case=slot)
    nodeid = f"grading/checks/test_timing.py::test_budget[{submission}-{slot}]@{identity.submission_track}"
    IDENTITIES[nodeid] = identity
    return [nodeid]


def start(collection: list, workers: int, **options):
    sent = []
    scheduler = GradingScheduling(fake_config(workers), identities=IDENTITIES, **options)
    nodes = [Worker(number, sent) for number in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes, sent


def run(scheduler, nodes, seconds, stop=None, now=0.0, logstart=False) -> float:
    """Run the class to its end as xdist would, each test taking seconds(nodeid); the time it took.
    With `stop`, until stop() is true (a steal asked for and not yet answered, say). With
    `logstart`, the scheduler hears of each test's start, as the controller passes it on, on the
    run's own clock."""
    collection = scheduler.collection
    clock = [now]
    if logstart:
        scheduler.clock = lambda: clock[0]
    while True:
        if stop is not None and stop():
            return now
        for node in nodes:
            while node.asked:
                scheduler.remove_pending_tests_from_node(node, node.answer(node.asked.pop(0)))
        for node in nodes:
            if node.until is None and node.queue and (len(node.queue) >= 2 or node.shutting_down):
                node.until, node.took = now + seconds(collection[node.queue[0]]), seconds(collection[node.queue[0]])
                if logstart:
                    scheduler.started(collection[node.queue[0]])
        busy = [node for node in nodes if node.until is not None]
        if not busy:
            break
        node = min(busy, key=lambda n: n.until)
        index, duration = node.queue.pop(0), node.took
        now, node.until = node.until, None
        clock[0] = now
        node.ran.append(index)
        scheduler.mark_test_complete(node, index, duration)
        if scheduler.tests_finished:  # dsession.triggershutdown
            for other in scheduler.nodes:
                other.shutdown()
    if stop is not None:
        raise AssertionError("the run ended before stop() was true")
    for node in nodes:  # each says it has finished (dsession.worker_workerfinished)
        assert node.shutting_down and not node.queue, (node.gateway.id, node.queue)
        assert scheduler.remove_node(node) is None
    return now


def ran_once(scheduler, nodes):
    counts = Counter(index for node in nodes for index in node.ran)
    assert sorted(counts) == list(range(len(scheduler.collection))) and set(counts.values()) == {1}


def tracks_sent(scheduler, sent) -> list:
    return [scheduler._split_scope(scheduler.collection[indices[0]]) for _, indices in sent]


# -- order --------------------------------------------------------------------------------------

def test_tracks_go_out_in_collection_order():
    collection = pairs("memory-triton", 2) + pairs("pytorch", 3) + pairs("distributed", 2) + pairs("triton", 2)
    scheduler, nodes, sent = start(collection, 2)
    run(scheduler, nodes, lambda nodeid: 1.0)
    assert tracks_sent(scheduler, sent) == ["alice/memory-triton", "alice/pytorch", "alice/distributed",
                                            "alice/triton"]
    ran_once(scheduler, nodes)
    assert scheduler.tests_finished and not scheduler.has_pending and not scheduler.steals


def test_a_track_goes_to_the_worker_about_to_be_idle_not_to_one_still_running_a_long_check():
    """x's forward runs 100 s. With the next track bound to its worker while that still ran (two
    tests left, loadscope's mark), z waited behind it, 121 s in all, while the other worker sat
    idle from 20 s: nothing of z had completed, so nothing of it could be stolen."""
    collection = pairs("triton-fp32-full", 1, "x") + pairs("pytorch", 1, "y") + pairs("pytorch", 1, "z")
    scheduler, nodes, sent = start(collection, 2)
    took = run(scheduler, nodes, lambda nodeid: 100.0 if "x-case0" in nodeid and "forward" in nodeid
               else 1.0 if "x-case0" in nodeid else 10.0)
    assert took == 101.0
    z = [scheduler.position[nodeid] for nodeid in pairs("pytorch", 1, "z")]
    assert [node.gateway.id for node in nodes if set(z) <= set(node.ran)] == ["gw1"]
    ran_once(scheduler, nodes)


def test_timing_tracks_are_spread_through_the_queue():
    keys = [(f"s{k}/pytorch", 0) for k in range(8)] + [(f"s{k}/timing-triton", 0) for k in range(4)]
    is_timing = lambda track: "timing" in track  # noqa: E731
    spread = [key[0] for key in spread_timing(keys, is_timing)]
    assert [k for k, track in enumerate(spread) if "timing" in track] == [1, 4, 7, 10]  # (j + 0.5) * 12 / 4
    assert [g for g in spread if "timing" in g] == [f"s{k}/timing-triton" for k in range(4)]  # their own order
    assert [g for g in spread if "timing" not in g] == [f"s{k}/pytorch" for k in range(8)]
    assert spread_timing(keys[8:], is_timing) == keys[8:]  # nothing else left: in order


def test_at_most_timing_per_gpu_timing_tracks_in_progress_on_a_gpu():
    # Two tracks and four timing tracks (last, as the plugin sorts them): the queue is
    # s0 timing, s0, s1 timing, s2 timing, s1, s3 timing (spread_timing).
    collection = pairs("pytorch", 2, "s0") + pairs("pytorch", 2, "s1") + [t for k in range(4) for t in timing(f"s{k}")]
    scheduler, nodes, sent = start(collection, 6, timing_per_gpu=2)
    first = {worker: track for (worker, _), track in zip(sent, tracks_sent(scheduler, sent))}
    # gw3 found two timing tracks in progress on its GPU, and took the next track that is not one;
    # gw4 found only timing tracks left, and took one all the same
    assert first == {"gw0": "s0/timing-triton", "gw1": "s0/pytorch", "gw2": "s1/timing-triton",
                     "gw3": "s1/pytorch", "gw4": "s2/timing-triton", "gw5": "s3/timing-triton"}

    # On two GPUs (workers round-robin, as session.WorkerState.worker_gpu pins them) gw3's GPU has none yet.
    scheduler, nodes, sent = start(collection, 6, gpus=2, timing_per_gpu=2)
    first = {worker: track for (worker, _), track in zip(sent, tracks_sent(scheduler, sent))}
    assert first["gw3"] == "s2/timing-triton" and first["gw4"] == "s1/pytorch"


def test_a_timing_track_waits_for_its_gpu_while_other_tracks_are_left():
    """Timing 50 s, other checks 1 s, one timing track at a time: the second waits for the first
    to end, while the workers take the tracks behind it."""
    collection = [t for k in range(3) for t in timing(f"s{k}")]
    collection = [test for k in range(6) for test in pairs("pytorch", 2, f"p{k}")] + collection
    scheduler, nodes, sent = start(collection, 3, timing_per_gpu=1)
    # p0, s0 timing and p1 went out, and p2 to gw1 behind its timing check
    assert [key[0] for key in scheduler.workqueue] == ["s1/timing-triton", "p3/pytorch", "p4/pytorch",
                                                       "s2/timing-triton", "p5/pytorch"]
    over = []

    def seconds(nodeid):
        if scheduler._timing_in_progress(0) > 1:  # only once nothing else is left
            over.append(any("timing" not in key[0] for key in scheduler.workqueue))
        return 50.0 if "timing" in nodeid else 1.0

    run(scheduler, nodes, seconds)
    order = tracks_sent(scheduler, sent)
    assert order.index("s1/timing-triton") > order.index("p5/pytorch")  # passed by every track behind it
    assert not any(over)
    ran_once(scheduler, nodes)


# -- sharing a slow track ----------------------------------------------------------------------

SLOW = "triton-bf16-causal"


def slow_and_quick():
    """gw0: a slow track (6 cases, forward and backward, 20 s a check); gw1: a track of 4 checks of 30 s."""
    return pairs(SLOW, 6) + [nodeid_of("test_forward", f"case{k}", "pytorch", "bob") for k in range(4)]


def seconds_of(nodeid):
    return 20.0 if SLOW in nodeid else 30.0


def test_a_slow_tracks_tail_is_stolen_by_an_idle_worker_and_completed_there():
    scheduler, nodes, sent = start(slow_and_quick(), 2)
    took = run(scheduler, nodes, seconds_of)
    # At 90 s gw1 is idle and gw0, four checks done, has six queued behind its two: 120 s. The later
    # three go, and case 4's forward with its backward.
    assert tuple(scheduler.steals[0]) == (f"alice/{SLOW}", "gw0", "gw1", 4, 120.0)
    assert scheduler.steals[0].line() == f"spread alice/{SLOW}: 4 of its checks from gw0 to gw1 (about 120 s left)"
    stolen = sent[2]
    assert stolen[0] == "gw1"
    assert [scheduler.shared_call(scheduler.collection[i]) for i in stolen[1]] == ["case4"] * 2 + ["case5"] * 2
    # At 140 s gw0 is idle in turn, with two of the checks it gave queued on gw1 (40 s): it takes case 5 back.
    assert [(s.victim, s.thief, s.count) for s in scheduler.steals[1:]] == [("gw1", "gw0", 2)]
    ran_once(scheduler, nodes)
    worker_of = {scheduler.collection[i]: node.gateway.id for node in nodes for i in node.ran}
    for k in range(6):  # forward and backward of a case ran where one runner call served both
        assert len({worker_of[nodeid_of(test, f"case{k}", SLOW)] for test in ("test_forward", "test_backward")}) == 1
    assert scheduler.tests_finished and not scheduler.has_pending
    assert took == 200.0  # against 240 s on gw0 alone


def slow_triton_class():
    """slow's Triton memory check (120 s) goes first, then eight quick submissions' PyTorch tracks
    (60 s each), then the Triton tracks: slow's two (one case each, whose forward's call takes
    200 s: no steal can split it) after quick0's (2 checks of 5 s)."""
    collection = [nodeid_of("test_no_score_matrix", "triton-forward", "memory-triton", "slow")]
    collection += [t for k in range(8) for t in pairs("pytorch", 1, f"quick{k}")]
    collection += pairs("triton-fp32-full", 1, "quick0")
    collection += pairs("triton-bf16-full", 1, "slow") + pairs("triton-bf16-causal", 1, "slow")
    return collection


def slow_triton_seconds(nodeid):
    if "slow" in nodeid:
        return 120.0 if "memory" in nodeid else 200.0 if "test_forward" in nodeid else 0.0
    return 30.0 if "pytorch" in nodeid else 5.0


def test_a_triton_check_that_runs_long_moves_its_submissions_triton_tracks_up():
    scheduler, nodes, sent = start(slow_triton_class(), 3)
    took = run(scheduler, nodes, slow_triton_seconds, logstart=True)
    order = tracks_sent(scheduler, sent)
    # A worker gets its next track when one check of it is left. At 60 s the memory check still
    # runs: slow's Triton tracks go next, in their own order, before quick5 to quick7's PyTorch tracks.
    assert order[:8] == ["slow/memory-triton"] + [f"quick{k}/pytorch" for k in range(5)] + \
        ["slow/triton-bf16-full", "slow/triton-bf16-causal"]
    assert scheduler.promotions == ["slow: 2 Triton track(s) moved to the head of the queue, since "
                                    "test_no_score_matrix[slow-triton-forward] had run 60 s"]
    ran_once(scheduler, nodes)
    # without the move, both of slow's Triton tracks wait behind every PyTorch track: 390 s, not 360
    unmoved, nodes, _ = start(slow_triton_class(), 3, promote_after_s=1e9)
    assert (took, run(unmoved, nodes, slow_triton_seconds, logstart=True)) == (360.0, 390.0)
    assert not unmoved.promotions


def test_a_later_move_to_the_head_of_the_queue_goes_behind_an_earlier_one():
    """first's memory check runs long, then second's: each moves its Triton tracks to the head of the
    queue, and second's go behind first's, still queued, not in front of them."""
    collection = [nodeid_of("test_no_score_matrix", "triton-forward", "memory-triton", name)
                  for name in ("first", "second")]
    collection += [t for k in range(4) for t in pairs("pytorch", 1, f"quick{k}")]
    collection += pairs("triton-bf16-full", 1, "first") + pairs("triton-bf16-causal", 1, "first")
    collection += pairs("triton-bf16-full", 1, "second")
    clock = [0.0]
    scheduler, nodes, sent = start(collection, 2, clock=lambda: clock[0])
    scheduler.started(collection[0])
    clock[0] = 10.0
    scheduler.started(collection[1])
    clock[0] = 60.0
    scheduler.started(collection[2])  # any event: first's check has run 60 s
    clock[0] = 70.0
    scheduler.started(collection[3])
    assert [line.split(":")[0] for line in scheduler.promotions] == ["first", "second"]
    assert [key[0] for key in scheduler.workqueue][:3] == ["first/triton-bf16-full", "first/triton-bf16-causal",
                                                           "second/triton-bf16-full"]


def test_only_the_triton_slot_running_long_moves_tracks():
    """A PyTorch check of a minute (a torch.compile'd slot's first case on the CPU) says nothing of
    the Triton slot; and a submission moves once."""
    collection = pairs("pytorch", 1, "compiled") + [t for k in range(3) for t in pairs("pytorch", 1, f"quick{k}")]
    collection += pairs("triton-bf16-full", 2, "compiled")
    scheduler, nodes, sent = start(collection, 2)
    run(scheduler, nodes, lambda nodeid: 90.0 if "compiled/pytorch" in nodeid else 30.0, logstart=True)
    assert not scheduler.promotions and not scheduler.slow
    assert tracks_sent(scheduler, sent)[-1] == "compiled/triton-bf16-full"

    scheduler, nodes, sent = start(slow_triton_class(), 3, promote_after_s=10.0)
    run(scheduler, nodes, slow_triton_seconds, logstart=True)
    assert len(scheduler.promotions) == 1 and scheduler.slow == {"slow"}


def kernel_cases(submission: str, kernels: list, sizes: list) -> list:
    """Forward and backward of a case of each size for each kernel, of one Triton track, smallest first."""
    cases = sorted((size, kernel) for kernel in kernels for size in sizes)
    return [nodeid_of(test, f"{kernel}-{size}", "triton-fp32-full", submission, size=size, kernel=kernel)
            for size, kernel in cases for test in ("test_forward", "test_backward")]


def test_a_slow_submissions_large_cases_go_to_a_part_of_their_own():
    """slow's memory check runs long: its Triton track moves up, and as no case of it has answered
    yet, its cases from the handout's size on go to a part of their own, smallest first, so that
    their runner begins its first one (which may wait out a timeout) without running the small
    ones first. The small ones stay, in order."""
    small, large = [1000, 2000, 4000], [LARGE, 2 * LARGE, 4 * LARGE]
    collection = [nodeid_of("test_no_score_matrix", "triton-forward", "memory-triton", "slow")]
    collection += [t for k in range(4) for t in pairs("pytorch", 1, f"quick{k}")]
    collection += kernel_cases("slow", ["k"], small + large)
    scheduler, nodes, sent = start(collection, 2, promote_after_s=60.0)
    run(scheduler, nodes, lambda nodeid: 120.0 if "memory" in nodeid else 30.0 if "slow" in nodeid else 20.0,
        logstart=True)
    ran_once(scheduler, nodes)
    assert scheduler.promotions[1] == "slow/triton-fp32-full: split into 2 parts: 6 checks of k"
    ran_by = {scheduler.collection[i]: node.gateway.id for node in nodes for i in node.ran}
    sizes_on = {}
    for nodeid in collection[9:]:
        sizes_on.setdefault(ran_by[nodeid], []).append(scheduler.case_size(nodeid))
    assert sorted(sizes_on.values()) == [[s for s in small for _ in "fb"], [s for s in large for _ in "fb"]]


def test_a_slow_submissions_kernels_compile_side_by_side_once_a_case_answered():
    """Once a case of the submission answered well inside the flash timeout, the queued checks of
    the kernels its running track has not begun, no larger than that case, go to the head of the
    queue, a part per kernel, and idle workers compile them side by side. A larger case stays."""
    huge = nodeid_of("test_forward", "huge", "triton-fp32-full", "slow", size=9000, kernel="c")
    collection = kernel_cases("slow", ["a", "b", "c"], [1000, 2000]) + [huge]
    collection += [t for k in range(6) for t in pairs("pytorch", 1, f"quick{k}")]
    scheduler, nodes, sent = start(collection, 3, promote_after_s=50.0, flash_timeout_s=300.0)
    scheduler.answered(collection[0], 299.0)  # past two thirds of the timeout: proves nothing
    scheduler.answered(nodeid_of("test_forward", "x", "pytorch", "slow", size=5000, kernel="a"), 1.0)  # not Triton
    assert scheduler.proven == {}
    scheduler.answered(nodeid_of("test_forward", "other", "triton-bf16-full", "slow", size=2000, kernel="z"), 5.0)
    assert scheduler.proven == {"slow": 2000}
    memory = nodeid_of("test_no_score_matrix", "triton-forward", "memory-triton", "fast")
    scheduler.answered(memory, 20.0)  # the slot's memory case at N = 16384 answered
    assert scheduler.proven["fast"] == 16384 * 16384 * 64
    compiled = set()

    def seconds(nodeid):  # a kernel's first case compiles it: 100 s; the quick tracks' checks 20 s
        if "quick" in nodeid:
            return 20.0
        first = scheduler.kernel(nodeid) not in compiled
        compiled.add(scheduler.kernel(nodeid))
        return 100.0 if first else 10.0

    run(scheduler, nodes, seconds, logstart=True)
    ran_once(scheduler, nodes)
    ran_by = {scheduler.collection[i]: node.gateway.id for node in nodes for i in node.ran}
    workers = {kernel: {ran_by[n] for n in collection if scheduler.kernel(n) == kernel and "huge" not in n}
               for kernel in "abc"}
    assert all(len(w) == 1 for w in workers.values()) and len(set.union(*workers.values())) == 3
    assert ran_by[huge] == ran_by[collection[0]]  # 9000 is larger than any case answered: it stays
    assert scheduler.promotions == ["slow/triton-fp32-full: from gw0 to the head of the queue, 2 part(s): "
                                    "4 checks of b, 4 checks of c"]


def test_a_slow_submissions_largest_kernel_goes_first():
    """The parts of a slow submission's kernels go out largest case first: the kernel whose part
    came last (a d128 kernel, compiling for minutes) ended its class minutes after the rest."""
    collection = kernel_cases("slow", ["a"], [1000]) + kernel_cases("slow", ["d16"], [1000, 2000])
    collection += kernel_cases("slow", ["d64"], [1000, 4000]) + kernel_cases("slow", ["d128"], [1000, 8000])
    collection += [t for k in range(6) for t in pairs("pytorch", 1, f"quick{k}")]
    scheduler, nodes, sent = start(collection, 2, promote_after_s=50.0, flash_timeout_s=300.0)
    scheduler.answered(nodeid_of("test_forward", "other", "triton-bf16-full", "slow", size=8000, kernel="z"), 5.0)
    run(scheduler, nodes, lambda nodeid: 20.0 if "quick" in nodeid else 100.0, logstart=True)
    ran_once(scheduler, nodes)
    assert scheduler.promotions == ["slow/triton-fp32-full: from gw0 to the head of the queue, 3 part(s): "
                                    "4 checks of d128, 4 checks of d64, 4 checks of d16"]


def test_an_autotuning_submissions_largest_kernels_go_to_the_head_of_the_queue():
    """Its runner's facts say its Triton slot autotuned (after its memory check answered): the part of
    each queued Triton track's largest kernel goes to the head of the queue, and the rest of the
    track keeps its place. Without a case answered in time, nothing moves; a submission moves once."""
    memory = nodeid_of("test_no_score_matrix", "triton-forward", "memory-triton", "tuner")
    collection = [memory] + [t for k in range(4) for t in pairs("pytorch", 1, f"quick{k}")]
    collection += kernel_cases("tuner", ["a"], [1000]) + kernel_cases("tuner", ["d64"], [2000])
    collection += kernel_cases("tuner", ["d128"], [4000])
    scheduler, nodes, sent = start(collection, 2, flash_timeout_s=300.0)
    scheduler.autotuned("tuner")  # before any case answered: its kernels are untried
    assert not scheduler.promotions and list(scheduler.workqueue)[-1] == ("tuner/triton-fp32-full", 0)

    scheduler, nodes, sent = start(collection, 2, flash_timeout_s=300.0)
    scheduler.answered(memory, 10.0)
    scheduler.autotuned("tuner")
    scheduler.autotuned("tuner")
    assert scheduler.promotions == ["tuner: its Triton slot autotunes: its largest kernels to the head of the "
                                    "queue, 2 checks of d128"]
    queue = list(scheduler.workqueue)
    assert queue[0] == ("tuner/triton-fp32-full", 1) and queue[-1] == ("tuner/triton-fp32-full", 0)
    assert [scheduler.kernel(n) for n in scheduler.workqueue[queue[-1]]] == ["a", "a", "d64", "d64"]
    run(scheduler, nodes, lambda nodeid: 10.0)
    ran_once(scheduler, nodes)


def test_the_controller_tells_the_scheduler_of_a_runner_that_autotuned():
    from grading.controller import ControllerPlugin

    told = []
    plugin = SimpleNamespace(scheduler=SimpleNamespace(autotuned=told.append))
    for facts in ({"submission": "alice", "autotunes": True}, {"submission": "bob"}, None):
        ControllerPlugin.tell_autotuned(plugin, facts)
    assert told == ["alice"]


def test_forward_and_backward_of_a_case_move_together():
    unit = dict.fromkeys(pairs(SLOW, 4), False)
    tests = list(unit)
    # queued behind the two running: case 1 to case 3; the later half (3 of 5) cuts case 2 in two
    shared_call = lambda nodeid: IDENTITIES[nodeid].shared_call  # noqa: E731
    assert later_half(unit, tests[3:], shared_call) == tests[4:]
    assert later_half(unit, tests[2:], shared_call) == tests[4:]
    # case 1's forward is running (the victim has its reply): its backward stays with it
    assert later_half(unit, tests[3:4], shared_call) == []


def test_a_checks_identity_comes_from_its_parameters():
    """Forward and backward of a case share its call; a test with no parameter but its submission
    shares none; the case's size is the one the runner's timeouts compare (FlashCase.work)."""
    alice, case = SimpleNamespace(name="alice"), FlashCase(batch=(2,), n_queries=113, n_keys=203, head_dim=64)

    def item(test, **params):
        return SimpleNamespace(name=f"{test}[...]", module=SimpleNamespace(__name__="grading.checks.test_flash"),
                               callspec=SimpleNamespace(params={"submission": alice, **params}))

    forward = identify(item("test_forward", slot="triton", tier="bf16", case=case), Track(SLOW))
    backward = identify(item("test_backward", slot="triton", tier="bf16", case=case), Track(SLOW))
    assert forward.shared_call == backward.shared_call == f"triton-bf16-{case.id}"
    assert forward.case_size == 2 * 113 * 203 * 64 and forward.submission_track == f"alice/{SLOW}"
    alone = identify(item("test_ddp_bucketing"), Track("distributed"))
    assert alone.shared_call == alone.check_id == "grading.checks.test_flash::test_ddp_bucketing[...]"
    assert alone.case_size is None
    assert CheckIdentity.from_json(forward.to_json()) == forward
    # a test the controller has no identity of (not a grading test) shares nothing and keeps loadgroup's track
    scheduler, _, _ = start(pairs("pytorch", 1), 1)
    assert scheduler.shared_call("tests/test_x.py::test_y[a@b]") == "tests/test_x.py::test_y[a@b]"
    assert scheduler.case_size("tests/test_x.py::test_y[a@b]") is None


def test_a_worker_never_given_a_track_waits_to_share_one():
    """More workers than tracks: the spare one stays up (it holds no test back) and takes half of a
    slow track once it has proved slow."""
    scheduler, nodes, sent = start(pairs(SLOW, 6), 2)
    assert not nodes[1].shutting_down and not nodes[1].queue
    run(scheduler, nodes, seconds_of)
    assert [(s.victim, s.thief) for s in scheduler.steals][:1] == [("gw0", "gw1")]
    ran_once(scheduler, nodes)


def test_no_steal_before_a_check_of_the_track_has_completed():
    # the slow track's first check takes 1000 s: when gw1 runs out it has proved nothing
    scheduler, nodes, sent = start(slow_and_quick(), 2)
    run(scheduler, nodes, lambda nodeid: 1000.0 if nodeid == scheduler.collection[0] else seconds_of(nodeid))
    assert not scheduler.steals and not nodes[1].ran[4:]
    ran_once(scheduler, nodes)


def test_after_a_timeout_only_the_tracks_smaller_cases_are_shared():
    # A track of cases in no order of size; its 1024-long case timed out: the victim's runner fails
    # every case at least that large at once, so only the smaller ones are worth a thief's runner.
    sizes = [17, 1024, 2048, 33, 4096, 65, 129, 257]
    cases = [f"bf16-{n}x{n}-d64-causal" for n in sizes]
    collection = [nodeid_of("test_forward", case, SLOW, size=n * n * 64) for n, case in zip(sizes, cases)] + \
        [nodeid_of("test_forward", f"case{k}", "pytorch", "bob") for k in range(6)]
    scheduler, nodes, sent = start(collection, 2)
    scheduler.timed_out(nodeid_of("test_forward", cases[1], SLOW, size=1024 * 1024 * 64))
    assert scheduler.smaller_than == {f"alice/{SLOW}": 1024 * 1024 * 64}
    run(scheduler, nodes, lambda nodeid: 40.0 if SLOW in nodeid else 10.0)
    stolen = [scheduler.collection[i] for i in nodes[1].ran if SLOW in scheduler.collection[i]]
    assert stolen and all(scheduler.case_size(nodeid) < 1024 * 1024 * 64 for nodeid in stolen)
    ran_once(scheduler, nodes)


def test_a_check_running_most_of_the_timeout_is_shared_around_as_timed_out():
    """A 1024-long case runs 400 s from 40 s on: when the other worker runs out, at 300 s, it has run
    past two thirds of a 300 s flash timeout, so the track's cases at least that large stay with its
    runner, which fails them at once should it time out, and only the smaller ones are shared.
    Without logstart (no check known to be running) the victim's larger cases go to the thief."""
    sizes = [17, 1024, 33, 2048, 65, 4096, 129, 8192, 257, 16384]
    cases = [f"bf16-{n}x{n}-d64-causal" for n in sizes]
    collection = [nodeid_of("test_forward", case, SLOW, size=n * n * 64) for n, case in zip(sizes, cases)] + \
        [nodeid_of("test_forward", f"case{k}", "pytorch", "bob") for k in range(30)]

    def seconds(nodeid):
        return 400.0 if cases[1] in nodeid else 40.0 if SLOW in nodeid else 10.0

    def stolen_sizes(logstart):
        scheduler, nodes, sent = start(collection, 2, promote_after_s=1e9, flash_timeout_s=300.0)
        run(scheduler, nodes, seconds, logstart=logstart)
        ran_once(scheduler, nodes)
        assert scheduler.steals
        return {scheduler.case_size(scheduler.collection[i]) for i in nodes[1].ran if SLOW in scheduler.collection[i]}

    assert max(stolen_sizes(logstart=True)) < 1024 * 1024 * 64
    assert max(stolen_sizes(logstart=False)) > 1024 * 1024 * 64


def test_a_timeout_of_a_check_without_a_size_keeps_its_track_whole():
    scheduler, nodes, sent = start(slow_and_quick(), 2)
    scheduler.timed_out(nodeid_of("test_forward", "case0", SLOW))  # no flash case among its parameters
    run(scheduler, nodes, seconds_of)
    assert not scheduler.steals
    ran_once(scheduler, nodes)


def test_no_steal_below_the_threshold_and_the_idle_worker_is_shut_down():
    scheduler, nodes, sent = start(slow_and_quick(), 2, steal_min_s=121)
    shut = []
    original = nodes[1].shutdown
    nodes[1].shutdown = lambda: (shut.append(len(nodes[1].ran)), original())
    run(scheduler, nodes, seconds_of)
    assert not scheduler.steals
    assert shut[0] == 3  # idle at 90 s, its last check held back, nothing worth 121 s: shut down, so it runs
    ran_once(scheduler, nodes)


def test_a_track_that_timed_out_shares_only_smaller_cases(tmp_path):
    """The controller's plugin tells the scheduler the case of a check that timed out; not of one
    that --time-limit cut, which ran no call."""
    from grading import time_limit
    from grading.controller import ControllerPlugin
    from grading.durations import Durations
    from grading.results.record import CheckRecord

    scheduler, nodes, sent = start(slow_and_quick(), 2)
    plugin = SimpleNamespace(collected={"alice": set()}, scheduler=scheduler, durations=Durations(),
                             state=SimpleNamespace(reports=tmp_path), count_done=lambda name: None, clock={},
                             tell_autotuned=lambda facts: None)
    cut = time_limit.cut_diagnosis(300, 301)
    for outcome, track, case, diagnosis in (("passed", "pytorch", "bf16-113x203-d64-causal", ""),
                                            ("timeout", SLOW, "bf16-17x17-d64-causal", cut),
                                            ("timeout", SLOW, "bf16-113x203-d64-causal", "timed out after 300 s")):
        size = 113 * 203 * 64 if "113" in case else 17 * 17 * 64
        record = CheckRecord(submission="alice", part="flash_triton", check="forward", case=case, outcome=outcome,
                             diagnosis=diagnosis)
        report = SimpleNamespace(nodeid=nodeid_of("test_forward", case, track, size=size), when="call",
                                 duration=1.0, start=1.0, stop=2.0,
                                 user_properties=[(protocol.SUBMISSION, "alice"), (protocol.CHECK, record.to_json())])
        ControllerPlugin.pytest_runtest_logreport(plugin, report)
    assert scheduler.smaller_than == {f"alice/{SLOW}": 113 * 203 * 64}


def test_a_steal_that_came_too_late():
    """The victim had started some of the asked-for tests: it answers with none, they stay there,
    and the idle worker asks again."""
    scheduler, nodes, sent = start(slow_and_quick(), 2)
    victim = nodes[0]
    now = run(scheduler, nodes, seconds_of, stop=lambda: victim.asked)
    assert now == 90.0 and not scheduler.tests_finished  # a steal in flight
    victim.asked.clear()
    scheduler.remove_pending_tests_from_node(victim, [])
    assert not scheduler.steals and len(victim.asked) == 1  # asked again at once
    run(scheduler, nodes, seconds_of, now=now)
    assert len(scheduler.steals) >= 1
    ran_once(scheduler, nodes)


def test_a_victim_that_dies_with_a_steal_in_flight():
    """Its undone tests go back to the queue (loadscope), its late answer changes nothing, and
    another worker runs them."""
    collection = slow_and_quick() + pairs("pytorch", 1, "carol")
    scheduler, nodes, sent = start(collection, 3)
    victim, quick, spare = nodes
    run(scheduler, nodes, seconds_of, stop=lambda: victim.asked)  # at 30 s, gw2 has run carol's forward
    assert scheduler.requests[victim].thief is spare
    assert scheduler.remove_node(victim) == collection[1]  # it died running its second check
    assert not scheduler.requests
    scheduler.remove_pending_tests_from_node(victim, victim.answer(victim.asked.pop()))
    assert not scheduler.steals
    run(scheduler, [quick, spare], seconds_of, now=30.0)
    done = Counter(index for node in nodes for index in node.ran)
    assert sorted(done) == list(range(len(collection))) and set(done.values()) == {1}


# -- a grading run -----------------------------------------------------------------------------

STEAL_AT_ONCE = '''
import json
import os

import pytest

import grading.scheduler
from grading.controller import ControllerPlugin

grading.scheduler.STEAL_MIN_S = 0.0  # any track with a completed check and a queued one is shared


@pytest.hookimpl(trylast=True)  # after the controller's plugin read the worker's identities
def pytest_xdist_node_collection_finished(node, ids):
    plugin = next(p for p in node.config.pluginmanager.get_plugins() if isinstance(p, ControllerPlugin))
    with open(os.environ["IDENTITIES_OUT"], "a") as out:
        out.write(json.dumps({i: plugin.identities[i].to_json() if i in plugin.identities else None
                              for i in ids}) + "\\n")
'''


def test_a_class_graded_under_xdist_with_the_scheduler(tmp_path):
    """The reference alone, 12 quick PyTorch checks, `-n 2`: the spare worker takes part of them (the
    threshold made 0 for the test), every check runs once, and the summary says what was spread."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "steal_at_once.py").write_text(STEAL_AT_ONCE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    env["IDENTITIES_OUT"] = str(tmp_path / "identities.jsonl")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "steal_at_once",
                           "-n", "2", "--impl=submissions/reference", f"--reports={tmp_path / 'reports'}",
                           "-k", "pytorch and fp32 and (17x17 or 113x203 or 128x217) and not replay"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "12 passed" in output, output[-4000:]
    spread = [line for line in output.splitlines() if line.startswith("spread reference: ")]
    assert len(spread) >= 1 and " of its checks from gw" in spread[0], output[-4000:]
    # Each worker's ids reached the controller with their identities, each id (xdist's, "@group"
    # and all) with its own test's: forward and backward of each of the 6 cases share a call.
    seen = [json.loads(line) for line in (tmp_path / "identities.jsonl").read_text().splitlines()]
    assert len(seen) == 2 and seen[0] == seen[1] and len(seen[0]) == 12
    identities = [CheckIdentity.from_json(data) for data in seen[0].values()]
    for nodeid, identity in zip(seen[0], identities):
        assert nodeid == f"{FLASH}::{identity.check_id.partition('::')[2]}@{identity.submission_track}", nodeid
    assert {i.submission for i in identities} == {"reference"}
    assert len({i.shared_call for i in identities}) == 6 and all(i.case_size for i in identities)
