"""Start a worker's next runner while its current group of checks still runs (GPU, under xdist).

A group of checks (a shard of a submission, tests/grading/shards.py) has a runner of its own, and
most groups are one Triton case: two tests whose one runner call takes a second or two warm,
behind a runner start (Python, torch, triton, the student's adapters: about 5 s on an H100) and
the runner's first CUDA work (fa2_adapters/runner/warm_up.py: 4 s or more). xdist hands a worker
its next group while the current one runs, so the worker starts the next group's runner and
warms it up meanwhile, and the next group's first call finds it ready.

How a worker learns its next group: xdist's worker loop (xdist/remote.py WorkerInteractor) holds
the test it runs next and a queue of the tests sent to it. `upcoming_items` reads both; if a
future xdist renames them it finds nothing, and runners start on first use as before
(tests/self/test_prestart.py fails then, so the change is seen).

When the next runner starts: once a test of the group under way has its own runner up (so the
two never start side by side), and never beside a timing check, whose measured calls would share
the GPU and the cores with it. A group whose tests need no runner (every adapter missing, say)
starts none ahead either, so a run of such groups cannot queue starts nobody waits for.

Runners start in one long-lived thread per worker: a runner dies with the thread that started it
(sandbox.py's PR_SET_PDEATHSIG), so that thread must not end.
"""
from concurrent.futures import ThreadPoolExecutor


def upcoming_items(config) -> list:
    """The tests xdist has sent this worker and not yet started, in order; [] outside a worker."""
    interactor = next((p for p in config.pluginmanager.get_plugins()
                       if type(p).__name__ == "WorkerInteractor"), None)
    try:
        items = interactor.session.items
        with interactor.torun.lock() as queue:
            indices = [interactor.nextitem_index, *queue]
        return [items[i] for i in indices if isinstance(i, int)]
    except (AttributeError, TypeError, IndexError):
        return []


class Starter:
    """Starts runners one at a time, in its own thread, and hands each over once it is up."""

    def __init__(self):
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="runner-prestart")
        self._starting = {}  # group -> Future of the runner's start

    def start(self, group, runner) -> None:
        """Start `runner` and have it do its first CUDA work, unless `group`'s start is under way."""
        if group not in self._starting:
            self._starting[group] = self._thread.submit(_start, runner)

    def busy(self, group) -> bool:
        """Whether `group`'s runner is still starting (its start not yet handed over or done)."""
        return group in self._starting and not self._starting[group].done()

    def wait(self, group) -> None:
        """Return once the start of `group`'s runner, if one was begun, has ended (well or not:
        a runner that failed to start says so on its first call, as any runner does)."""
        future = self._starting.pop(group, None)
        if future is not None:
            future.exception()

    def close(self) -> None:
        for group in list(self._starting):
            self.wait(group)
        self._thread.shutdown(wait=True)


def _start(runner) -> None:
    if runner.import_failure() is None:
        runner.warm_up()
