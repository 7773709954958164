"""``compute.precision = "auto"``: time the candidate precisions on the run's own model and
data at start-up and train in the faster.

Which precision is faster depends on the CPU (avx512_bf16 or AMX, or neither), the model's
size and the sequence lengths: on a Zen 5 core bf16 trains the bench's median-300 data
1.4x faster than fp32 but the reference model on long sequences (median 546 frames) slower
(docs/benchmarks.md). So each candidate trains the first ``TRIAL_STEPS`` batches of the
epoch plan, the first one as warm-up (oneDNN primitive creation), on a *copy* of the weights
and optimizer state (``copy.deepcopy``): the run itself then starts from exactly the state it
would start from with that precision configured directly. Rank 0's figures decide and
every rank receives the choice (``collectives.from_root``). The choice is kept in the
training state (``TrainState.precision``), so a resumed run reuses it instead of timing
again (a resume stays bit-identical).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch

from rnntrain.parallel import collectives
from rnntrain.parallel.comm import Comm
from rnntrain.run.state import TrainState
from rnntrain.run.step import EpochFeed, StepRunner

TRIAL_STEPS = 3  # per candidate: one warm-up step, then the timed ones


def candidates(device: torch.device) -> tuple[str, ...]:
    """The precisions "auto" chooses between on ``device``: fp32 and bf16 (fp16 needs loss
    scaling and buys nothing over bf16 where bf16 runs); fp32 alone where bf16 cannot
    run."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return ("fp32",)
    from rnntrain.compute.device import cpu_bf16
    if device.type == "cpu" and not cpu_bf16():
        return ("fp32",)   # an AVX2-only CPU: no bf16 LSTM to time
    return ("fp32", "bf16")


def with_precision(cfg, precision: str):
    """``cfg`` with ``compute.precision`` set to ``precision``."""
    return dataclasses.replace(cfg, compute=dataclasses.replace(cfg.compute,
                                                                precision=precision))


@dataclass
class Choice:
    """What "auto" chose and why: ``fps`` the frames/s each candidate trained at (rank
    0's figures; empty when the choice came from a checkpoint), over ``steps`` timed steps."""
    precision: str
    fps: dict
    steps: int = 0

    def describe(self) -> str:
        if not self.fps:
            return (f"compute.precision = \"auto\": {self.precision}, as chosen when the run "
                    "started (kept in the checkpoint)")
        figs = ", ".join(f"{p} {v:,.0f} frames/s" for p, v in self.fps.items())
        return (f"compute.precision = \"auto\": {figs} over the plan's first {self.steps} "
                f"step(s) after a warm-up -> training in {self.precision}")

    def record(self) -> dict:
        """The metrics.jsonl record (split "precision")."""
        return {"split": "precision", "epoch": 0, "step": 0, "chosen": self.precision,
                "steps": self.steps, **{f"{p}_frames_per_s": round(v, 1)
                                        for p, v in self.fps.items()}}


def trial_fps(cfg, model, opt, comm: Comm, device: torch.device, workers: int, planner,
              augment, steps: int = TRIAL_STEPS) -> tuple[float, int]:
    """→ (frames/s, timed steps): the first ``steps`` batches of epoch 0's plan trained
    under ``cfg`` (its precision) on copies of ``model`` and ``opt``; the first batch is
    not timed where there are more. Every rank runs it (the steps' collectives)."""
    model_c, opt_c = copy.deepcopy((model, opt))  # one memo: the copy's optimizer holds the copy's parameters
    planner.set_epoch(0, [])
    plan = list(planner)[:steps]
    runner = StepRunner(cfg, model_c, opt_c, comm, device, workers, planner, len(plan),
                        augment=augment)
    feed = EpochFeed(planner.ds, plan, 0, 0, 0)
    try:
        runner.start(model_c, TrainState(world=comm.size))
        warm = 1 if len(plan) > 1 else 0
        frames, t0 = 0, time.perf_counter()
        for fed in feed:
            runner.run(fed, fed.index, want_errors=False, stop=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if fed.index + 1 == warm:
                t0 = time.perf_counter()
            else:
                frames += int(planner.ds.lengths[list(fed.batch.seqs)].sum())
        seconds = time.perf_counter() - t0
    finally:
        feed.close()
        runner.close()
    return frames / max(seconds, 1e-9), len(plan) - warm


def choose(cfg, model, opt, comm: Comm, device: torch.device, workers: int, planner, augment,
           state: TrainState) -> Choice:
    """The precision the run trains in: ``cfg.compute.precision`` unless it is "auto";
    then the one in ``state`` (a resume: rank 0's checkpoint), else the fastest of
    ``candidates`` by ``trial_fps`` on rank 0. Every rank returns the same choice."""
    if cfg.compute.precision != "auto":
        return Choice(cfg.compute.precision, {})
    kept = collectives.from_root(comm, state.precision)
    if kept is not None:
        return Choice(kept, {})
    fps, steps = {}, 0
    for p in candidates(device):
        fps[p], steps = trial_fps(with_precision(cfg, p), model, opt, comm, device, workers,
                                  planner, augment)
    best = max(fps, key=lambda p: (fps[p], p == "fp32"))  # (a tie: fp32)
    return Choice(*collectives.from_root(comm, (best, fps, steps)))
