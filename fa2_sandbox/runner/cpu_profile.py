"""Where a runner's CPU goes: the runner's part of bench/grade_speed.py's account of a class.

Only when the harness asks (GRADER_CPU_LOG set in the grader, fa2_sandbox/harness/client.py), a
thread of the runner wakes every PERIOD seconds, reads the process's CPU time (every thread's)
and charges what was used since its last look to what the runner was doing then, as its threads'
Python stacks show it. Each thread's stack names one activity; the busiest-looking one wins, in
the order of ACTIVITIES. A sample costs tens of microseconds, a fraction of a percent of a core.

With them go torch.compile's cache counters (CACHE_COUNTERS), where the submission imported it: whether
its graphs were found in the cache the submission's earlier runners left (harness/kernel_cache.py)
or compiled again, which the CPU seconds alone do not tell.

The runner sends the totals with every reply; the bench scales them to the CPU that /proc counts
for the process, so a charge that lands on the wrong activity moves seconds between columns, never
the total.
"""
import sys
import threading
import time

PERIOD = 0.02

STARTING = "start and imports"  # everything before the runner's hello, then any import
COMPILING = "compiling"         # Triton, torch.compile and the launchers they build
AUTOTUNING = "autotuning"       # an autotuner timing its configs: the student's kernels, run many times
WATCHING = "op watch"           # the grader's own torch modes (instruments.Watch)
STUDENT = "student calls"       # a frame of the submission on the stack
WAITING = "waiting for the GPU"  # in torch.cuda.synchronize (a busy wait on some drivers)
OWN = "runner's own"            # making inputs, copying and saving tensors, messages
ACTIVITIES = (STARTING, COMPILING, AUTOTUNING, WATCHING, STUDENT, WAITING, OWN)
# (torch._dynamo.utils.counters' group, its key): the FX graph cache and the AOTAutograd cache.
CACHE_COUNTERS = (("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"),
                  ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"))

# Files (and, where a file also runs compiled code, its functions) that compile. Triton's driver
# builds a kernel's launcher (a C module, with gcc) the first time the kernel runs, and then runs it.
COMPILE_FILES = ("/triton/compiler/", "/triton/backends/nvidia/compiler.py", "/triton/backends/amd/compiler.py",
                 "/triton/runtime/build.py", "/torch/_dynamo/convert_frame.py",
                 "/torch/_inductor/compile_fx.py", "/torch/_inductor/codecache.py", "/torch/_inductor/async_compile.py",
                 "/torch/_inductor/cpp_builder.py", "/torch/_inductor/codegen/", "/torch/_inductor/scheduler.py",
                 "/torch/_inductor/graph.py", "/torch/_functorch/aot_autograd.py")
COMPILE_FUNCTIONS = {"precompile", "_precompile_config", "prune_configs", "compile_module_from_src", "make_launcher"}
# Where an autotuner times its configs (triton/runtime/autotuner.py; torch.compile's triton_heuristics.py):
# the kernels it runs are compiled first, inside it, and a compiling frame is found before it.
AUTOTUNE_FILES = ("/triton/runtime/autotuner.py", "/torch/_inductor/runtime/triton_heuristics.py")
AUTOTUNE_FUNCTIONS = {"_bench", "benchmark", "do_bench", "benchmark_all_configs", "autotune_to_one_config"}


class Profile:
    def __init__(self, submission_root: str):
        self.root = submission_root.rstrip("/") + "/"
        self.seconds = dict.fromkeys(ACTIVITIES, 0.0)
        self.started = False  # the hello is sent: STARTING from then on means an import
        self._last = 0.0  # the first charge takes the CPU since the process began: its start
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cpu-profile", daemon=True)

    def start(self) -> "Profile":
        self._thread.start()
        return self

    def ready(self) -> None:
        self._charge()
        self.started = True

    def totals(self) -> dict:
        """Core-seconds by activity so far, and the process's CPU time they add up to."""
        self._charge()
        with self._lock:
            return {**{k: round(v, 3) for k, v in self.seconds.items()}, "process": round(self._last, 3),
                    **cache_counts()}

    def _run(self) -> None:
        while True:
            time.sleep(PERIOD)
            self._charge()

    def _charge(self) -> None:
        activity = self._activity()
        with self._lock:
            now = time.process_time()
            self.seconds[activity] += max(0.0, now - self._last)
            self._last = now

    def _activity(self) -> str:
        if not self.started:
            return STARTING
        me = threading.get_ident()
        found = [self._of(frame) for ident, frame in sys._current_frames().items() if ident != me]
        return min(found, key=ACTIVITIES.index, default=OWN)

    def _of(self, frame) -> str:
        """The activity one thread's stack shows (its innermost frame first)."""
        innermost, student = frame, False
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if name.startswith("<frozen importlib"):
                return STARTING
            if any(part in name for part in COMPILE_FILES) or code.co_name in COMPILE_FUNCTIONS:
                return COMPILING
            if code.co_name in AUTOTUNE_FUNCTIONS and any(part in name for part in AUTOTUNE_FILES):
                return AUTOTUNING
            student = student or name.startswith(self.root)
            frame = frame.f_back
        inner = innermost.f_code
        if inner.co_filename.endswith("fa2_sandbox/runner/instruments.py") and inner.co_name.startswith("__torch_"):
            return WATCHING
        if student:
            return STUDENT
        if inner.co_name == "synchronize" and "/torch/cuda/" in inner.co_filename:
            return WAITING
        return OWN


def cache_counts() -> dict:
    """torch.compile's cache hits and misses in this process so far; nothing where it was never
    imported (reading the counters must not import torch._dynamo)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return {}
    return {key: int(counters.get(group, {}).get(key, 0)) for group, key in CACHE_COUNTERS}
