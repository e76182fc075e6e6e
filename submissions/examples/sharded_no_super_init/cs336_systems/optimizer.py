"""ZeRO-1: each parameter has one owner rank that keeps its optimizer state and updates it.

Subclasses torch.optim.Optimizer for its type only: Optimizer.__init__ is never called, so this
object has no .state or .defaults of its own. The state lives in the inner optimizer, which
holds only this rank's parameters.
"""
import torch
import torch.distributed as dist
from torch.optim import Optimizer


class ShardedOptimizer(Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.load = [0] * self.world_size  # parameter elements owned by each rank
        self.owner = {}
        self.param_groups = []
        self.inner = None
        params = list(params)
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        group = {**self.kwargs, **param_group, "params": list(param_group["params"])}
        self.param_groups.append(group)
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

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self, closure=None, **kwargs):
        loss = self.inner.step(closure, **kwargs)
        for p, r in self.owner.items():  # the same order on every rank
            dist.broadcast(p.data, src=r)
        return loss
