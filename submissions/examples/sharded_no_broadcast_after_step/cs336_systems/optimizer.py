"""ZeRO-1: each parameter has one owner rank that keeps its optimizer state and updates it."""
import torch
import torch.distributed as dist
from torch.optim import Optimizer


class ShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.load = [0] * self.world_size  # parameter elements owned by each rank
        self.owner = {}
        self.inner = None
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        super().__init__(params, kwargs)  # calls add_param_group for every group

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in sorted(group["params"], key=lambda p: -p.numel()):  # largest first, to the least loaded rank
            r = self.load.index(min(self.load))
            self.owner[p] = r
            self.load[r] += p.numel()
            if r == self.rank:
                mine.append(p)
        local = {**group, "params": mine}
        if self.inner is None:
            self.inner = self.optimizer_cls([local], **self.kwargs)
        else:
            self.inner.add_param_group(local)

    def step(self, closure=None, **kwargs):
        loss = self.inner.step(closure, **kwargs)
        # BUG: the owners never broadcast their updated parameters to the other ranks.
        return loss
