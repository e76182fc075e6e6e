from __future__ import annotations

from typing import Type

import torch


def get_flashattention_autograd_function_pytorch() -> Type:
    raise NotImplementedError


def get_flashattention_autograd_function_triton() -> Type:
    raise NotImplementedError


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    raise NotImplementedError


def ddp_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    raise NotImplementedError


def get_sharded_optimizer(params, optimizer_cls: Type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    raise NotImplementedError


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    from cs336_systems.fsdp import get_fsdp
    return get_fsdp(module, compute_dtype)


def fsdp_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from cs336_systems.fsdp import fsdp_on_after_backward
    return fsdp_on_after_backward(model, optimizer)


def fsdp_gather_full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from cs336_systems.fsdp import fsdp_gather_full_params
    return fsdp_gather_full_params(model)
