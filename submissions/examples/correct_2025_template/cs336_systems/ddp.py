"""DDP for assignment 2 (2025 handout): one all-reduce per parameter, or per bucket."""
import torch
import torch.distributed as dist
from torch import nn


def _sync_initial_state(module):
    """Every rank starts from rank 0's parameters (frozen ones included) and buffers."""
    with torch.no_grad():
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)


class DDPIndividualParameters(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.works = []
        _sync_initial_state(module)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p):
        p.grad.div_(self.world_size)  # the sum of grad / world_size is the average
        self.works.append(dist.all_reduce(p.grad, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        while self.works:
            self.works.pop().wait()


class DDPBucketed(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        _sync_initial_state(module)
        limit = float("inf") if bucket_size_mb is None else bucket_size_mb * 2**20
        self.buckets, current, used = [], [], 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            if current and used + p.numel() * p.element_size() > limit:
                self.buckets.append(current)
                current, used = [], 0
            current.append(p)
            used += p.numel() * p.element_size()
        if current:
            self.buckets.append(current)
        self.bucket_of = {p: b for b, ps in enumerate(self.buckets) for p in ps}
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self._ready)
        self.reset()

    def reset(self):
        self.ready = [0] * len(self.buckets)
        self.pending = {}

    def _ready(self, p):
        b = self.bucket_of[p]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):
            self._send(b)

    def _send(self, b):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.buckets[b]])
        self.pending[b] = (dist.all_reduce(flat, async_op=True), flat)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for b in range(len(self.buckets)):
            if b not in self.pending:
                self._send(b)
        for b in range(len(self.buckets)):
            work, flat = self.pending[b]
            work.wait()
            for p, g in zip(self.buckets[b], torch.split(flat / self.world_size, [p.numel() for p in self.buckets[b]])):
                if p.grad is not None:
                    p.grad.copy_(g.view_as(p))
        self.reset()
