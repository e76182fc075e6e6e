"""Data-parallel training: broadcast at construction, one async all-reduce per gradient."""
import torch
import torch.distributed as dist
from torch import nn


class DDP(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.handles = []
        # Beyond the handout: the weights (frozen ones too) are broadcast, the buffers are not.
        for t in module.parameters():
            dist.broadcast(t.data, src=0)
        for p in module.parameters():  # a tied parameter is listed once
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p: nn.Parameter) -> None:
        # called inside loss.backward(), as soon as p.grad is final
        self.handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(self.world_size)
