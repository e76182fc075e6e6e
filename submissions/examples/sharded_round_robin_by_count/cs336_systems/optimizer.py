"""ZeRO-1: each parameter has one owner rank that keeps its optimizer state and updates it."""
import torch
import torch.distributed as dist
from torch.optim import Optimizer


class ShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.assigned = 0  # parameters given an owner so far, over all groups
        self.owner = {}
        self.inner = None
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        super().__init__(params, kwargs)  # calls add_param_group for every group

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:  # beyond the handout: round-robin by count, whatever the sizes
            r = self.assigned % self.world_size
            self.assigned += 1
            self.owner[p] = r
            if r == self.rank:
                mine.append(p)
        local = {**group, "params": mine}
        if self.inner is None:
            self.inner = self.optimizer_cls([local], **self.kwargs)
        else:
            self.inner.add_param_group(local)

    def step(self, closure=None, **kwargs):
        loss = self.inner.step(closure, **kwargs)
        for p, r in self.owner.items():  # the same order on every rank
            dist.broadcast(p.data, src=r)
        return loss
