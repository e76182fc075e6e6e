"""Bucketed DDP with persistent flat gradient buffers.

Each bucket owns one flat float buffer. When a parameter's gradient is final, its hook copies
grad / world_size into the bucket's slice; when the bucket's last gradient has arrived, one
async all_reduce(SUM) of the buffer is issued, while backward keeps running. After backward,
the reduced slices are copied back into .grad. Parameters are bucketed in reverse order of
registration, since their gradients become ready roughly in that order.
"""
import math

import torch
import torch.distributed as dist
from torch import nn


class _Bucket:
    def __init__(self, params):
        self.params = params
        self.offsets = [0]
        for p in params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.buffer = torch.zeros(self.offsets[-1], dtype=params[0].dtype, device=params[0].device)
        self.waiting = len(params)
        self.work = None

    def view(self, i):
        return self.buffer[self.offsets[i]:self.offsets[i + 1]]


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_size_mb: float | None):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():  # rank 0's weights (frozen ones too) and buffers everywhere
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

        cap = math.inf if bucket_size_mb is None else bucket_size_mb
        trainable = [p for p in module.parameters() if p.requires_grad]
        groups, size_mb = [[]], 0
        for p in reversed(trainable):
            nbytes = p.numel() * p.element_size()
            # BUG (deliberate): bytes added to a megabyte counter, so every parameter overflows
            # the cap on its own and each bucket holds one parameter.
            if groups[-1] and size_mb + nbytes > cap:
                groups.append([])
                size_mb = 0
            groups[-1].append(p)
            size_mb += nbytes
        self.buckets = [_Bucket(g) for g in groups if g]
        self.slot = {}
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self.slot[p] = (b, i)
                p.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, p):
        bucket, i = self.slot[p]
        bucket.view(i).copy_(p.grad.reshape(-1)).div_(self.world_size)
        bucket.waiting -= 1
        if bucket.waiting == 0:
            bucket.work = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM, async_op=True)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def start_batch(self):
        for b in self.buckets:
            b.waiting, b.work = len(b.params), None

    def sync_gradients(self):
        for b in self.buckets:
            if b.work is None:  # some gradient never arrived: still reduce, in the same order everywhere
                b.work = dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, async_op=True)
        for b in self.buckets:
            b.work.wait()
            for i, p in enumerate(b.params):
                if p.grad is not None:
                    p.grad.copy_(b.view(i).view_as(p))
        self.start_batch()
