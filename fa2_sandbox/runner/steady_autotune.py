"""An autotuner's choice at a timing budget's case, made as the student's own idle GPU would make it.

A timing budget's warm-up (serve.py warm_timing) runs while the class keeps the GPU busy, and a
submission that autotunes chooses its configs for the timing case there. Triton's autotuner times
each config once, one after the other (triton/runtime/autotuner.py: Autotuner._bench, do_bench's
median), so another runner's kernels running through one config's turn make that config read slow,
and another is chosen. Between class runs of one grader an autotuning submission's fastest pass
moved by up to 11%, in two modes, while the reference, whose configs are pinned, stayed within 3%
(notes/grading-speed.md, "The student's autotuner chooses under load"). On the student's own GPU
nothing else runs while it chooses.

So inside warm_timing (`choosing`) the autotuner's configs are timed in ROUNDS rounds, every
config once a round, and a config's reading is its fastest round: another runner's burst adds time
and never takes it away, so the fastest round is the one nearest the config's idle time, and the
rounds give every config the same chances. Everything else is the student's: the configs, the
function that times them (do_bench with the autotuner's warm-up and rep, or its own), and the rule
that chooses (the smallest reading). Outside warm_timing nothing changes: the checks' calls time
the configs as Triton does. The chosen config of each kernel goes into warm_timing's reply
(`chosen`), so runs can be compared (bench/timing_stability.py); nothing is judged by it.
"""
import contextlib

ROUNDS = 3
TO_TIME = "_grader_configs_to_time"  # set on an Autotuner by its pruning, taken by its first timing
READINGS = "_grader_readings"  # config id -> its fastest round, for the autotuner's later asks
MAX_KERNELS = 16  # in a reply: a submission's kernels, not an unbounded list
_state = {"active": False, "tuned": []}


def install() -> bool:
    """Patch Triton's Autotuner (over parallel_autotune's patch, if any); False where it is absent or patched."""
    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:
        return False
    if getattr(Autotuner, TO_TIME, None) is not None:
        return False
    prune, bench = Autotuner.prune_configs, Autotuner._bench

    def prune_configs(self, kwargs, *rest, **more):
        configs = prune(self, kwargs, *rest, **more)  # Autotuner.run prunes only where it will choose
        self.__dict__.pop(READINGS, None)
        self.__dict__.pop(TO_TIME, None)  # left by a choice read from the disk cache, which timed nothing
        if _state["active"]:
            self.__dict__[TO_TIME] = list(configs)
            _state["tuned"].append(self)
        return configs

    def _bench(self, *args, config, **meta):
        configs = self.__dict__.pop(TO_TIME, None)
        if configs and len(configs) > 1:
            self.__dict__[READINGS] = in_rounds(lambda c: bench(self, *args, config=c, **meta), configs)
        readings = self.__dict__.get(READINGS) or {}
        if id(config) in readings:
            return readings[id(config)]
        return bench(self, *args, config=config, **meta)

    Autotuner.prune_configs, Autotuner._bench = prune_configs, _bench
    setattr(Autotuner, TO_TIME, ())
    return True


def in_rounds(time_one, configs) -> dict:
    """Config id -> its fastest of ROUNDS readings, the configs timed in turn in every round. A reading
    is what the autotuner's timing returns (do_bench's [median, p20, p80], or one number), compared
    as the autotuner compares them."""
    readings = {}
    for _ in range(ROUNDS):
        for config in configs:
            reading = time_one(config)
            if id(config) not in readings or faster(reading, readings[id(config)]):
                readings[id(config)] = reading
    return readings


def faster(reading, than) -> bool:
    try:
        return bool(reading < than)
    except Exception:  # a student's timing function that returns what does not compare: its first reading
        return False


@contextlib.contextmanager
def choosing():
    """Within: an autotuner that chooses times its configs in rounds. Yields the list of what was
    chosen, filled in on the way out: [{"kernel": name, "config": its str}], at most MAX_KERNELS."""
    _state["active"], _state["tuned"] = True, []
    chosen = []
    try:
        yield chosen
    finally:
        _state["active"] = False
        for tuner in _state["tuned"][:MAX_KERNELS]:
            kernel = getattr(getattr(tuner, "base_fn", None), "__name__", None) or type(tuner.fn).__name__
            chosen.append({"kernel": str(kernel)[:100], "config": str(getattr(tuner, "best_config", None))[:300]})
        _state["tuned"] = []
