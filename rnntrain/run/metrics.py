"""The training figures between two metric lines (``MetricsWindow``), and the keys of a
train record that make up a step (defined here once; ``tools.report`` reads them)."""
from __future__ import annotations

import time

import numpy as np
import torch

from rnntrain.compute.tasks import N_STATS, StepStats

# StepResult.split's phases, in order (the keys of a train record)
PHASE_KEYS = ("data_wait_s", "compute_s", "reduce_s", "comm_s", "update_s")
# the fields of a train record that make up a step, as the trainer measures them (every
# rank's, under "ranks", at the log steps): the phases and the workers' barrier share
SPLIT_KEYS = (*PHASE_KEYS, "barrier_idle")


class MetricsWindow:
    """Training figures accumulated between two metric lines, then ``flush``ed into one
    train record (means per step; the loss and LER over the window's sequences)."""

    def __init__(self, device: torch.device):
        self.t0, self.device = time.perf_counter(), device
        self.n = 0
        # summed on the device (fp64: exact counts), read once per metric line
        self.sums = torch.zeros(N_STATS, dtype=torch.float64, device=device)
        self.norm = torch.zeros((), dtype=torch.float64, device=device)
        self.split = np.zeros(len(PHASE_KEYS))
        self.barrier = self.pad = 0.0
        self.busy = self.idle = 0.0  # per-worker compute and barrier wait, summed (s)

    def add(self, res, pad: float):
        """One step's ``run.step.StepResult`` and the padding ratio of its batch."""
        self.n += 1
        self.sums += res.stats
        self.split += res.split
        self.barrier += res.timing.barrier_share
        self.busy = self.busy + np.asarray(res.timing.busy_s)
        self.idle = self.idle + np.asarray(res.timing.idle_s)
        norm = res.norm
        self.norm += torch.where(torch.isfinite(norm), norm, torch.zeros_like(norm))
        self.pad += pad

    def flush(self, exch=None) -> dict:
        """The window's train record, then start a new window. With ``exch`` (an
        ``Exchange``; a collective: every rank calls it at the same log step) the record
        gains the straggler figures and every rank's step-time split (``ranks``)."""
        *sums, norm = torch.cat([self.sums, self.norm.reshape(1)]).tolist()  # waits for the GPU
        dt = time.perf_counter() - self.t0
        st = StepStats.from_values(sums)
        n = max(self.n, 1)
        rec = {"loss": st.loss / max(st.seqs, 1), "ler": st.errors / max(st.refs, 1),
               "frames_per_s": st.frames / dt, "seqs": st.seqs, "grad_norm": norm / n,
               "padding": self.pad / n, "barrier_idle": self.barrier / n,
               "worker_compute_s": [round(float(b) / n, 6) for b in np.atleast_1d(self.busy)],
               "barrier_wait_s": float(np.mean(self.idle)) / n,
               **{k: v / n for k, v in zip(PHASE_KEYS, self.split)}}
        self.__init__(self.device)
        if exch is not None:
            rec.update(exch.window(per_rank={k: rec[k] for k in SPLIT_KEYS}))
        return rec
