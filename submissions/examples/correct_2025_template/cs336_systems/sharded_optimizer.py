"""Optimizer state sharding: every rank steps only the parameters it owns, then owners broadcast.

Owners are assigned greedily in the order parameters arrive (each to the rank with the fewest
elements so far), and each owner's parameters travel in one flat broadcast per step.
"""
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.owned_numel = [0] * self.world_size
        self.by_owner = [[] for _ in range(self.world_size)]
        self.local = None
        self.pending_groups = []
        super().__init__(params, kwargs)
        self.local = optimizer_cls(self.pending_groups, **kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            owner = min(range(self.world_size), key=self.owned_numel.__getitem__)
            self.owned_numel[owner] += p.numel()
            self.by_owner[owner].append(p)
            if owner == self.rank:
                mine.append(p)
        shard = {key: value for key, value in group.items() if key != "params"}
        shard["params"] = mine
        if self.local is None:
            self.pending_groups.append(shard)
        else:
            self.local.add_param_group(shard)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        for outer, inner in zip(self.param_groups, self.local.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        loss = self.local.step(closure, **kwargs)
        for owner, params in enumerate(self.by_owner):
            if not params:
                continue
            flat = _flatten_dense_tensors([p.data for p in params])
            dist.broadcast(flat, src=owner)
            for p, value in zip(params, _unflatten_dense_tensors(flat, params)):
                p.data.copy_(value)
        return loss
