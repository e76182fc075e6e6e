"""The course's adapters, answered by the project's reference solutions.

`cs336_systems` here is a link to the project's reference/ package, so this directory is graded
exactly like a student's repo.
"""
from __future__ import annotations

import torch


def get_flashattention_autograd_function_pytorch() -> type:
    from cs336_systems.flash_pytorch import FlashAttentionPytorch
    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton() -> type:
    from cs336_systems.flash_triton import FlashAttentionTriton
    return FlashAttentionTriton


# 2026 names
def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    from cs336_systems.ddp import get_ddp
    return get_ddp(module)


def ddp_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from cs336_systems.ddp import ddp_on_after_backward
    return ddp_on_after_backward(model, optimizer)


# 2025 names
def get_ddp_individual_parameters(module: torch.nn.Module) -> torch.nn.Module:
    from cs336_systems.ddp import get_ddp_individual_parameters
    return get_ddp_individual_parameters(module)


def ddp_individual_parameters_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from cs336_systems.ddp import ddp_individual_parameters_on_after_backward
    return ddp_individual_parameters_on_after_backward(model, optimizer)


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float) -> torch.nn.Module:
    from cs336_systems.ddp import get_ddp_bucketed
    return get_ddp_bucketed(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from cs336_systems.ddp import ddp_bucketed_on_after_backward
    return ddp_bucketed_on_after_backward(model, optimizer)


def ddp_bucketed_on_train_batch_start(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from cs336_systems.ddp import ddp_bucketed_on_train_batch_start
    return ddp_bucketed_on_train_batch_start(model, optimizer)


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    from cs336_systems.sharded_optimizer import get_sharded_optimizer
    return get_sharded_optimizer(params, optimizer_cls, **kwargs)


# 2026: fully sharded data parallel
def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    from cs336_systems.fsdp import get_fsdp
    return get_fsdp(module, compute_dtype)


def fsdp_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from cs336_systems.fsdp import fsdp_on_after_backward
    return fsdp_on_after_backward(model, optimizer)


def fsdp_gather_full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from cs336_systems.fsdp import fsdp_gather_full_params
    return fsdp_gather_full_params(model)
