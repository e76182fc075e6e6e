"""The grader's reference timing its own stretches from inside its runner: a record kept beside
the harness's reading, never a verdict's input.

The harness times a window's stretches from outside the runners, by when each phase message
arrives (grading/checks/timed_window.py), as it must for a student's code. The reference's
reading still strays in some windows, most of them the first its worker's kept runner times
(bench/timing_stability.py), and stamps taken outside cannot say why. Inside, for each stretch
between two synchronizes, a pass's share of:

- own_ms: the time from the last synchronize to this one, on this process's clock. Beside the
  harness's reading of the same stretch: what the phase messages' way to the grader added.
- enqueue_ms: the time until the stretch's last pass had launched its kernels. Close to own_ms,
  the CPU bounded the stretch: the launches could not keep ahead of the GPU.
- cpu_ms: this thread's CPU time over those launches. Well under enqueue_ms, the thread waited
  for a core.
- gpu_ms: CUDA events recorded before the first pass's launches and after the last's, on the
  GPU's own clock (None off CUDA). Close to own_ms with a short enqueue_ms, the GPU itself was slow.
"""
import time

import torch

# Bound at import, as serve.py binds its clock: the reference runner imports no student's code,
# but the runner's other timing reads the same way.
CLOCK = time.perf_counter
THREAD_CPU = time.thread_time


class StretchClock:
    """Call `launched()` when a stretch's last pass has returned and `synchronized(done)` right
    after the synchronize that ends it (`done`: the passes timed so far); `stretches` holds one
    dict a stretch."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.stretches = []
        self._begin(0)

    def _event(self):
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _begin(self, done: int) -> None:
        self.done = done
        self.started, self.started_cpu = CLOCK(), THREAD_CPU()
        self.first_event = self._event()
        self.launched_at = self.launched_cpu = self.last_event = None

    def launched(self) -> None:
        self.launched_at, self.launched_cpu = CLOCK(), THREAD_CPU()
        self.last_event = self._event()

    def synchronized(self, done: int) -> None:
        now = CLOCK()
        passes = done - self.done
        if passes > 0 and self.launched_at is not None:
            per_pass = 1000.0 / passes
            gpu = self.first_event.elapsed_time(self.last_event) / passes if self.cuda else None
            self.stretches.append({"passes": passes, "own_ms": round((now - self.started) * per_pass, 4),
                                   "enqueue_ms": round((self.launched_at - self.started) * per_pass, 4),
                                   "cpu_ms": round((self.launched_cpu - self.started_cpu) * per_pass, 4),
                                   "gpu_ms": None if gpu is None else round(gpu, 4)})
        self._begin(done)
