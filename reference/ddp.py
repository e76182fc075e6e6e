"""Data-parallel training wrappers: the two DDP flavours of CS336 assignment 2.

Every rank holds a full copy of the model and trains on its own slice of the batch. If the
ranks start with identical weights and each step averages their gradients, every rank takes
the identical optimizer step, and (because the loss is a mean over equal slices) that step is
the one a single process would take on the whole batch.

Both wrappers overlap communication with the backward pass: a gradient is sent off with an
async all_reduce as soon as autograd has finished accumulating it, while earlier layers are
still being differentiated. The training loop then calls finish_gradient_synchronization()
after loss.backward() and before optimizer.step():

    model = DDPBucketed(module, bucket_size_mb=25)      # or DDPIndividualParameters(module)
    for x, y in batches:
        model.on_train_batch_start()                    # bucketed only; a no-op otherwise
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()                 # all-reduces are launched in here
        model.finish_gradient_synchronization()         # wait for them, then average
        optimizer.step()

Tied weights: iterating module.parameters() yields a shared Parameter once, and autograd sums
both of its uses into one .grad before its post-accumulate hook fires, so it is hooked and
reduced exactly once. Frozen parameters (requires_grad=False) get no grad and no hook, but
are broadcast with the rest so every rank computes the same forward.

Limitation: one backward per optimizer step. Gradient accumulation over several backwards
would all-reduce (and, bucketed, re-launch) on each one; real DDP offers no_sync() for that.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def _broadcast_from_rank0(module: nn.Module) -> None:
    """Make every rank start from rank 0's parameters AND buffers (buffers affect forward)."""
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)  # .data: an in-place write autograd need not track


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]  # deduplicates tied params


class DDPIndividualParameters(nn.Module):
    """One async all_reduce per parameter, launched the moment its gradient is ready."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        _broadcast_from_rank0(module)
        for p in _trainable(module):
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        # Runs inside loss.backward(): communication for this grad overlaps with the
        # computation of the remaining ones. Gloo has no ReduceOp.AVG, so sum now, divide later.
        handle = dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True)
        self._pending.append((handle, p.grad))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        self._pending.clear()

    def finish_gradient_synchronization(self) -> None:
        for handle, grad in self._pending:
            handle.wait()
            grad.div_(self.world_size)
        self._pending.clear()


class DDPBucketed(nn.Module):
    """Gradients grouped into buckets of at most bucket_size_mb; one all_reduce per bucket.

    Per-parameter all-reduces pay a fixed launch/latency cost each; a model with hundreds of
    small tensors spends more on that than on bytes. Buckets amortise it while still
    overlapping with backward: a bucket is sent as soon as its last gradient is ready.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float | None):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        _broadcast_from_rank0(module)

        # Gradients become ready roughly in reverse order of definition (the last layer's
        # first), so fill buckets in that order: early buckets complete early in backward.
        # A parameter larger than the limit simply gets a bucket of its own.
        limit = float("inf") if bucket_size_mb is None else bucket_size_mb * 1024**2
        self.buckets: list[list[nn.Parameter]] = []
        current, current_bytes = [], 0
        for p in reversed(_trainable(module)):
            nbytes = p.numel() * p.element_size()
            if current and current_bytes + nbytes > limit:
                self.buckets.append(current)
                current, current_bytes = [], 0
            current.append(p)
            current_bytes += nbytes
        if current:
            self.buckets.append(current)

        self._bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        for p in self._bucket_of:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        self.on_train_batch_start()

    def on_train_batch_start(self) -> None:
        self._num_ready = [0] * len(self.buckets)
        self._in_flight: dict[int, tuple[dist.Work, torch.Tensor]] = {}

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        b = self._bucket_of[p]
        self._num_ready[b] += 1
        if self._num_ready[b] == len(self.buckets[b]):
            self._launch(b)

    def _launch(self, b: int) -> None:
        # Flattening copies the grads into one contiguous buffer: one collective, not many.
        # A grad that is None (parameter unused this step) contributes zeros.
        flat = _flatten_dense_tensors(
            [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[b]])
        self._in_flight[b] = (dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True), flat)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        # Buckets holding a parameter that got no grad this step never filled up. Launch them
        # now, in bucket order, so every rank issues the same collectives in the same order
        # (that needs the same parameters to be unused on every rank, as in real DDP).
        for b in range(len(self.buckets)):
            if b not in self._in_flight:
                self._launch(b)
        for b, (handle, flat) in self._in_flight.items():
            handle.wait()
            flat.div_(self.world_size)
            params = self.buckets[b]
            synced = _unflatten_dense_tensors(flat, params)  # views of flat, shaped like params
            for p, g in zip(params, synced):
                if p.grad is not None:
                    p.grad.copy_(g)
        self.on_train_batch_start()


# Adapter-style entry points, named like the course's tests/adapters.py.

def get_ddp_individual_parameters(module: nn.Module) -> nn.Module:
    return DDPIndividualParameters(module)


def ddp_individual_parameters_on_after_backward(ddp_model: nn.Module, optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: nn.Module, bucket_size_mb: float | None) -> nn.Module:
    return DDPBucketed(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: nn.Module, optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: nn.Module, optimizer) -> None:
    ddp_model.on_train_batch_start()


# The 2026 edition of the assignment has a single DDP adapter: the individual-parameters one.

def get_ddp(module: nn.Module) -> nn.Module:
    return DDPIndividualParameters(module)


def ddp_on_after_backward(ddp_model: nn.Module, optimizer) -> None:
    ddp_model.finish_gradient_synchronization()
