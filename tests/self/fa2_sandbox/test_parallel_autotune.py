"""The runner's side-by-side compile of an autotuner's configs (fa2_sandbox/runner/parallel_autotune.py),
on Triton's own Autotuner over a stand-in kernel that records how it is called: every config the
autotuner times is compiled first with the launch's own arguments, what is timed and chosen is
unchanged, and nothing is compiled where nothing is timed. That the compiles overlap is Triton's
AsyncCompileMode, which needs a GPU target to compile for: measured on the GPU, not here."""
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")

from fa2_sandbox.runner import parallel_autotune  # noqa: E402


class Kernel:
    """What Autotuner calls: `run(*args, grid, warmup, **kwargs)`; BLOCK 64 fails to compile."""
    arg_names = ["x", "n"]

    def __init__(self):
        self.calls = []
        self.fn = lambda x, n: None  # Autotuner looks for the Python function under .fn

    def run(self, *args, grid, warmup, **kwargs):
        self.calls.append(("compile" if warmup else "launch", kwargs.get("BLOCK"), args))
        if kwargs.get("BLOCK") == 64:
            raise ValueError("out of resources")


def autotuned(blocks, timings):
    """A kernel and its autotuner, whose timing of a config is `timings[BLOCK]` (inf where it fails)."""
    kernel = Kernel()

    def bench(kernel_call, quantiles):
        try:
            kernel_call()
        except ValueError:
            return [float("inf")] * 3
        return [timings[kernel.calls[-1][1]]] * 3

    configs = [triton.Config({"BLOCK": b}) for b in blocks]
    return kernel, triton.autotune(configs=configs, key=["n"], do_bench=bench)(kernel)


@pytest.fixture(autouse=True, scope="module")
def installed():
    from triton.runtime.autotuner import Autotuner
    before = Autotuner.prune_configs, Autotuner._bench
    assert parallel_autotune.install()
    assert not parallel_autotune.install()  # once
    yield
    Autotuner.prune_configs, Autotuner._bench = before
    delattr(Autotuner, parallel_autotune.UNBUILT)


def test_every_config_is_compiled_with_the_launch_arguments_before_the_first_is_timed():
    kernel, tuned = autotuned([16, 32, 64], {16: 2.0, 32: 1.0})
    tuned.run("x", 7, grid=(1,), warmup=False)
    compiles = [c for c in kernel.calls if c[0] == "compile"]
    assert compiles == [("compile", 16, ("x", 7)), ("compile", 32, ("x", 7)), ("compile", 64, ("x", 7))]
    first_launch = next(i for i, c in enumerate(kernel.calls) if c[0] == "launch")
    assert first_launch == 3  # all compiled before any config ran
    assert tuned.best_config.kwargs == {"BLOCK": 32}  # the failing config still timed as infinite, as before
    assert kernel.calls[-1] == ("launch", 32, ("x", 7))


def test_nothing_is_compiled_again_where_the_choice_is_known():
    kernel, tuned = autotuned([16, 32], {16: 2.0, 32: 1.0})
    tuned.run("x", 7, grid=(1,), warmup=False)
    kernel.calls.clear()
    tuned.run("y", 7, grid=(1,), warmup=False)  # the same key: the autotuner times nothing
    assert kernel.calls == [("launch", 32, ("y", 7))]
    tuned.run("z", 9, grid=(1,), warmup=False)  # a new key: timed, so compiled first
    assert [c[0] for c in kernel.calls[1:3]] == ["compile", "compile"]


def test_one_config_is_not_compiled_ahead():
    kernel, tuned = autotuned([16], {})
    tuned.run("x", 7, grid=(1,), warmup=False)
    assert [c[0] for c in kernel.calls] == ["launch"]


def test_the_switch_turns_it_off_in_the_runners(tmp_path, monkeypatch):
    from fa2_sandbox.harness.discover import load_submission
    from fa2_sandbox.harness.scratch import PROJECT_ROOT, ScratchFolder

    monkeypatch.setenv(parallel_autotune.SWITCH, "0")
    folder = ScratchFolder(load_submission(PROJECT_ROOT / "submissions" / "reference"), uid=None)
    env = folder.runner_env({"network": False}, {})
    folder.remove()
    assert env[parallel_autotune.SWITCH] == "0"
    check = ("from triton.runtime.autotuner import Autotuner\n"
             "from fa2_sandbox.runner import parallel_autotune\n"
             "before = Autotuner._bench\n"
             "assert not parallel_autotune.install() and Autotuner._bench is before")
    subprocess.run([sys.executable, "-c", check], env={**os.environ, **env, "PYTHONPATH": str(PROJECT_ROOT)},
                   check=True, timeout=120)


def test_the_side_by_side_compile_tells_the_harness_when_it_begins_and_ends():
    """So that its time does not count against the call's timeout (fa2_sandbox/harness/compile_credit.py)."""
    told = []
    kernel, tuned = autotuned([16, 32], {16: 2.0, 32: 1.0})
    parallel_autotune.tell_with(lambda on: told.append((on, len(kernel.calls))))
    try:
        tuned.run("x", 7, grid=(1,), warmup=False)
        assert told == [(True, 0), (False, 2)]  # around the two compiles, before any config ran
        told.clear()
        tuned.run("y", 7, grid=(1,), warmup=False)  # nothing to compile
        assert told == []
    finally:
        parallel_autotune.tell_with(None)
