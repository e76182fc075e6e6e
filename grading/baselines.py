"""What the distributed checks hold the ranks to: single-process training of the same models on
the same batches (the DDP and sharded-optimizer checks, grading/checks/test_distributed.py; the
FSDP checks, test_fsdp.py), the tolerance of every comparison, and the few helpers that read and
compare parameters. The diagnoses (grading/diagnoses/ddp.py, fsdp.py) explain a difference from
the same baselines; both import this module, neither imports the other's.

Every comparison runs on the CPU in float32 over a few training steps, hence one tolerance
(ATOL, RTOL) for all of them.
"""
import contextlib

import torch
import torch.nn.functional as F

from fa2_sandbox.wire import requests
from fa2_sandbox.wire.training import build_model, make_batches, training_loss

WORLD_SIZE = 2
ATOL, RTOL = 1e-5, 1e-4  # float32 on the CPU, a few steps


def pick(tensors, scenario, rank, kind):
    """The tensors a rank sent for `scenario` and `kind` ("after1", "final", ...), by parameter name."""
    prefix = f"{scenario}/{rank}/{kind}/"
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


@contextlib.contextmanager
def one_thread():
    """The ranks run with one thread each; the baselines do too, so matmuls round alike."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def close(a, b) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=ATOL, rtol=RTOL)


def max_diff(got: dict, want: dict):
    """(largest absolute difference, parameter name) over the parameters of `want`."""
    diffs = [((got[n].double() - want[n].double()).abs().max().item() if got[n].shape == want[n].shape
              else float("inf"), n) for n in want]
    return max(diffs) if diffs else (0.0, "")


def names(items) -> str:
    items = list(items)
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")


# -- the single-process baselines the ranks are held to -------------------------------------

DDP_STEPS, DDP_BATCH, DDP_LR = 5, 8, 0.1  # the global batch; each rank gets DDP_BATCH // WORLD_SIZE rows


def train_single(model_name, seed, data_seed, lr=DDP_LR, rows=slice(None), init=None):
    """Single-process SGD from rank 0's initialisation (or `init`) on rows of each global batch."""
    with one_thread():
        model = build_model(model_name, seed)
        if init is not None:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(init[n])
        x, y = make_batches(model_name, data_seed, DDP_STEPS, DDP_BATCH)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(DDP_STEPS):
            optimizer.zero_grad()
            F.mse_loss(model(x[step, rows]), y[step, rows]).backward()
            optimizer.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def ddp_first_step_grads(model_name, seed, data_seed, rows=slice(None)):
    with one_thread():
        model = build_model(model_name, seed)
        x, y = make_batches(model_name, data_seed, DDP_STEPS, DDP_BATCH)
        F.mse_loss(model(x[0, rows]), y[0, rows]).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


FSDP_MODEL = "course"


FSDP_STEPS, FSDP_BATCH, FSDP_LR = 3, 20, 0.01  # the official test_fsdp.py's steps, batch and SGD rate


PRECISIONS = {"fp32": None, "fp16": "float16"}


def cast_compute(model, dtype):
    """Make each Linear/Embedding compute with its weight cast to `dtype` from the fp32 parameter
    (autograd casts the gradient back), as the official tests' _apply_mixed_precision_hooks do."""
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.forward = lambda x, m=layer: F.linear(x, m.weight.to(dtype))
        elif isinstance(layer, torch.nn.Embedding):
            layer.forward = lambda x, m=layer: F.embedding(x, m.weight.to(dtype), m.padding_idx)


def train_baseline(session, dtype=None, lr=FSDP_LR, steps=FSDP_STEPS, rows=slice(None)):
    """Single-process SGD on rows of each global batch, computing in `dtype` (None: fp32)."""
    with one_thread():
        model = build_model(FSDP_MODEL, session.seed)
        if dtype is not None:
            cast_compute(model, getattr(torch, dtype))
        x, y = make_batches(FSDP_MODEL, requests.data_seed("fsdp", session.seed), FSDP_STEPS, FSDP_BATCH)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            optimizer.zero_grad()
            training_loss(FSDP_MODEL, model(x[step, rows]), y[step, rows]).backward()
            optimizer.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def initial_params(session):
    return {n: p.detach().clone() for n, p in build_model(FSDP_MODEL, session.seed).named_parameters()}


def by_original_name(got: dict, want: dict) -> dict:
    """got renamed to want's names: exact, or a unique key ending in ".<name>" (a wrapper prefix)."""
    out = {}
    for n in want:
        if n in got:
            out[n] = got[n]
        elif len(found := [k for k in got if k.endswith("." + n)]) == 1:
            out[n] = got[found[0]]
    return out


def fsdp_first_step_grads(session, dtype, rows=slice(None)):
    """The gradient SGD used in the first step, read off the parameters: (p0 - p1) / lr."""
    init, after = initial_params(session), train_baseline(session, dtype, steps=1, rows=rows)
    return {n: (init[n] - after[n]) / FSDP_LR for n in init}
