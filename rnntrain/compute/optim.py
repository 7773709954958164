"""Optimizers and learning-rate schedules from the [optim] section."""
from __future__ import annotations

import inspect
import math

import torch


def build_optimizer(ocfg, params, fused: bool = False) -> torch.optim.Optimizer:
    """fused: one kernel per update that can also skip a NaN/Inf step on the device
    (``device.masked_step``). The trainer asks for it on CUDA, where a host check would
    stall the queue, and on the CPU, where the update runs on the main thread while the
    workers wait: torch's per-tensor Adam makes ~7 passes over every tensor (1.1-1.6 ms
    a step for the default model), the fused kernel one (0.35 ms; docs/threads.md,
    "The update and the reverse"). Elementwise, so its result does not depend on the thread count; its
    rounding differs from the per-tensor update's in the last bit of a few weights.
    The classes are torch's, less the torch.compile wrappers (``eager``)."""
    params = list(params)
    if ocfg.name == "sgd":
        return SGD(params, lr=ocfg.lr, momentum=ocfg.momentum,
                   weight_decay=ocfg.weight_decay, fused=fused or None)
    return Adam(params, lr=ocfg.lr, betas=(ocfg.beta1, ocfg.beta2),
                weight_decay=ocfg.weight_decay, fused=fused or None)


# torch.optim's methods that torch wraps for torch.compile: a wrapper imports torch._dynamo
# on its first call (1-2.6 s on 2 cores, ~10-20 % of a short run's time to accuracy:
# docs/accuracy.md, "FSDD: where the seconds before the first validation go")
_DYNAMO_WRAPPED = ("add_param_group", "state_dict", "load_state_dict", "zero_grad")


def eager(cls: type) -> type:
    """``cls`` (a torch.optim optimizer) without the torch.compile wrappers around its
    methods: the same class otherwise (a subclass: the same ``__init__``, state, state
    dict format and update kernels, so the same bits), but it never imports torch._dynamo,
    which the wrappers import on first use, although a run that is not compiled never
    needs it. ``step`` sets the grad mode as torch's wrapper does (off, since these
    optimizers are not ``differentiable``) and calls torch's own step. Where torch's
    methods are not the wrappers this expects (another torch version), ``cls`` itself."""
    attrs = {}
    for name in _DYNAMO_WRAPPED:
        wrapped = getattr(torch.optim.Optimizer, name)
        raw = inspect.unwrap(wrapped)
        if raw is wrapped or getattr(cls, name) is not wrapped:
            return cls  # not the wrapper, or the class overrides it
        attrs[name] = raw
    raw_step = inspect.unwrap(cls.step)
    if raw_step is cls.step or raw_step.__qualname__ != f"{cls.__name__}.step":
        return cls

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return raw_step(self, closure)

    step.__doc__ = raw_step.__doc__
    attrs["step"] = step
    attrs["__doc__"] = f"torch.optim.{cls.__name__} without the torch.compile wrappers " \
                       "(``rnntrain.compute.optim.eager``)."
    return type(cls.__name__, (cls,), attrs)


Adam, SGD = eager(torch.optim.Adam), eager(torch.optim.SGD)  # what build_optimizer builds


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
