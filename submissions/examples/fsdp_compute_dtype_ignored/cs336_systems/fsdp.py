"""Fully sharded data parallelism (FSDP, ZeRO stage 3) for CS336 assignment 2 (2026 edition).

DDP keeps a full copy of the model, its gradients and its optimizer state on every rank. FSDP
keeps only 1/world_size of each: every large parameter is flattened, padded and cut into
world_size equal shards, and rank r owns shard r. The optimizer is built over the shards, so
its state is sharded too. A layer needs its full weight only while it computes, so:

    forward:   all-gather the layer's shards into the full weight, just before the layer runs
    backward:  the full weight's gradient (a local-batch gradient on each rank) is summed over
               the ranks and each rank keeps its own slice, divided by world_size: the average
    step:      each rank updates its shard of the master weights with its shard of the grads

    model = get_fsdp(module, compute_dtype=torch.bfloat16)     # or None: compute in fp32
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the local shards (+ replicated)
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()      # gradient reductions are launched in here
        fsdp_on_after_backward(model, optimizer)                # wait for them, then average
        optimizer.step()
    full = fsdp_gather_full_params(model)    # {"fc1.weight": full tensor, ...}, for checking

Which parameters are sharded: every trainable parameter that belongs directly to an nn.Linear
or nn.Embedding, weights AND biases, because one rule is simpler than two and flatten-and-pad
costs a bias nothing. Everything else (norm gains, a free-standing scale, frozen parameters) is
replicated like DDP: every rank holds it whole and its gradient is all-reduced and averaged.
Those are small; real FSDP shards them too, by flattening a whole block's parameters into one.

Mixed precision: shards (the master weights) and the optimizer stay fp32. With compute_dtype
set, a shard is cast before it is gathered (half the bytes on the wire) and the layer computes
in compute_dtype; the gradient is upcast to fp32 before it is reduced, so summing over ranks
cannot overflow or lose the small contributions. The wrapper returns fp32 outputs, so the loss
is reduced in fp32.

Simplifications, each a real FSDP feature: the full weight a layer gathered is kept until
backward has used it (real FSDP frees it after forward and gathers again in backward, trading
communication for memory); gathers are not prefetched (real FSDP gathers layer i+1 while
layer i computes); one collective per parameter, not one per flattened block of parameters.

Limitations: one backward per optimizer step (as in reference/ddp.py: a second backward would
all-reduce the replicated grads again); a sharded parameter must be used through its layer's
forward, since the full tensor exists only while that layer runs (code that reads
`embedding.weight` directly, say for a tied output head, finds no attribute).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SHARDED_MODULES = (nn.Linear, nn.Embedding)


class Shard:
    """Bookkeeping for one sharded parameter: its full shape and how it was cut.

    The full tensor is flattened and zero-padded to a multiple of world_size, so every rank's
    shard has the same length (collectives want equal pieces); rank r holds elements
    [r * chunk, (r + 1) * chunk) of it. `param` is the rank's shard, an fp32 nn.Parameter:
    the thing the optimizer updates.
    """

    def __init__(self, full: torch.Tensor, rank: int, world_size: int):
        self.shape, self.numel = full.shape, full.numel()
        self.world_size, self.rank = world_size, rank
        self.chunk = -(-self.numel // world_size)  # ceil division
        flat = torch.zeros(self.chunk * world_size, dtype=torch.float32)
        flat[:self.numel] = full.detach().flatten()
        self.param = nn.Parameter(flat[rank * self.chunk:(rank + 1) * self.chunk].clone())

    def gather(self, dtype=None) -> torch.Tensor:
        """The full tensor, rebuilt from every rank's shard (a collective: all ranks call it)."""
        # all_gather into a list works on every backend; all_gather_into_tensor (one flat
        # output, no copy) was missing on gloo in older torch and is deprecated in newer.
        local = self.param.detach().to(dtype or torch.float32)  # cast first: fewer bytes sent
        pieces = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(pieces, local)
        return torch.cat(pieces)[:self.numel].view(self.shape)

    def start_reduce(self, full_grad: torch.Tensor):
        """Launch the sum of the full gradient over ranks; finish() keeps this rank's slice."""
        # The real collective is reduce_scatter (each rank receives only its summed slice: half
        # the traffic of an all-reduce). Gloo lacked it in older torch, so: all_reduce the
        # whole padded gradient, then slice. Same numbers, more bytes. In fp32: see the top.
        flat = torch.zeros(self.chunk * self.world_size, dtype=torch.float32)
        flat[:self.numel] = full_grad.detach().flatten()
        return dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True), flat

    def finish(self, flat: torch.Tensor) -> torch.Tensor:
        # Gloo has no ReduceOp.AVG: the average is the sum divided by world_size.
        return flat[self.rank * self.chunk:(self.rank + 1) * self.chunk] / self.world_size


class _GatherForCompute(torch.autograd.Function):
    """shard -> full weight in forward; full weight's grad -> async reduction in backward.

    Backward returns no gradient for the shard: the reduction is still in flight. The wrapper
    collects it in finish_gradient_synchronization() and adds it to shard.grad then, so the
    reductions overlap with the rest of backward, as DDP's all-reduces do.
    """

    @staticmethod
    def forward(ctx, shard_param, shard: Shard, fsdp: "FSDP"):
        ctx.shard, ctx.fsdp = shard, fsdp
        # BUG (deliberate): compute_dtype is never used; the weights are gathered in float32.
        return shard.gather()

    @staticmethod
    def backward(ctx, full_grad):
        ctx.fsdp._pending.append((ctx.shard, *ctx.shard.start_reduce(full_grad)))
        return None, None, None


class _GatheredLayer(nn.Module):
    """A sharded Linear or Embedding, computed from its gathered weights here."""

    def __init__(self, layer: nn.Module, fsdp: "FSDP"):
        super().__init__()
        self.layer = layer
        self.__dict__["fsdp"] = fsdp  # not a submodule: the wrapper holds this module

    def forward(self, x):
        full = {name: _GatherForCompute.apply(shard.param, shard, self.fsdp)
                for name, shard in self.layer._fsdp_shards.items()}
        if isinstance(self.layer, nn.Embedding):
            return F.embedding(x, full["weight"], self.layer.padding_idx)
        return F.linear(x, full["weight"], full.get("bias", getattr(self.layer, "bias", None)))


class FSDP(nn.Module):
    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._pending: list = []              # (Shard, work, flat grad) launched in backward
        self._pending_replicated: list = []   # (work, grad) launched by grad hooks

        # Shard rank 0's values, as DDP broadcasts them: the ranks need not be seeded alike.
        # Buffers too, since they take part in forward.
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

        # The original names, taken before any renaming, for gather_full_params. A tied
        # parameter is listed once, under its first name, as module.named_parameters() does.
        original = list(module.named_parameters())

        # Swap each sharded parameter for its shard, registered on the same layer as
        # "<name>_shard" (so model.named_parameters() still says where it lives). A parameter
        # tied between two layers gets one Shard, registered on both (parameters() yields it
        # once); each layer gathers it for its own forward and both reductions add to its grad.
        shards: dict[int, Shard] = {}
        for layer in module.modules():
            if not isinstance(layer, SHARDED_MODULES):
                continue
            layer._fsdp_shards = {}
            for name, p in list(layer.named_parameters(recurse=False)):
                if not p.requires_grad:
                    continue  # frozen: no grad to reduce, so keep it whole (replicated)
                shard = shards.setdefault(id(p), Shard(p, self.rank, self.world_size))
                del layer._parameters[name]
                layer.register_parameter(f"{name}_shard", shard.param)
                layer._fsdp_shards[name] = shard

        self._sources = {name: shards.get(id(p), p) for name, p in original}
        # Each sharded layer is swapped for a module of our own that computes its function from the
        # gathered weights: the layer's own forward is never called.
        for parent in list(module.modules()):
            for child_name, child in list(parent.named_children()):
                if getattr(child, "_fsdp_shards", None):
                    setattr(parent, child_name, _GatheredLayer(child, self))
        # Everything else is replicated, and its gradient all-reduced as in DDP, launched
        # from inside backward the moment autograd has accumulated it.
        for p in module.parameters():
            if p.requires_grad and id(p) not in {id(s.param) for s in shards.values()}:
                p.register_post_accumulate_grad_hook(self._reduce_replicated)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # -- backward: reduce, then keep our slice -----------------------------------------------

    def _reduce_replicated(self, p: nn.Parameter) -> None:
        self._pending_replicated.append((dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True), p.grad))

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reductions launched in backward; leave averaged grads on the shards."""
        for shard, work, flat in self._pending:
            work.wait()
            grad = shard.finish(flat)
            # += rather than =: a tied parameter gets one reduction per use.
            shard.param.grad = grad if shard.param.grad is None else shard.param.grad + grad
        for work, grad in self._pending_replicated:
            work.wait()
            grad.div_(self.world_size)
        self._pending.clear()
        self._pending_replicated.clear()

    # -- checking ----------------------------------------------------------------------------

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{original name: full fp32 tensor}; a collective, so every rank must call it."""
        return {name: src.gather() if isinstance(src, Shard) else src.detach().clone()
                for name, src in self._sources.items()}


# Adapter-style entry points, named like the course's 2026 tests/adapters.py.

def get_fsdp(module: nn.Module, compute_dtype: torch.dtype | None = None) -> nn.Module:
    return FSDP(module, compute_dtype)


def fsdp_on_after_backward(model: nn.Module, optimizer) -> None:
    model.finish_gradient_synchronization()


def fsdp_gather_full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return model.gather_full_params()
