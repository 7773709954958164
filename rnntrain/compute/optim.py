"""Optimizers and learning-rate schedules from the [optim] section."""
from __future__ import annotations

import math

import torch


def build_optimizer(ocfg, params, fused: bool = False) -> torch.optim.Optimizer:
    """fused: one kernel per update that can also skip a NaN/Inf step on the device
    (``device.masked_step``). The trainer asks for it on CUDA, where a host check would
    stall the queue, and on the CPU, where the update runs on the main thread while the
    workers wait: torch's per-tensor Adam makes ~7 passes over every tensor (1.1-1.6 ms
    a step for the default model), the fused kernel one (0.35 ms; docs/threads.md,
    "The update and the reverse"). Elementwise, so its result does not depend on the thread count; its
    rounding differs from the per-tensor update's in the last bit of a few weights."""
    params = list(params)
    if ocfg.name == "sgd":
        return torch.optim.SGD(params, lr=ocfg.lr, momentum=ocfg.momentum,
                               weight_decay=ocfg.weight_decay, fused=fused or None)
    return torch.optim.Adam(params, lr=ocfg.lr, betas=(ocfg.beta1, ocfg.beta2),
                            weight_decay=ocfg.weight_decay, fused=fused or None)


def lr_factor(ocfg, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """Multiplier of optim.lr at optimizer step ``step`` (0-based)."""
    f = 1.0
    if ocfg.warmup_steps and step < ocfg.warmup_steps:
        f = (step + 1) / ocfg.warmup_steps
    if ocfg.schedule == "cosine":
        t = min(1.0, step / max(total_steps, 1))
        floor = ocfg.min_lr / ocfg.lr
        f *= floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    elif ocfg.schedule == "step":
        f *= ocfg.step_gamma ** (step // max(steps_per_epoch * ocfg.step_epochs, 1))
    return f


def set_lr(opt: torch.optim.Optimizer, lr: float):
    for g in opt.param_groups:
        g["lr"] = lr
