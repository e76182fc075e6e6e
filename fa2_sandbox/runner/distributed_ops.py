"""What each rank does for the DDP and sharded-optimizer checks. Student-land: raw results only.

`Runner.op_distributed` runs these on the ranks of a fa2_sandbox.runner.ranks.RankPool; each
rank is a fresh process (as spawned, though from multiprocessing's fork server) that inherits the
runner's sys.path and working directory, imports the submission's adapters module itself (once:
the pool keeps its ranks from one successful call to the next, and starts fresh ones after a
failure), trains a reference toy model through
the student's functions and returns plain tensors, dicts and lists. The harness (grading/
test_distributed.py) builds the same models and batches from the same seeds with the helpers
below, trains them in one process and judges.

Every collective the rank issues is logged (function, phase of the training step, step, numel,
op). The phase "backward" means the call happened while loss.backward() was still running: a
gradient all-reduce issued there overlaps communication with computation.

Scenarios run one after another in one spawn. A scenario that fails records its error and ends
that rank's run: the other rank may be left inside a collective, so it stops at the collective
timeout rather than going on with mismatched calls.
"""
import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import threading
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fa2_sandbox import PROJECT_ROOT
from fa2_sandbox.runner.errors import describe
from fa2_sandbox.runner.instruments import DtypeWatch
from fa2_sandbox.wire import outcomes
from fa2_sandbox.wire.requests import rank_model_seed
from fa2_sandbox.wire.toy_models import course_layers
from fa2_sandbox.wire.training import DDP_FLAVOURS, build_model, make_batches, training_loss

# The folder holding fa2_sandbox/: in a runner, its trusted copy, never the project itself.
TRUSTED_ROOT = str(PROJECT_ROOT)
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast")


# -- the collective log -----------------------------------------------------------------------

class Recorder:
    """Wraps torch.distributed's collectives in this process; notes each outermost call."""

    def __init__(self):
        self.log, self.phase, self.step = [], "setup", -1
        self._local = threading.local()

    def install(self) -> None:
        import torch.distributed.distributed_c10d as c10d
        for name in COLLECTIVES:
            real = getattr(c10d, name, None) or getattr(dist, name, None)
            if real is None:
                continue
            wrapped = self._wrap(name, real)
            for namespace in (dist, c10d):
                if hasattr(namespace, name):
                    setattr(namespace, name, wrapped)

    def _wrap(self, name, real):
        @functools.wraps(real)
        def collective(*args, **kwargs):
            depth = getattr(self._local, "depth", 0)
            if depth == 0:  # not a collective that another one calls internally
                self.log.append(self._entry(name, args, kwargs))
            self._local.depth = depth + 1
            try:
                return real(*args, **kwargs)
            finally:
                self._local.depth = depth
        return collective

    def _entry(self, name, args, kwargs) -> dict:
        first = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(first, (list, tuple)):
            numel = sum(t.numel() for t in first if isinstance(t, torch.Tensor))
        else:
            numel = first.numel() if isinstance(first, torch.Tensor) else 0
        op = kwargs.get("op", args[1] if name in ("all_reduce", "all_reduce_coalesced") and len(args) > 1 else None)
        return {"fn": name, "phase": self.phase, "step": self.step, "numel": int(numel),
                "op": None if op is None else str(op).split(".")[-1],
                "async": bool(kwargs.get("async_op", False))}

    def take(self) -> list:
        log, self.log = self.log, []
        return log


RECORDER = Recorder()


# -- the submission ---------------------------------------------------------------------------

class NotAttemptedHere(Exception):
    pass


@contextlib.contextmanager
def trusted_first():
    """Put the trusted modules first on sys.path while ranks start.

    A rank imports torch, this module and fa2_sandbox.runner.ranks through the sys.path
    it inherits, and the runner's has the submission's root in front, where a top-level torch/
    of the student's would shadow the real one. The rank puts the submission's sys.path back
    (load_submission) once those are imported.
    """
    saved = sys.path[:]
    sys.path[:] = [TRUSTED_ROOT] + [p for p in saved if p != TRUSTED_ROOT]
    try:
        yield saved
    finally:
        sys.path[:] = saved


def load_submission(spec: dict):
    """The adapters module the runner loaded, imported again in this rank process."""
    sys.path[:] = spec["sys_path"]
    name = spec["module_name"]
    if name in sys.modules:
        return sys.modules[name]
    if name == "submission_adapters":
        module_spec = importlib.util.spec_from_file_location(name, spec["module_file"])
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def _raised_by_submission(exc: BaseException) -> bool:
    """True when the innermost frame of exc is the submission's code (its own stub)."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = os.getcwd() + os.sep
    return bool(frames) and frames[-1].filename.startswith(root)


class Calls:
    """The submission's functions, with NotImplementedError turned into NotAttemptedHere."""

    def __init__(self, module):
        self.module = module

    def fn(self, name):
        fn = getattr(self.module, name, None)
        if fn is None:
            raise NotAttemptedHere(f"tests/adapters.py has no {name}")
        return fn

    def run(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as exc:
            if not _raised_by_submission(exc):
                raise
            raise NotAttemptedHere(f"{what} raised NotImplementedError{': ' + str(exc) if str(exc) else ''}")

    def call(self, name, *args, **kwargs):
        return self.run(name, self.fn(name), *args, **kwargs)


def run_scenarios(names, body) -> dict:
    """{name: record} for each scenario; after the first failure the rest are not run.

    body(name, result) fills `result` as it goes, so a failing scenario still returns what it
    got (the parameters right after wrapping, say)."""
    out = {}
    for name in names:
        RECORDER.phase, RECORDER.step = "setup", -1
        RECORDER.take()
        result = {}
        try:
            body(name, result)
            out[name] = {"status": outcomes.OK, **result, "log": RECORDER.take()}
        except NotAttemptedHere as exc:
            out[name] = {"status": outcomes.NOT_ATTEMPTED, "message": str(exc), **result, "log": RECORDER.take()}
            break
        except BaseException as exc:  # the student's exception, SystemExit included
            out[name] = {"status": outcomes.ERROR, "message": describe(exc), "phase": RECORDER.phase,
                         "step": RECORDER.step, "traceback": traceback.format_exc(limit=-8),
                         **result, "log": RECORDER.take()}
            break
    return out


def named(container, reference: dict, kind: str = "parameters") -> dict:
    """container.named_<kind>() with the wrapper's prefix stripped, so names match `reference`
    (the bare model's names). Falls back to the bare model when the wrapper renames things."""
    items = list(getattr(container, f"named_{kind}")())
    for strip in ("module.", None):
        renamed = {}
        for name, t in items:
            if strip is None:
                name = name.split(".", 1)[1] if "." in name else name
            elif name.startswith(strip):
                name = name[len(strip):]
            renamed[name] = t
        if set(renamed) >= set(reference):
            return {n: renamed[n].detach().clone() for n in reference}
    return {n: t.detach().clone() for n, t in reference.items()}


# -- DDP --------------------------------------------------------------------------------------

def ddp_rank(rank: int, world_size: int, spec: dict) -> dict:
    """Train spec["models"] through the flavour's adapters on this rank's slice of each batch.

    Per model: the parameters and buffers right after wrapping, the buffers after the first
    forward (a wrapper may sync them there, as torch's DDP does), the gradients after the first
    step's synchronisation, the final parameters, and the collective log.
    """
    RECORDER.install()  # before the submission is imported, so `from torch.distributed import ...` sees it
    calls = Calls(load_submission(spec))
    wrap_name, after_name, start_name = DDP_FLAVOURS[spec["flavour"]]
    wrap_args = (spec["bucket_size_mb"],) if spec["flavour"] == "bucketed" else ()

    def train(model_name, result):
        model = build_model(model_name, rank_model_seed(spec["model_seed"], rank))
        bare_params = dict(model.named_parameters())
        bare_buffers = dict(model.named_buffers())
        x, y = make_batches(model_name, spec["data_seed"], spec["steps"], spec["batch"])
        local = x.shape[1] // world_size
        rows = slice(rank * local, (rank + 1) * local)

        RECORDER.phase = "wrap"
        ddp_model = calls.call(wrap_name, model, *wrap_args)
        result["initial"] = named(ddp_model, bare_params)
        read_buffers(ddp_model, bare_buffers, result, "buffers")
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=spec["lr"])
        after = calls.fn(after_name)
        start = calls.fn(start_name) if start_name else None
        for step in range(spec["steps"]):
            RECORDER.step = step
            if start is not None:
                RECORDER.phase = "batch_start"
                calls.run(start_name, start, ddp_model, optimizer)
            RECORDER.phase = "forward"
            optimizer.zero_grad()
            out = calls.run("the wrapper's forward", ddp_model, x[step, rows])
            if step == 0 and bare_buffers:
                read_buffers(ddp_model, bare_buffers, result, "buffers1")
            loss = F.mse_loss(out, y[step, rows])
            RECORDER.phase = "backward"
            calls.run("loss.backward()", loss.backward)
            RECORDER.phase = "after_backward"
            calls.run(after_name, after, ddp_model, optimizer)
            if step == 0:
                grads = {n: p.grad for n, p in named_refs(ddp_model, bare_params).items()}
                result["grads0"] = {n: g.detach().clone() for n, g in grads.items() if g is not None}
            RECORDER.phase = "step"
            optimizer.step()
        RECORDER.phase = "done"
        result["final"] = named(ddp_model, bare_params)

    return run_scenarios(spec["models"], train)


def read_buffers(ddp_model, bare_buffers: dict, result: dict, key: str) -> None:
    """result[key] = the wrapper's buffers by the bare model's names, for the advice check
    ddp::buffers alone. A wrapper need not be an nn.Module (the official tests read only
    named_parameters(), parameters() and .module): without named_buffers the wrapped .module's
    are read, and where neither can be read result["buffers_unread"] says why, and training
    goes on, so the requirement checks of the scenario never depend on this probe."""
    if "buffers_unread" in result:
        return
    holder = ddp_model if callable(getattr(ddp_model, "named_buffers", None)) else getattr(ddp_model, "module", None)
    if not callable(getattr(holder, "named_buffers", None)):
        result["buffers_unread"] = (f"the wrapper ({type(ddp_model).__name__}) has no named_buffers() and no "
                                    f".module that has")
        return
    try:
        result[key] = named(holder, bare_buffers, "buffers")
    except Exception as exc:  # the student's named_buffers raised: this advice cannot be measured
        result["buffers_unread"] = f"reading the wrapper's buffers raised {describe(exc)}"


def named_refs(container, reference: dict) -> dict:
    """Like named() but the live parameters themselves (to read .grad)."""
    items = dict(container.named_parameters())
    for prefix in ("module.", ""):
        found = {n: items.get(prefix + n) for n in reference}
        if all(p is not None for p in found.values()):
            return found
    return reference


# -- sharded optimizer ------------------------------------------------------------------------

def state_held(optimizer) -> tuple:
    """(elements, parameters) of optimizer state held by `optimizer` and by any torch Optimizer
    reachable from its attributes (two levels deep, through lists, tuples and dicts): the
    elements of its state tensors, each tensor once, and how many parameters (state keys, each
    once) have state holding at least one tensor."""
    seen_optimizers, seen_tensors, seen_keys, total = set(), set(), set(), 0

    def children(obj):
        if isinstance(obj, dict):
            return list(obj.values())
        if isinstance(obj, (list, tuple)):
            return list(obj)
        if isinstance(obj, (torch.Tensor, str, bytes, int, float)) or obj is None:
            return []
        try:
            return list(vars(obj).values())
        except TypeError:
            return []

    def visit(obj, depth):
        nonlocal total
        if isinstance(obj, torch.optim.Optimizer) and id(obj) not in seen_optimizers:
            seen_optimizers.add(id(obj))
            # A subclass that never calls Optimizer.__init__ has no .state of its own; the
            # optimizers it holds are still visited below.
            own = getattr(obj, "state", None)
            for key, state in (own.items() if isinstance(own, dict) else ()):
                values = list(state.values()) if isinstance(state, dict) else [state]
                tensors = [t for t in values if isinstance(t, torch.Tensor)]
                if tensors:
                    seen_keys.add(id(key) if isinstance(key, torch.Tensor) else (id(obj), key))
                for t in tensors:
                    if id(t) not in seen_tensors:
                        seen_tensors.add(id(t))
                        total += t.numel()
        if depth < 3:  # attributes, then the lists and dicts they hold, then one more
            for child in children(obj):
                if not isinstance(child, torch.nn.Module):
                    visit(child, depth + 1)

    visit(optimizer, 0)
    return total, len(seen_keys)


def sharded_rank(rank: int, world_size: int, spec: dict) -> dict:
    """Each scenario: every rank builds the same model and trains it on the same batches with
    get_sharded_optimizer. Returns the final parameters and this rank's optimizer state: its
    elements and the number of parameters that have some, or, where reading it raised,
    state_unread saying why."""
    RECORDER.install()
    calls = Calls(load_submission(spec))
    scenarios = {s["name"]: s for s in spec["scenarios"]}

    def train(name, result):
        s = scenarios[name]
        model = build_model(spec["model"], spec["model_seed"])
        x, y = make_batches(spec["model"], spec["data_seed"], spec["steps"], spec["batch"])
        held_out = [p for n, p in model.named_parameters() if n in s.get("held_out", ())]
        params = [p for n, p in model.named_parameters() if n not in s.get("held_out", ())]
        RECORDER.phase = "construct"
        optimizer = calls.call("get_sharded_optimizer", params, getattr(torch.optim, s["optimizer"]), **s["kwargs"])
        for step in range(spec["steps"]):
            RECORDER.step = step
            if held_out and step == s["add_after"]:
                RECORDER.phase = "add_param_group"
                calls.run("add_param_group", optimizer.add_param_group, {"params": held_out})
            RECORDER.phase = "forward"
            if held_out:
                model.zero_grad(set_to_none=True)  # also the grads of params not yet in the optimizer
            else:
                calls.run("zero_grad", optimizer.zero_grad)
            loss = F.mse_loss(model(x[step]), y[step])
            RECORDER.phase = "backward"
            loss.backward()
            RECORDER.phase = "step"
            calls.run("the optimizer's step", optimizer.step)
        RECORDER.phase = "done"
        result["final"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        try:  # for the state checks alone: equivalence is judged on the parameters
            result["state_numel"], result["state_params"] = state_held(optimizer)
        except Exception as exc:
            result["state_unread"] = f"reading the optimizer's state raised {describe(exc)}"

    return run_scenarios(list(scenarios), train)


# -- FSDP (2026) ------------------------------------------------------------------------------

def on_device_of(params: list, *tensors) -> tuple:
    """`tensors` moved to the device of the first of `params` (unchanged when there is none)."""
    if not params:
        return tensors
    return tuple(t.to(params[0].device) for t in tensors)


def fsdp_rank(rank: int, world_size: int, spec: dict) -> dict:
    """Each scenario (a compute dtype): every rank builds the same model, wraps it with get_fsdp
    and trains it with SGD over the wrapper's parameters() on its slice of each global batch.
    Returns fsdp_gather_full_params right after wrapping, after the first step and after
    training, the numel and dtypes of parameters(), the dtypes the model's Linear/Embedding
    layers produced (when their forward still runs), the dtypes of every tensor the wrapper's
    forward produced (whatever runs it), and whose classes those layers are."""
    RECORDER.install()
    calls = Calls(load_submission(spec))
    scenarios = {s["name"]: s for s in spec["scenarios"]}

    def train(name, result):
        s = scenarios[name]
        compute_dtype = getattr(torch, s["compute_dtype"]) if s["compute_dtype"] else None
        model = build_model(spec["model"], spec["model_seed"])  # the same on every rank
        if spec["model"] == "course":  # from the submission's cs336_basics, as the official tests build it
            model, result["layers"] = course_layers(model)
        seen = set()  # output dtypes of the layers that FSDP is meant to shard
        forward_dtypes = set()  # dtypes of every tensor the wrapper's forward produced
        for layer in ("embedding", "linear1", "linear2", "lm_head"):
            getattr(model, layer).register_forward_hook(lambda m, a, out: seen.add(str(out.dtype).split(".")[-1])
                                                        if torch.is_tensor(out) else None)
        x, y = make_batches(spec["model"], spec["data_seed"], spec["steps"], spec["batch"])
        local = x.shape[1] // world_size
        rows = slice(rank * local, (rank + 1) * local)

        RECORDER.phase = "wrap"
        args = () if compute_dtype is None else (compute_dtype,)
        fsdp_model = calls.call("get_fsdp", model, *args)
        params = list(fsdp_model.parameters())
        # The official test_fsdp.py puts its data on the rank's GPU when CUDA exists, so a
        # wrapper may move the module there: the data go where its parameters went.
        x, y = on_device_of(params, x, y)
        result.update(numel=sum(p.numel() for p in params),
                      param_dtypes=sorted({str(p.dtype).split(".")[-1] for p in params}))
        RECORDER.phase = "gather"
        result["initial"] = gather_full(fsdp_model, result)
        optimizer = torch.optim.SGD(params, lr=spec["lr"])
        after = calls.fn("fsdp_on_after_backward")
        for step in range(spec["steps"]):
            RECORDER.step = step
            RECORDER.phase = "forward"
            optimizer.zero_grad()
            with DtypeWatch() as watch:  # what the forward computed in, its layers' own forward called or not
                out = calls.run("the wrapper's forward", fsdp_model, x[step, rows])
            forward_dtypes |= watch.dtypes
            loss = training_loss(spec["model"], out, y[step, rows])
            RECORDER.phase = "backward"
            calls.run("loss.backward()", loss.backward)
            RECORDER.phase = "after_backward"
            calls.run("fsdp_on_after_backward", after, fsdp_model, optimizer)
            RECORDER.phase = "step"
            optimizer.step()
            if step == 0:  # SGD: (initial - after1) / lr is the first step's gradient
                RECORDER.phase = "gather"
                result["after1"] = gather_full(fsdp_model, result)
        result["layer_dtypes"] = sorted(seen)
        result["forward_dtypes"] = sorted(forward_dtypes)
        RECORDER.phase = "gather"
        result["final"] = gather_full(fsdp_model, result)
        RECORDER.phase = "done"

    def gather_full(fsdp_model, result):
        full = calls.call("fsdp_gather_full_params", fsdp_model)
        if not hasattr(full, "items"):
            raise TypeError(f"fsdp_gather_full_params returned {type(full).__name__}, not a dict of tensors")
        result["not_tensors"] = sorted(str(k) for k, v in full.items() if not torch.is_tensor(v))
        return {str(k): v.detach().cpu().clone() for k, v in full.items() if torch.is_tensor(v)}

    return run_scenarios(list(scenarios), train)
