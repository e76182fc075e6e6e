"""Data-parallel training: broadcast at construction, one async all-reduce per gradient.

DDP is a plain class, not an nn.Module: it forwards calls, parameters() and named_parameters()
to the module it wraps, which the training loop and the official tests are all that use.
"""
import torch.distributed as dist
from torch import nn


class DDP:
    def __init__(self, module: nn.Module):
        self.module = module
        self.world_size = dist.get_world_size()
        self.handles = []
        for t in module.state_dict().values():  # rank 0's weights (frozen ones too) and buffers
            dist.broadcast(t, src=0)
        for p in module.parameters():  # a tied parameter is listed once
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p: nn.Parameter) -> None:
        # called inside loss.backward(), as soon as p.grad is final
        self.handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self):
        return self.module.named_parameters()

    def finish_gradient_synchronization(self) -> None:
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(self.world_size)
