"""Call an attention autograd.Function the way the course's tests do, and collect what it gives.

Runs in the submission's process (the runner) and in the project's own tests. It only gathers
tensors; judging them is the harness's job.
"""
import torch


def find_lse(output: torch.Tensor, q: torch.Tensor):
    """The saved tensors of shape q.shape[:-1], as the course's tests look for L."""
    node = output.grad_fn
    saved = getattr(node, "saved_tensors", ()) if node is not None else ()
    return [t for t in saved if isinstance(t, torch.Tensor) and t.shape == q.shape[:-1]]


def forward(cls, q, k, v, is_causal):
    """Forward only. Returns (o, lse_candidates) with o still attached to the graph."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = cls.apply(q, k, v, is_causal)
    return (q, k, v), o, find_lse(o, q)


def backward(inputs, o, do):
    """Backward from dO; returns dq, dk, dv (None where the submission gave none)."""
    o.backward(do)
    return tuple(t.grad for t in inputs)


def as_returned(t):
    """A copy of a tensor the student's code returned, to be judged: made before any more of its
    code runs (the backward, the next call), since a thread of its own could rewrite the returned
    tensor later. On CUDA the copy queues behind the kernels already on the current stream; a
    caller that synchronizes first (serve.op_flash) copies what every stream had written."""
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def run_flash(cls, q, k, v, do, is_causal, copies=True) -> dict:
    """Forward and backward in one go; used by the project's tests and the timed calls. With
    `copies`, o and L are copied as the forward returned them and the gradients as the backward
    did (as_returned; on CUDA the copies queue behind the call's kernels on the current stream)."""
    keep = as_returned if copies else (lambda t: t)
    inputs, o, lse = forward(cls, q, k, v, is_causal)
    returned = {"o": keep(o.detach()), "L": keep(lse[0].detach()) if len(lse) == 1 else None, "n_lse": len(lse)}
    dq, dk, dv = backward(inputs, o, do)
    return {**returned, "dq": keep(dq), "dk": keep(dk), "dv": keep(dv)}
