"""A runner call on a shared GPU (client.py call_on_gpu, serve.py out_of_memory), with a fake allowance:
an out-of-memory error is charged to the student only when the call's own allowance ran out."""
import threading
import time
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.client import PROJECT_ROOT, GpuCrowded, Reply, SubmissionRunner, call_on_gpu
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.harness.gpu_ledger import GpuLedger
from fa2_sandbox.harness.watchdog import runner_identity, runner_pids
from fa2_sandbox.runner.serve import out_of_memory
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Distributed, Flash, WarmTiming

# The caching allocator's message, as torch words it (c10/cuda/CUDACachingAllocator.cpp).
REFUSED_AT_BUDGET = ("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
                     "which 50.12 GiB is free. Including non-PyTorch memory, this process has 3.10 GiB memory in "
                     "use. 4.91 GiB allowed; Of the allocated memory 2.50 GiB is allocated by PyTorch, and 100.00 MiB "
                     "is reserved by PyTorch but unallocated.")
REFUSED_DEVICE_FULL = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
                       "which 1.06 GiB is free. Including non-PyTorch memory, this process has 1.20 GiB memory in "
                       "use. 19.00 GiB allowed; Of the allocated memory 512.00 MiB is allocated by PyTorch.")


class OutOfMemory(RuntimeError):
    pass


@pytest.mark.parametrize("message, why", [
    (REFUSED_AT_BUDGET, "gpu_allowance"),  # 3.1 + 4 GiB passes the 4.91 allowed, with 50 GiB free
    (REFUSED_DEVICE_FULL, "gpu_full"),  # 1.2 + 2 GiB is well within 19 allowed; 1.06 GiB free
    (REFUSED_DEVICE_FULL.replace("1.06 GiB is free", "3.00 GiB is free"), "gpu_allowance"),  # the room was there
    ("CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA`", "gpu_full"),  # cuBLAS, a launch: the device's
    ("std::bad_alloc: Cannot allocate memory", "host"),
    ("index 3 is out of bounds", None),
])
def test_an_allocation_failure_says_whose_it_was(message, why):
    assert out_of_memory(OutOfMemory(message)) == why


class FakeCall:
    """A runner call that answers from a list, noting whether the ledger held the GPU alone then."""

    def __init__(self, ledger, replies):
        self.ledger, self.replies, self.seen = ledger, list(replies), []

    def __call__(self, holding):
        holders = self.ledger.holders().values()
        alone = any(h["kind"] == "alone" for h in holders)
        self.seen.append("alone" if alone else "shared")
        return self.replies.pop(0)


def oom(why):
    return Reply("crash", f"ran out of GPU memory during backward: OutOfMemoryError: {why}", oom=why)


@pytest.fixture
def ledger(tmp_path):
    return GpuLedger(tmp_path / "gpu-all-0.json", 10 << 30)


def test_a_call_runs_with_its_budget_reserved(ledger):
    call = FakeCall(ledger, [Reply("ok")])
    assert call_on_gpu(ledger, call, 3 << 30, "alice", print).ok
    assert call.seen == ["shared"]
    assert ledger.holders() == {}


def test_the_students_own_budget_running_out_is_their_crash(ledger):
    call = FakeCall(ledger, [oom("gpu_allowance")])
    reply = call_on_gpu(ledger, call, 3 << 30, "alice", print)
    assert reply.status == "crash" and len(call.seen) == 1


def test_a_full_device_is_never_the_students_crash_the_call_runs_again_alone(ledger):
    notes = []
    call = FakeCall(ledger, [oom("gpu_full"), Reply("ok")])
    assert call_on_gpu(ledger, call, 3 << 30, "alice", notes.append).ok
    assert call.seen == ["shared", "alone"]
    assert any("running the call again with the GPU to itself" in n for n in notes)


def test_a_call_first_reserves_what_a_tiled_class_needs_and_the_whole_budget_only_if_the_device_is_full(ledger):
    """The allowance has room for N x N scores that few classes hold: reserving it whole for every
    call filled the ledger while the card sat half empty. The runner is still held to the whole
    allowance; only a full device makes the call run again, then with the allowance reserved."""
    held = []

    def call(holding):
        held.append(sum(h["bytes"] for h in ledger.holders().values()))
        return oom("gpu_full") if len(held) == 1 else Reply("ok")

    notes = []
    assert call_on_gpu(ledger, call, 8 << 30, "alice", notes.append, reserve=2 << 30).ok
    assert held == [2 << 30, 8 << 30]
    assert any("with 2.0 GiB reserved" in n for n in notes)


def test_a_device_full_even_alone_is_the_graders_fault(ledger):
    call = FakeCall(ledger, [oom("gpu_full"), oom("gpu_full")])
    with pytest.raises(GpuCrowded, match="even with no other check on it"):
        call_on_gpu(ledger, call, 3 << 30, "alice", print)
    assert ledger.holders() == {}


def test_only_flash_calls_on_cuda_have_a_budget_and_only_a_students_has_room_for_scores():
    student = SimpleNamespace(dense_backward=True)
    reference = SimpleNamespace(dense_backward=False)
    case = FlashCase(batch=(64,), n_queries=4096, n_keys=4096)
    assert SubmissionRunner.gpu_allowance(student, WarmTiming("triton", case, seed=1)) == 19 << 30
    assert SubmissionRunner.gpu_allowance(reference, WarmTiming("triton", case, seed=1)) == 3 << 30
    assert SubmissionRunner.gpu_allowance(student, Flash("triton", case, seed=1, device="cpu")) is None
    assert SubmissionRunner.gpu_allowance(student, Distributed("ddp", seed=1)) is None


HANG = PROJECT_ROOT / "submissions" / "hostile" / "hang_python_loop"


def test_a_paused_call_gets_its_pause_back_and_a_hung_one_still_times_out(tmp_path):
    """A timing window stops the runners of the calls beside it (gpu_ledger.py). The paused time is
    not the student's: the call's deadline moves by as much. A call that hangs for real still times
    out once its own time is spent, and the runner's watchdog, running all along, kills nothing."""
    path = tmp_path / "gpu-all-0.json"
    runner = SubmissionRunner(load_submission(HANG), env={"TRITON_INTERPRET": "1"})
    request = Flash("pytorch", FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16), seed=1)
    states = []

    def window():
        while not runner.phases.get("forward"):  # the runner is inside the student's endless loop
            time.sleep(0.05)
        with GpuLedger(path, 10 << 30).window(1 << 30, "timing") as held:
            time.sleep(0.5)
            states.extend(process_state(pid) for pid in runner_pids(runner_identity(runner.process, runner.uid)))
            time.sleep(3.5)
            states.append(held["paused"])

    try:
        assert runner.import_failure() is None
        thread = threading.Thread(target=window)
        thread.start()
        started = time.monotonic()
        reply = call_on_gpu(GpuLedger(path, 10 << 30), lambda holding: runner._call(request, 3, "16x16", holding),
                            1 << 30, "hang", runner.note, runner=runner.identity)
        elapsed = time.monotonic() - started
        thread.join()
    finally:
        runner.close()
    assert states and set(states[:-1]) == {"T"} and states[-1] == 1  # every process of the runner stopped
    assert reply.status == "timeout", reply
    assert elapsed >= 3 + 3.5  # its 3 s, plus the 4 s it stood still (less the time to enter the loop)


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_distributed_calls_hold_no_reservation_so_no_window_pauses_them():
    """The distributed checks' ranks talk to each other over gloo with their own timeouts: a window
    that stopped one rank would stall the others. Only flash calls on CUDA reserve, so only their
    runners are ever paused."""
    runner = SimpleNamespace(dense_backward=True)
    case = FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16)
    assert SubmissionRunner.gpu_allowance(runner, Distributed("ddp", seed=1)) is None
    assert SubmissionRunner.gpu_allowance(runner, Flash("pytorch", case, seed=1, device="cpu")) is None
    assert SubmissionRunner.gpu_allowance(runner, Flash("pytorch", case, seed=1, device="cuda")) > 0


def test_a_case_past_a_timeout_fails_at_once_without_starting_the_runner_again(ledger):
    """A timeout stops the runner; the larger cases of its family fail at once with that timeout's
    message. On a GPU they must do so before the runner would be started for the reservation."""
    runner = SubmissionRunner.__new__(SubmissionRunner)
    runner.submission = SimpleNamespace(problem=None, name="alice")
    runner.gpu_ledger, runner.dense_backward = ledger, True
    runner.process, runner.ready = None, {}
    small, large = (FlashCase(batch=(1,), n_queries=n, n_keys=n, head_dim=16) for n in (16, 64))
    runner._timed_out = {("flash", "triton", True): (small.work, "timed out after 1 s in forward")}
    runner.start = lambda: pytest.fail("the runner was started for a case that cannot run")
    reply = runner.call(Flash("triton", large, seed=1, device="cuda"), 1)
    assert reply.status == "timeout" and reply.message.startswith("not run: a smaller case already timed out")
