"""Weight averages: of checkpoint files (``rnntrain average``) and during training
(``train.average``).

- ``average_checkpoints``: the arithmetic mean of the weights of several checkpoints of
  one architecture (icefall's averaging), as a checkpoint with the first one's card.
- ``WeightAverage``: kept while training, saved in every checkpoint as the part
  ``"average"`` and restored on resume, so a resumed run continues it exactly.
  ``"ema"``: after every optimizer step, avg ← d·avg + (1 − d)·w with d =
  min(train.ema_decay, (1 + n)/(10 + n)) after n updates (the early steps are not
  dominated by the initial weights); ``"last"``: the mean of the weights at the ends of
  the last ``train.average_last`` epochs. Validation scores the average, best.pt is
  chosen by that score, and inference reads the average (the card's
  ``weights = "average"``).

Every update is a fixed sequence of float32 tensor operations on the weights, which are
equal on every rank: the average is the same whatever the thread count and on every rank.
The trainer may apply a step's update later (``step_later``, then ``flush``): while the
workers compute the next step, when the weights are still the ones this step left; every
read of the average (``weights``, ``swap_in``, ``state_dict``, ``end_epoch``) flushes
first, so nothing ever sees an average that lags the weights.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from rnntrain.errors import UserError
from rnntrain.run import checkpoint as ckpt

KINDS = ("none", "ema", "last")


def average_checkpoints(paths: list, out) -> ckpt.Checkpoint:
    """Mean of the ``model`` weights of ``paths`` (same architecture and alphabet: else
    one line naming the first key or shape that differs) written to ``out`` with the
    first checkpoint's card (no training parts: a model to use or to fine-tune from)."""
    if not paths:
        raise UserError("rnntrain average: give at least one checkpoint")
    first = ckpt.read(paths[0])
    total = {k: v.to(torch.float64) for k, v in first.inference_weights().items()}
    for p in paths[1:]:
        ck = ckpt.read(p)
        if ck.card.labels != first.card.labels:
            raise UserError(f"{p}: its alphabet differs from {paths[0]}'s: cannot average")
        w = ck.inference_weights()
        for k in total:
            if k not in w:
                raise UserError(f"{p}: has no {k}, which {paths[0]} has: not the same "
                                "architecture")
            if w[k].shape != total[k].shape:
                raise UserError(f"{p}: {k} has shape {tuple(w[k].shape)}, {paths[0]}'s "
                                f"{tuple(total[k].shape)}: not the same architecture")
            total[k] += w[k].to(torch.float64)
        extra = sorted(set(w) - set(total))
        if extra:
            raise UserError(f"{p}: has {extra[0]}, which {paths[0]} lacks: not the same "
                            "architecture")
    n = len(paths)
    mean = {k: (v / n).to(first.parts["model"][k].dtype) for k, v in total.items()}
    card = dataclasses.replace(first.card, weights="model", calibration=None)  # a new model
    ckpt.save(Path(out), card, {"model": _Weights(mean)})
    return ckpt.read(out)


class _Weights:
    """A plain state dict as a Stateful part."""

    def __init__(self, sd: dict):
        self.sd = sd

    def state_dict(self) -> dict:
        return self.sd

    def load_state_dict(self, sd: dict):
        self.sd = sd


class WeightAverage:
    """The running average of a model's weights (see the module docstring)."""

    def __init__(self, model, kind: str, decay: float = 0.999, last: int = 5):
        assert kind in KINDS[1:], kind
        self.model, self.kind, self.decay, self.last = model, kind, decay, last
        self.count = 0                       # updates so far (ema: steps; last: epochs)
        self.avg = {k: v.detach().clone().float() for k, v in self._weights().items()}
        self.snaps: list[dict] = []          # "last": the weights at the last epoch ends
        self._due: float | None = None       # a ``step_later``'s factor d, not applied yet

    def _weights(self) -> dict:
        return {k: v for k, v in self.model.state_dict().items() if v.is_floating_point()}

    def step(self):
        """After an optimizer step ("ema")."""
        self.step_later()
        self.flush()

    def step_later(self):
        """``step``, applied by the next ``flush`` (or read of the average), which must
        come before the weights change again."""
        if self.kind != "ema":
            return
        self.flush()
        self._due = min(self.decay, (1 + self.count) / (10 + self.count))
        self.count += 1

    @torch.no_grad()
    def flush(self):
        """Apply a pending ``step_later`` to the weights as they are now."""
        if self._due is None:
            return
        d, self._due = self._due, None
        for k, w in self._weights().items():
            self.avg[k].mul_(d).add_(w.float(), alpha=1 - d)

    @torch.no_grad()
    def end_epoch(self):
        """After an epoch ("last")."""
        self.flush()
        if self.kind != "last":
            return
        self.snaps = (self.snaps + [{k: w.detach().float().clone()
                                     for k, w in self._weights().items()}])[-self.last:]
        self.count += 1
        for k in self.avg:
            total = self.snaps[0][k].clone()
            for s in self.snaps[1:]:
                total.add_(s[k])
            self.avg[k] = total / len(self.snaps)

    def weights(self) -> dict:
        """The averaged weights, a state dict for the model (its other entries as they
        are)."""
        self.flush()
        sd = dict(self.model.state_dict())
        for k, v in self.avg.items():
            sd[k] = v.to(sd[k].dtype)
        return sd

    def swap_in(self) -> dict:
        """Put the average into the model; → the model's own weights, for ``swap_out``."""
        own = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(self.weights())
        return own

    def swap_out(self, own: dict):
        self.model.load_state_dict(own)

    def state_dict(self) -> dict:
        self.flush()
        return {"kind": self.kind, "count": self.count,
                "avg": {k: v.cpu() for k, v in self.avg.items()},
                "snaps": [{k: v.cpu() for k, v in s.items()} for s in self.snaps]}

    def load_state_dict(self, d: dict):
        if d.get("kind") != self.kind:
            raise ValueError(f"a {d.get('kind')} average, this run keeps {self.kind}")
        dev = next(iter(self.avg.values())).device if self.avg else torch.device("cpu")
        if set(d["avg"]) != set(self.avg):
            raise ValueError("the averaged weights do not fit this model")
        self.count, self._due = int(d["count"]), None
        self.avg = {k: v.to(dev) for k, v in d["avg"].items()}
        self.snaps = [{k: v.to(dev) for k, v in s.items()} for s in d["snaps"]]
