"""The training loop's state: where the run is, what it has achieved, what it carries over.

One typed definition of the keys a checkpoint's ``"state"`` holds, a resumed run starts
from, rank 0 broadcasts at start (``Exchange.sync_start``) and ``status.json`` reports.
Everything else a resumed run needs is derived from it (plans and random draws are
functions of seed, epoch and batch index) or lives in the model and optimizer state.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields


@dataclass
class TrainState:
    epoch: int = 0             # the epoch in progress (0-based)
    pos: int = 0               # batches of that epoch already trained
    step: int = 0              # optimizer steps so far (all epochs)
    best_ler: float = math.inf   # best validation label error rate ...
    best_loss: float = math.inf  # ... and its loss (ties in LER go to lower loss)
    since_best: int = 0        # validations without improvement (early-stopping patience)
    bad_in_row: int = 0        # NaN/Inf steps in a row at the last check (faults.BadSteps)
    bad_total: int = 0         # NaN/Inf steps skipped so far
    # fp16 only: the dynamic loss scale (``device.LossScaler.state_dict()``), so that a
    # resumed fp16 run continues with the same scale and growth counter; None otherwise
    loss_scale: dict | None = None
    # compute.precision = "auto": the precision the run chose at its start
    # (``run.precision``), reused on resume; None otherwise
    precision: str | None = None
    # MPI ranks of the run that wrote this state, and the segments [ranks, batches] of the
    # epoch in progress trained on other rank counts (see ``on_ranks``)
    world: int = 1
    parts: list = field(default_factory=list)

    def state_dict(self) -> dict:
        """Plain values only (a checkpoint loads with ``weights_only=True``)."""
        return asdict(self)

    def load_state_dict(self, d: dict) -> "TrainState":
        """From ``state_dict()`` or an older checkpoint's dict (missing keys keep their
        defaults: older checkpoints lack ``best_loss``, the bad-step counts and
        ``loss_scale``). Returns self."""
        for f in fields(self):
            if f.name in d:
                v = d[f.name]
                if f.name == "parts":
                    v = [[int(w), int(p)] for w, p in v]
                elif f.name == "precision":
                    v = None if v is None else str(v)
                elif v is not None and f.name != "loss_scale":
                    v = type(getattr(TrainState, f.name))(v)  # int stays int, float float
                setattr(self, f.name, dict(v) if isinstance(v, dict) else v)
        return self

    @classmethod
    def from_dict(cls, d: dict) -> "TrainState":
        return cls().load_state_dict(d)

    def position(self) -> tuple[int, int, int]:
        """(epoch, pos, step): orders checkpoints by training progress."""
        return self.epoch, self.pos, self.step

    def advance(self, pos: int):
        """One optimizer step done; ``pos`` batches of the epoch are now trained."""
        self.step += 1
        self.pos = pos

    def end_epoch(self):
        self.epoch, self.pos, self.parts = self.epoch + 1, 0, []

    def on_ranks(self, world: int) -> str | None:
        """The run continues on ``world`` ranks. From a state written on another rank
        count, the epoch in progress goes on over the sequences it has not trained yet,
        re-dealt to ``world`` ranks (``plan.resumed_plan``): the trained part is recorded
        as a segment [old ranks, batches]. Returns the line to log, or None."""
        old, self.world = self.world, world
        if old == world:
            return None
        if self.pos:
            self.parts = [*self.parts, [old, self.pos]]
            self.pos = 0
        return (f"resumed on {world} rank(s) from a checkpoint written on {old}: the rest "
                f"of epoch {self.epoch + 1} is re-dealt over the sequences not yet trained "
                "(none skipped or repeated); the run is not bit-identical to an "
                "uninterrupted one")

    def record_validation(self, ler: float, loss: float) -> bool:
        """A validation result; → True when it is the best so far (lower LER, ties to
        lower loss), which resets the patience counter."""
        improved = (ler, loss) < (self.best_ler, self.best_loss)
        if improved:
            self.best_ler, self.best_loss, self.since_best = ler, loss, 0
        else:
            self.since_best += 1
        return improved
