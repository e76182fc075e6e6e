"""Optimizer state sharding (ZeRO stage 1) for CS336 assignment 2.

With plain data parallelism every rank keeps the full optimizer state; for AdamW that is two
extra copies of the model (exp_avg and exp_avg_sq). But after the gradient all-reduce every
rank would compute the *same* update, so the work and the state can be split: each parameter
gets one owner rank, only the owner keeps its state and updates it, and then the owner
broadcasts the new values so all ranks hold the full, identical model again.

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    ...
    loss.backward(); ddp_model.finish_gradient_synchronization()   # grads equal on all ranks
    optimizer.step()                                                # update own shard, broadcast

Memory per rank drops to about 1/world_size of the optimizer state; the price is one
broadcast of the parameters per step.

Caveat: the outer optimizer's state_dict() holds no state (it lives in the per-rank inner
optimizers), so checkpointing would need a gather step that this reference does not implement.
"""
import torch
import torch.distributed as dist
from torch.optim import Optimizer


class ShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls: type[Optimizer], **kwargs):
        self.optimizer_cls = optimizer_cls
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.owner: dict[torch.Tensor, int] = {}        # parameter -> rank that updates it
        self.numel_per_rank = [0] * self.world_size
        self.local_optimizer: Optimizer | None = None
        self._local_groups: list[dict] = []
        # Optimizer.__init__ calls self.add_param_group for each group, which assigns owners
        # and collects this rank's share. The inner optimizer can only be built afterwards.
        super().__init__(params, defaults=kwargs)
        self.local_optimizer = optimizer_cls(self._local_groups, **kwargs)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)   # validates, fills defaults, appends to param_groups
        group = self.param_groups[-1]

        # Greedy balance by numel, largest first: each parameter goes to the rank holding the
        # fewest elements so far. It depends only on shapes and order, so every rank computes
        # the same assignment without communicating. Loads carry over between groups.
        for p in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
            r = min(range(self.world_size), key=lambda r: self.numel_per_rank[r])
            self.owner[p] = r
            self.numel_per_rank[r] += p.numel()

        # The inner group mirrors the outer one (same hyperparameters) but holds only our
        # parameters. It may be empty; keeping it keeps group indices aligned with the outer.
        local_group = {k: v for k, v in group.items() if k != "params"}
        local_group["params"] = [p for p in group["params"] if self.owner[p] == self.rank]
        if self.local_optimizer is None:
            self._local_groups.append(local_group)           # still inside __init__
        else:
            self.local_optimizer.add_param_group(local_group)

    def step(self, closure=None, **kwargs):
        # Users and LR schedulers edit the outer param_groups; pass their hyperparameters on.
        for outer, inner in zip(self.param_groups, self.local_optimizer.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        loss = self.local_optimizer.step(closure, **kwargs)

        # Every rank now has fresh values for its own parameters only; the owner sends each
        # one to everybody. (Flattening the parameters per owner would mean fewer, larger
        # broadcasts; one per parameter keeps the idea plain.)
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self.owner[p])
        return loss


def get_sharded_optimizer(params, optimizer_cls: type[Optimizer], **kwargs) -> Optimizer:
    return ShardedOptimizer(params, optimizer_cls, **kwargs)


def state_numel(optimizer: Optimizer) -> int:
    """Number of optimizer-state elements held on this rank (tensors only, e.g. exp_avg).

    For a ShardedOptimizer this counts its inner, per-rank optimizer; for any other optimizer,
    its own state. Used to check that each rank holds about 1/world_size of the state.
    """
    inner = optimizer.local_optimizer if isinstance(optimizer, ShardedOptimizer) else optimizer
    return sum(v.numel() for s in inner.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))
