"""The runner: the only process that ever imports a submission's code.

Started by fa2_sandbox.harness.client as `python -m fa2_sandbox.runner.serve READ_FD WRITE_FD`, with its working
directory in a private copy of the submission and its output going to a log file. It imports
the adapters file, then serves requests: build inputs from a seed and a case, run the student's
code, write the raw tensors to the exchange folder and say what happened. It judges nothing:
the harness compares what comes back with an oracle the runner never sees.
"""
import faulthandler
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import time
from pathlib import Path

# Trusted modules load before the submission's root joins sys.path, so a student package
# called `torch` or `triton` cannot shadow them.
import torch

from fa2_sandbox.runner import (
    cpu_profile,
    distributed_ops,
    flash_call,
    input_changes,
    instruments,
    parallel_autotune,
    steady_autotune,
)
from fa2_sandbox.runner.errors import describe, format_traceback, import_failure
from fa2_sandbox.runner.ranks import RankPool
from fa2_sandbox.runner.stretch_clock import StretchClock
from fa2_sandbox.wire import course_env, outcomes, requests
from fa2_sandbox.wire import tensors as wire_tensors
from fa2_sandbox.wire.cases import FLASH_SLOTS, make_inputs
from fa2_sandbox.wire.channel import Channel

try:
    import triton  # noqa: F401
except Exception:
    pass

# Bound now, before any submission is imported: patching time.perf_counter or
# torch.cuda.synchronize (to make a timed call look shorter) changes nothing here (input_changes
# binds what compares the inputs the same way).
CLOCK = time.perf_counter
SYNC = torch.cuda.synchronize
# Likewise the GPU allowance's own calls: a submission that replaced them could not lift its cap.
SET_MEMORY_FRACTION = torch.cuda.set_per_process_memory_fraction
EMPTY_CACHE = torch.cuda.empty_cache
RESET_PEAK = torch.cuda.reset_peak_memory_stats
MAX_RESERVED = torch.cuda.max_memory_reserved


class NotAttempted(Exception):
    pass


def load_adapters(root: Path, adapters_file: Path, extra_paths: list):
    """Import the adapters file with the sys.path `uv run` would give it: the repo's root, the
    submission.yaml's paths, and the path dependencies inside the repo (cs336-basics/, say), each
    with dist-info metadata. Spawned DDP ranks inherit this sys.path (distributed_ops)."""
    try:
        env = course_env.read(root)
    except Exception as exc:  # never let the grader's own reading stop the import
        env = course_env.CourseEnv(
            refused=[f"the grader could not read the submission's pyproject.toml files: {exc!r}"])
    for note in env.refused:  # the harness reports these too (discover); here they go to the log
        print(f"[runner] {note}", flush=True)
    sys.path[:0] = ([str(root)] + [str(root / p) for p in extra_paths] + env.paths
                    + [course_env.write_metadata(root, env, tempfile.mkdtemp(prefix="runner-metadata-"))])
    relative = adapters_file.relative_to(root)
    if len(relative.parts) == 2 and (root / relative.parts[0] / "__init__.py").exists():
        return importlib.import_module(f"{relative.parts[0]}.{relative.stem}")  # e.g. tests.adapters
    spec = importlib.util.spec_from_file_location("submission_adapters", adapters_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission_adapters"] = module
    spec.loader.exec_module(module)
    return module


SIZE = r"([0-9.]+) (bytes|KiB|MiB|GiB|TiB)"
UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _size(pattern: str, text: str):
    match = re.search(pattern.format(size=SIZE), text)
    return float(match.group(1)) * UNITS[match.group(2)] if match else None


def out_of_memory(exc: BaseException):
    """Why an allocation failed, or None: 'host' (the runner's memory limit), 'gpu_allowance' (the
    GPU memory this call was allowed, gpu_ledger.py) or 'gpu_full' (the device itself had no
    room: the neighbours', not the student's). From the caching allocator's message: "Tried to
    allocate A. GPU 0 has a total capacity of T of which F is free. ... this process has U memory
    in use. L allowed; ...". The allowance was hit when U + A passes L, or when the device had the
    room (F >= A); any other CUDA out-of-memory (cuBLAS's, a kernel launch's) is the device's."""
    text = str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in text or \
            "CUDA error: out of memory" in text:
        tried = _size(r"Tried to allocate {size}", text)
        free = _size(r"of which {size} is free", text)
        in_use = _size(r"this process has {size} memory in use", text)
        allowed = _size(r"{size} allowed", text)
        if tried is not None and ((allowed is not None and (in_use or 0) + tried > allowed) or
                                  (free is not None and free >= tried)):
            return outcomes.OOM_GPU_ALLOWANCE
        return outcomes.OOM_GPU_FULL
    if isinstance(exc, MemoryError) or "can't allocate memory" in text or "Cannot allocate memory" in text:
        return outcomes.OOM_HOST
    return None


def hold_to_allowance(allowance: int | None) -> None:
    """Cap this process's GPU allocations at the call's allowance (gpu_ledger.py), when it has one."""
    if allowance and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        SET_MEMORY_FRACTION(min(1.0, allowance / total))


def reset_gpu_peak() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            RESET_PEAK()
        except Exception:
            pass


def gpu_peak() -> int:
    """The most GPU memory this call's allocations held (0 off the GPU): what a timing window
    reserves for the timed calls after their warm-up (test_timing.py)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            return int(MAX_RESERVED())
        except Exception:
            return 0
    return 0


def synchronize(device: str) -> None:
    """Wait for the device (a timed pass ends when its kernels have run)."""
    if device == "cuda":
        SYNC()


def give_back_gpu_memory() -> None:
    """An idle runner holds no cached GPU memory: the next call, its own or a neighbour's, may
    need it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            EMPTY_CACHE()
        except Exception:  # a broken context: the harness restarts this runner anyway
            pass


def cuda_broken(exc: BaseException) -> bool:
    """After a CUDA error (an illegal memory access, say) the context is unusable: the harness
    must start a fresh runner for the next check."""
    if "CUDA error" in str(exc) or type(exc).__name__ == "AcceleratorError":
        return True
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            SYNC()
        except Exception:
            return True
    return False


# torch.compile(fullgraph=True, dynamic=False) compiles a graph per input shape, and after
# recompile_limit (8) graphs of one function it raises FailOnRecompileLimitHit: in a runner that
# serves a slot's ~80 cases every case after the eighth shape failed, where the course runs each
# test in a fresh process and the case passed. Raised, not reset between cases: a compiled
# backward's shapes took much longer to compile with torch._dynamo.reset() before each (a reset
# drops inductor's in-memory caches too, and a case seen again compiles again; notes/corpus-class.md,
# "The compile fixes"), while many cached graphs of one function added no time to a call beyond
# the machine's noise.
RECOMPILE_LIMIT = 10_000


def allow_recompiles() -> None:
    """Lift dynamo's recompile limits before a case, where the submission uses torch.compile.
    Set before every case, since a submission may set them itself; left alone where dynamo was
    never imported (importing it costs seconds, and nothing is compiled)."""
    config = sys.modules.get("torch._dynamo.config")
    if config is not None:
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT)


def get_function(module, name: str):
    fn = getattr(module, name, None)
    if fn is None:
        raise NotAttempted(f"tests/adapters.py has no {name}")
    return fn


def call_adapter(module, name, *args):
    fn = get_function(module, name)
    try:
        return fn(*args)
    except NotImplementedError as exc:
        raise NotAttempted(f"{name} raised NotImplementedError{': ' + str(exc) if str(exc) else ''}")


class Runner:
    def __init__(self, channel: Channel, module, exchange: Path, profile: "cpu_profile.Profile | None" = None,
                 root: Path | None = None):
        self.channel, self.module, self.exchange = channel, module, exchange
        # the submission's copy: errors name its files relative to it, as they are in the student's repo
        self.root = root if root is not None else Path.cwd()
        self.profile = profile  # where this process's CPU went, for the bench (cpu_profile.py); None: not asked
        self.rank_pool = None  # the ranks of the last distributed call, kept for the next one
        self.timed = None  # a timing budget's prepared inputs and last outputs, between its calls
        self.rounds_timed = 0  # time_passes calls served: the reference says which round a window's is
        self.tag = None  # the call being served: its tensors are saved under it
        self.handlers = {requests.Flash: self.flash, requests.WarmTiming: self.warm_timing,
                         requests.PrepareTiming: self.prepare_timing, requests.TimePasses: self.time_passes,
                         requests.EndTiming: self.end_timing, requests.Distributed: self.distributed}

    def phase(self, name: str) -> None:
        self.channel.send({"event": "phase", "phase": name})

    def save(self, tensors: dict) -> str:
        return wire_tensors.save(self.exchange, self.tag, tensors)

    def flash(self, request: requests.Flash) -> dict:
        case = request.case
        cls = call_adapter(self.module, FLASH_SLOTS[request.slot])
        q, k, v, do = make_inputs(case, request.input_seed, request.device)
        allow_recompiles()
        if request.warmup:  # compile and autotune outside the measured calls
            try:
                flash_call.run_flash(cls, q, k, v, do, case.is_causal)
            except Exception as exc:  # the calls below raise it again where it belongs (a missing backward
                if out_of_memory(exc) or cuda_broken(exc):  # must not fail the forward's checks)
                    raise
        caller = {"q": q, "k": k, "v": v, "dO": do}  # the caller's tensors, as the official tests hold them
        before = input_changes.snapshot(caller)
        result, tensors = {}, {}

        self.phase("forward")
        with instruments.Watch(ops=request.watch_ops) as watch:
            inputs, o, lse = flash_call.forward(cls, q, k, v, case.is_causal)
            if o.is_cuda:
                SYNC()
        # Judged as the call returned them (flash_call.as_returned), before the backward runs.
        tensors["o"] = flash_call.as_returned(o)
        if len(lse) == 1:
            tensors["L"] = flash_call.as_returned(lse[0])
        result["forward"] = watch.report()
        result["n_lse"] = len(lse)
        result["lse_dtypes"] = [str(t.dtype).replace("torch.", "") for t in lse]
        # Per call, so that a check names the call that changed an input (test_flash.py).
        result["changed_inputs"] = {"forward": input_changes.changes(before, caller)}
        if result["changed_inputs"]["forward"]:
            before = input_changes.snapshot(caller)

        if request.backward:
            self.phase("backward")
            try:
                with instruments.Watch(ops=request.watch_ops) as watch:
                    grads = flash_call.backward(inputs, o, do)
                    if o.is_cuda:
                        SYNC()
            except Exception as exc:  # the forward's results still count (the official tests split them)
                if out_of_memory(exc) or cuda_broken(exc):
                    raise
                result["backward_error"] = {
                    "status": outcomes.NOT_ATTEMPTED if isinstance(exc, NotImplementedError) else outcomes.ERROR,
                    "message": describe(exc, self.root), "traceback": format_traceback(exc, self.root)}
            else:
                tensors.update({name: flash_call.as_returned(g) for name, g in zip(("dq", "dk", "dv"), grads)
                                if g is not None})
                result["backward"] = watch.report()
            result["changed_inputs"]["backward"] = input_changes.changes(before, caller)
        result["devices"] = {name: str(t.device) for name, t in tensors.items() if isinstance(t, torch.Tensor)}
        result["tensors"] = self.save(tensors)
        return result

    # -- a timing budget's passes (grading/checks/timed_window.py) -------------------------------
    # The harness times each forward+backward from outside, between the phase messages sent after
    # each pass's synchronize, so patched clocks in here change nothing. Drawing the inputs and
    # saving the outputs happen in calls of their own, outside the harness's window of the GPU's
    # time: only the passes pause the other runners. Every pass gets inputs never seen before, and
    # the last pass's outputs are judged, so a cached or replayed answer fails.
    def warm_timing(self, request: requests.WarmTiming) -> dict:
        """A pass that compiles and autotunes, then, unless that one took over `once_over_s`, a
        second (a slow kernel's second pass would only double its cost). Nothing here is timed:
        the first pass of a timing window is (grading/checks/timed_window.py). An autotuner chooses
        in the first as on an idle GPU (steady_autotune.py); the reply names what it chose."""
        case = request.case
        cls = call_adapter(self.module, FLASH_SLOTS[request.slot])
        q, k, v, do = make_inputs(case, request.seed, request.device)
        allow_recompiles()
        started = CLOCK()
        with steady_autotune.choosing() as chosen:
            flash_call.run_flash(cls, q, k, v, do, case.is_causal, copies=False)
            synchronize(request.device)
        if request.once_over_s is None or CLOCK() - started <= request.once_over_s:
            flash_call.run_flash(cls, q, k, v, do, case.is_causal, copies=False)
            synchronize(request.device)
        return {"chosen": chosen}

    def prepare_timing(self, request: requests.PrepareTiming) -> dict:
        """Draw the inputs of the passes to come, one per seed, and keep them on the device."""
        case = request.case
        self.timed = {"cls": call_adapter(self.module, FLASH_SLOTS[request.slot]), "case": case, "last": None,
                      "inputs": [(seed, make_inputs(case, seed, request.device)) for seed in request.seeds]}
        synchronize(request.device)
        return {"prepared": len(self.timed["inputs"])}

    def time_passes(self, request: requests.TimePasses) -> dict:
        """`passes` forward+backward passes on the next prepared inputs, synchronized after every
        `per_sync` of them (and after the last), each time followed by the phase "pass i", i the
        passes done: between two synchronizes the passes queue on the device as they would in a
        training loop. The last pass's outputs are kept, as returned. With `cycle` (the grader's
        reference only) the passes go round the prepared inputs, which stay, and the reply adds the
        runner's own record of each stretch (stretch_clock.py) and how many rounds it timed before."""
        timed, passes, per_sync, cycle = self.timed, request.passes, request.per_sync, request.cycle
        if timed is None or not timed["inputs"] or (not cycle and len(timed["inputs"]) < passes):
            prepared = len(timed["inputs"]) if timed is not None else 0
            raise RuntimeError(f"{passes} passes asked for, {prepared} inputs prepared")
        self.phase("timed")
        own = StretchClock(request.device) if cycle else None  # the reference's own record
        for i in range(1, passes + 1):
            if cycle:
                seed, (q, k, v, do) = timed["inputs"][i % len(timed["inputs"])]
            else:
                seed, (q, k, v, do) = timed["inputs"].pop(0)
            last = i == passes
            got = flash_call.run_flash(timed["cls"], q, k, v, do, timed["case"].is_causal, copies=last)
            if last or i % per_sync == 0:
                if own:
                    own.launched()
                synchronize(request.device)
                if own:
                    own.synchronized(i)
                self.phase(f"pass {i}")
            del q, k, v, do
        timed["last"] = (seed, got)
        self.rounds_timed += 1
        if own:
            return {"passes": passes, "own_stretches": own.stretches, "rounds_before": self.rounds_timed - 1}
        return {"passes": passes}

    def end_timing(self, request: requests.EndTiming) -> dict:
        """The prepared inputs left go; with `save`, the last timed pass's outputs come back, with
        the seed of its inputs."""
        timed, self.timed = self.timed, None
        if not request.save or timed is None or timed["last"] is None:
            return {}
        seed, got = timed["last"]
        return {"tensors": self.save(got), "seed": seed}

    def distributed(self, request: requests.Distributed) -> dict:
        """Train on spawned ranks (fa2_sandbox.runner.distributed_ops); per scenario, what each rank returned.

        Gloo on CPU tensors, GPUs or not: the checks are about numerics and the order of
        collectives, which gloo shows as well as NCCL would (the course's own tests use gloo
        too). With torch.cuda.device_count() >= 2 an NCCL variant could be added later. If every
        scenario on every rank stopped at NotImplementedError or a missing adapter, the call is
        not attempted.
        """
        fn = {"ddp": distributed_ops.ddp_rank, "sharded": distributed_ops.sharded_rank,
              "fsdp": distributed_ops.fsdp_rank}[request.kind]
        self.phase("ranks")
        try:
            with distributed_ops.trusted_first() as sys_path:
                spec = {**request.spec, "model_seed": request.model_seed, "data_seed": request.data_seed,
                        "module_name": self.module.__name__, "module_file": self.module.__file__,
                        "sys_path": sys_path}
                if self.rank_pool is None or self.rank_pool.world_size != request.world_size:
                    self.end_ranks()
                    self.rank_pool = RankPool(request.world_size, backend="gloo")
                ranks = self.rank_pool.run(fn, spec, timeout_s=request.timeout_s, collective_timeout_s=30)
        except RuntimeError as exc:  # "rank 1 of 2 failed:\n<traceback>": keep its last line
            lines = [line for line in str(exc).splitlines() if line.strip()]
            if len(lines) > 1 and lines[0].startswith("rank ") and " failed" in lines[0]:
                raise RuntimeError(f"{lines[0].split(' of ')[0]} failed: {lines[-1].strip()}") from None
            raise
        statuses = [s["status"] for r in ranks for s in r.values()]
        if statuses and all(status == outcomes.NOT_ATTEMPTED for status in statuses):
            raise NotAttempted(next(iter(ranks[0].values()))["message"])

        result, tensors = {"scenarios": {}}, {}
        for name in dict.fromkeys(name for scenarios in ranks for name in scenarios):
            per_rank = []
            for rank, scenarios in enumerate(ranks):
                s = scenarios.get(name, {"status": outcomes.NOT_RUN, "message": "an earlier scenario failed"})
                for kind, value in s.items():
                    if isinstance(value, dict):  # named tensors: initial, buffers, grads0, final
                        tensors.update({f"{name}/{rank}/{kind}/{k}": v for k, v in value.items()})
                per_rank.append({k: v for k, v in s.items() if not isinstance(v, dict)})
            result["scenarios"][name] = per_rank
        result["tensors"] = self.save(tensors)
        return result

    def end_ranks(self) -> None:
        if self.rank_pool is not None:
            self.rank_pool.close()
            self.rank_pool = None

    def serve(self) -> None:
        while True:
            message = self.channel.receive()
            self.tag, allowance = message.get("tag"), message.get("gpu_allowance")
            start = CLOCK()
            try:
                request = requests.from_json(message)
                if not isinstance(request, requests.Distributed):  # idle ranks would hold memory and cores
                    self.end_ranks()                                # through other checks
                hold_to_allowance(allowance)
                reset_gpu_peak()
                result = self.handlers[type(request)](request)
                reply = {"event": "done", "status": outcomes.OK, "result": result}
            except NotAttempted as exc:
                reply = {"event": "done", "status": outcomes.NOT_ATTEMPTED, "message": str(exc)}
            except BaseException as exc:  # the student's exception, SystemExit included
                reply = {"event": "done", "status": outcomes.ERROR, "message": describe(exc, self.root),
                         "traceback": format_traceback(exc, self.root)}
                oom = out_of_memory(exc)
                if oom or cuda_broken(exc):  # the harness restarts this runner
                    reply.update(oom=oom, restart=True, gpu_allowance=allowance)
            reply["seconds"] = CLOCK() - start
            reply["tag"] = self.tag
            reply["gpu_peak"] = gpu_peak()
            if self.profile is not None:
                reply["cpu"] = self.profile.totals()
            if message.get("op") != requests.TimePasses.op:  # a window's next call would allocate it all again
                give_back_gpu_memory()
            self.channel.send(reply)


def main() -> None:
    channel = Channel(int(sys.argv[1]), int(sys.argv[2]))
    faulthandler.enable()  # a segfault leaves its Python stack in the log
    config = channel.receive()
    parallel_autotune.tell_with(lambda on: channel.send({"event": "compiling", "on": on}))
    if instruments.install_triton_launch_counter() and os.environ.get("TRITON_INTERPRET") == "1":
        from fa2_sandbox.runner.triton_interpreter import ensure_bf16
        ensure_bf16(interpreted=True)
    elif torch.cuda.is_available():
        parallel_autotune.install()
        steady_autotune.install()  # over parallel_autotune's: its first timing compiles every config
    root = Path(config["root"])
    adapters_file = root / config["adapters_file"]
    profile = cpu_profile.Profile(str(root)).start() if config.get("cpu_profile") else None
    os.chdir(root)
    try:
        module = load_adapters(root, adapters_file, config.get("extra_paths", []))
    except BaseException as exc:
        try:  # a declared package this Python lacks: say so, and how to fix it
            advice = course_env.import_advice(root, exc)
        except Exception:
            advice = None
        error = import_failure(config["adapters_file"], exc, root) + (f". {advice}" if advice else "")
        channel.send({"event": "ready", "import_error": error, "traceback": format_traceback(exc, root)})
        return
    functions = sorted(name for name in dir(module) if name.startswith(("get_", "ddp_", "fsdp_")))
    hello = {"event": "ready", "import_error": None, "functions": functions, "cuda": torch.cuda.is_available(),
             "torch": torch.__version__}
    if profile is not None:
        profile.ready()
        hello["cpu"] = profile.totals()
    channel.send(hello)
    Runner(channel, module, Path(config["exchange"]), profile, root).serve()


if __name__ == "__main__":
    main()
