"""An autotuner's configs compiled side by side, before it times them.

Triton's autotuner (triton/runtime/autotuner.py, Autotuner.run) compiles each config the first
time it times it, one after the other, on one core. A submission that autotunes five configs of
a large kernel waits minutes there for each dtype, head dim and causal flag, and at the end of a
class that is the class's tail while the other cores idle (notes/grading-speed.md, kbjiang's
float32 d128 kernels). Triton's own AsyncCompileMode compiles in a thread pool (its passes release
the GIL; ptxas is a process of its own), so here every config the autotuner is about to time is
compiled at once, into the kernel's in-memory cache where the timing loop then finds it.

What the student's code does is unchanged: the same configs are timed the same way, one at a
time, and the same one is chosen. A config that fails to compile here is compiled again by the
autotuner's own loop, which meets its error and handles it as it always did. Nothing is compiled
where the autotuner does not time (a result read from Triton's autotuning cache), nor under the
interpreter (nothing to compile). GRADER_AUTOTUNE_SIDE_BY_SIDE=0 in the grader's environment turns
it off in every runner (scratch.py passes it on), for a class run to compare with.

While it compiles, the runner tells the harness (`compiling`, an event on the runner's channel that
serve.py sets up), and that time does not count against the call's timeout
(fa2_sandbox/harness/compile_credit.py): beside a class, an autotuner's compiles share the cores
with every other runner's, and how long they take is the class's, not the student's.
"""
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

# Compiles at once in one runner. Each holds a compiler's memory, which counts against the
# runner's allowance (fa2_sandbox/harness/client.py runner_memory_limit); a class's other runners
# share the cores meanwhile.
WORKERS = 4
UNBUILT = "_grader_configs_to_compile"  # set on an Autotuner between its pruning and its first timing
SWITCH = "GRADER_AUTOTUNE_SIDE_BY_SIDE"
_tell = [None]  # serve.py: a function of one bool that sends the harness the event "compiling"


def tell_with(send) -> None:
    """Where `compiling` says that a compile begins (send(True)) and ends (send(False))."""
    _tell[0] = send


@contextlib.contextmanager
def compiling():
    send = _tell[0]
    if send is not None:
        send(True)
    try:
        yield
    finally:
        if send is not None:
            send(False)


def install() -> bool:
    """Patch Triton's Autotuner; False where this Triton has no AsyncCompileMode, or SWITCH is 0."""
    if os.environ.get(SWITCH) == "0":
        return False
    try:
        import triton
        from triton.runtime.autotuner import Autotuner
    except Exception:
        return False
    if not hasattr(triton, "AsyncCompileMode") or getattr(Autotuner, UNBUILT, None) is not None:
        return False
    prune, bench = Autotuner.prune_configs, Autotuner._bench

    def prune_configs(self, kwargs, *rest, **more):
        configs = prune(self, kwargs, *rest, **more)
        setattr(self, UNBUILT, list(configs))  # Autotuner.run calls it only where it will time them
        return configs

    def _bench(self, *args, config, **meta):
        configs = self.__dict__.pop(UNBUILT, None)
        if configs and len(configs) > 1:
            compile_configs(self.fn, args, meta, configs)
        return bench(self, *args, config=config, **meta)

    Autotuner.prune_configs, Autotuner._bench = prune_configs, _bench
    setattr(Autotuner, UNBUILT, ())
    return True


def compile_configs(fn, args, meta, configs) -> None:
    """Compile `fn` for each config, as the autotuner's launch of it would (the same arguments,
    so the same specialization), in a pool of threads; errors are left for the autotuner to meet."""
    import triton

    meta = {k: v for k, v in meta.items() if k not in ("grid", "warmup")}
    try:
        with compiling(), ThreadPoolExecutor(min(len(configs), WORKERS), thread_name_prefix="grader-compile") as pool, \
                triton.AsyncCompileMode(pool, ignore_errors=True):
            for config in configs:
                try:
                    fn.run(*args, grid=None, warmup=True, **meta, **config.all_kwargs())
                except Exception:
                    pass  # a conflict or a compile error: the autotuner's own loop raises or skips it
    except Exception:
        pass  # another AsyncCompileMode already active (the student's own): compile as Triton would
