"""The timing warm-up's autotuning in rounds (fa2_sandbox/runner/steady_autotune.py), on Triton's own
Autotuner over a stand-in kernel whose timings a test scripts: inside `choosing` every config is
timed ROUNDS times, in turn, and the fastest round of each decides, so a burst of another runner's
work during one config's turn no longer picks the choice; outside it the autotuner times each
config once, as Triton does; and the reply names what was chosen."""
import pytest

triton = pytest.importorskip("triton")

from fa2_sandbox.runner import parallel_autotune, steady_autotune  # noqa: E402


def flash_fwd(x, n):
    """The stand-in's Python function (Autotuner names the kernel by it)."""


class Kernel:
    """What Autotuner calls: `run(*args, grid, warmup, **kwargs)`."""
    arg_names = ["x", "n"]

    def __init__(self):
        self.calls = []
        self.fn = flash_fwd

    def run(self, *args, grid, warmup, **kwargs):
        self.calls.append(("compile" if warmup else "launch", kwargs.get("BLOCK")))


def autotuned(blocks, readings):
    """A kernel and its autotuner; timing config BLOCK=b returns the next of `readings[b]` (ms)."""
    kernel = Kernel()
    left = {b: list(r) for b, r in readings.items()}

    def bench(kernel_call, quantiles):
        kernel_call()
        return [left[kernel.calls[-1][1]].pop(0)] * 3

    configs = [triton.Config({"BLOCK": b}) for b in blocks]
    return kernel, triton.autotune(configs=configs, key=["n"], do_bench=bench)(kernel)


@pytest.fixture(autouse=True)
def installed():
    from triton.runtime.autotuner import Autotuner
    before = Autotuner.prune_configs, Autotuner._bench
    assert parallel_autotune.install()
    assert steady_autotune.install()  # as serve.py does: over parallel_autotune's
    assert not steady_autotune.install()  # once
    yield
    Autotuner.prune_configs, Autotuner._bench = before
    delattr(Autotuner, parallel_autotune.UNBUILT)
    delattr(Autotuner, steady_autotune.TO_TIME)


def launches(kernel):
    return [block for what, block in kernel.calls if what == "launch"]


def test_in_the_warm_up_each_config_is_timed_in_rounds_and_its_fastest_round_decides():
    # BLOCK 32 is the faster kernel, but another runner's burst hit its first turn
    kernel, tuned = autotuned([16, 32], {16: [2.0, 2.1, 2.0], 32: [3.5, 1.0, 1.1]})
    with steady_autotune.choosing() as chosen:
        tuned.run("x", 7, grid=(1,), warmup=False)
    assert steady_autotune.ROUNDS == 3
    assert launches(kernel) == [16, 32, 16, 32, 16, 32, 32]  # three rounds in turn, then the call itself
    assert tuned.best_config.kwargs == {"BLOCK": 32}
    assert chosen == [{"kernel": "flash_fwd", "config": str(tuned.best_config)}]
    assert kernel.calls[:2] == [("compile", 16), ("compile", 32)]  # parallel_autotune's compile still comes first


def test_outside_the_warm_up_the_autotuner_times_each_config_once_as_triton_does():
    kernel, tuned = autotuned([16, 32], {16: [2.0], 32: [3.5]})
    tuned.run("x", 7, grid=(1,), warmup=False)
    assert launches(kernel) == [16, 32, 16]
    assert tuned.best_config.kwargs == {"BLOCK": 16}  # the burst decides, as it would in Triton


def test_a_choice_already_made_is_not_timed_again_and_a_later_key_outside_is_timed_once():
    kernel, tuned = autotuned([16, 32], {16: [2.0, 2.0, 2.0, 1.0], 32: [1.0, 1.0, 1.0, 2.0]})
    with steady_autotune.choosing() as chosen:
        tuned.run("x", 7, grid=(1,), warmup=False)
        tuned.run("y", 7, grid=(1,), warmup=False)  # the same key: nothing timed
    assert launches(kernel) == [16, 32] * 3 + [32, 32]
    assert len(chosen) == 1
    kernel.calls.clear()
    tuned.run("z", 9, grid=(1,), warmup=False)  # a new key after the warm-up: Triton's own single round
    assert launches(kernel) == [16, 32, 16]


def test_a_reading_that_does_not_compare_is_passed_over():
    readings = iter([[1.0], None, [0.5]])  # a student's timing function that once returned None
    config = object()
    assert steady_autotune.in_rounds(lambda c: next(readings), [config]) == {id(config): [0.5]}
