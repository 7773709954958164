"""One optimizer step: task compute on workers, fixed-order reduce, update.

Workers run ``TaskComputer`` on micro-batches: collate and pad their own frames, forward,
CTC, and ``torch.autograd.grad`` into the task's own flat gradient buffer (never into the
shared ``.grad``). The main thread sums the task buffers in task order into one flat
contiguous buffer (``FlatGrad``), which is also the MPI message; the parameters' ``.grad``
are views into it, so the optimizer reads the reduced gradient without a copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from .decode import edit_ops
from .model import ctc_loss_sum, training_flops_per_frame
from .plan import rng_for
from .scheduler import CostModel, Task

# loss sum, sequences, frames, label errors, reference labels: carried at the end of the
# gradient message so one collective reduces both
N_STATS = 5


def collate(frames: list[np.ndarray], pin: bool = False):
    """N arrays (T_i, F) → zero-padded (T, N, F) float32 tensor and lengths (N,) int64."""
    lengths = torch.tensor([len(f) for f in frames], dtype=torch.long)
    # one C call (the worker holds the GIL while collating: keep it short)
    x = pad_sequence([torch.from_numpy(a) for a in frames])
    return (x.pin_memory() if pin else x), lengths


@dataclass
class TaskStats:
    loss: float
    seqs: int
    frames: int
    errors: int = 0       # best-path label errors (training LER, as RNNLIB prints it)
    ref_labels: int = 0


class TaskComputer:
    """The worker function: forward, CTC and backward of one task into a flat buffer."""

    def __init__(self, model, device: torch.device, input_noise: float = 0.0,
                 precision: str = "fp32"):
        self.model, self.device, self.noise = model, device, input_noise
        self.params = [p for p in model.parameters()]
        self.numel = sum(p.numel() for p in self.params)
        self.buffers: list[torch.Tensor] = []
        self.precision = precision
        self.key = (0, 0, 0)  # (seed, epoch, step): set by the main thread before run()

    def ensure_buffers(self, n: int):
        while len(self.buffers) < n:
            self.buffers.append(torch.zeros(self.numel, device=self.device))

    def __call__(self, worker: int, task: Task) -> TaskStats:
        frames, targets = task.payload
        pin = self.device.type == "cuda"
        x, lengths = collate(frames, pin=pin)
        gen = torch.Generator().manual_seed(int(rng_for(*self.key, task.index).integers(2**62)))
        if self.noise:
            pad = torch.arange(x.shape[0]).unsqueeze(1) >= lengths.unsqueeze(0)  # (T, N)
            x += torch.randn(x.shape, generator=gen).mul_(self.noise).masked_fill_(
                pad.unsqueeze(-1), 0.0)  # padding stays zero
        x = x.to(self.device, non_blocking=True)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            log_probs, out_len = self.model(x, lengths, gen)
        loss = ctc_loss_sum(log_probs, out_len, targets, self.model.blank)
        grads = torch.autograd.grad(loss, self.params)
        torch.cat([g.reshape(-1) for g in grads], out=self.buffers[task.index])
        best = log_probs.detach().argmax(-1).cpu().numpy()  # (T', N)
        errors = ref = 0
        for j, t in enumerate(targets):
            hyp = best_path_ids(best[: int(out_len[j]), j], self.model.blank)
            errors += sum(edit_ops(t.tolist(), hyp))
            ref += len(t)
        return TaskStats(float(loss.detach()), len(frames), int(lengths.sum()), errors, ref)


def cost_model_for(model) -> CostModel:
    """The task cost model (``scheduler.CostModel``) for a CTCModel: per-task and
    per-sequence overheads in frame equivalents of this model's per-input-frame work."""
    rnn = model.rnns[0]
    dirs = 2 if rnn.bidirectional else 1
    flops = training_flops_per_frame(model.input_size * model.subsample, rnn.hidden_size,
                                     len(model.rnns), dirs == 2, model.num_classes)
    params = sum(p.numel() for p in model.parameters())
    return CostModel.for_model(flops / model.subsample, params)


def best_path_ids(path: np.ndarray, blank: int) -> list[int]:
    """Frame argmaxes (T,) → labels: merge repeats, drop blanks."""
    keep = np.ones(len(path), bool)
    keep[1:] = path[1:] != path[:-1]
    return [int(p) for p in path[keep] if p != blank]


class FlatGrad:
    """One contiguous buffer [gradient | loss, seqs, frames]; ``.grad`` of every parameter
    is a view into it. The buffer lives on the CPU when it has to cross MPI."""

    def __init__(self, params: list[torch.nn.Parameter], device: torch.device):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.buf = torch.zeros(self.numel + N_STATS, dtype=torch.float32, device=device)
        self.grad = self.buf[: self.numel]
        off = 0
        for p in params:
            p.grad = self.grad[off: off + p.numel()].view_as(p)
            off += p.numel()

    def reduce_tasks(self, buffers: list[torch.Tensor], stats: list[TaskStats]):
        """Sum the task gradients in task order (deterministic) and set the stats."""
        if buffers:
            self.grad.copy_(buffers[0])      # one pass less than zero_ + add_
            for b in buffers[1:]:
                self.grad.add_(b)
        else:
            self.grad.zero_()
        self.buf[self.numel:] = torch.tensor(
            [sum(getattr(s, k) for s in stats) for k in ("loss", "seqs", "frames", "errors",
                                                         "ref_labels")], dtype=torch.float32)

    @property
    def stats(self) -> tuple[float, int, int, int, int]:
        """(loss sum, sequences, frames, label errors, reference labels) of the step."""
        loss, *counts = self.buf[self.numel:].tolist()
        return (loss, *(int(round(c)) for c in counts))

    def normalize_and_clip(self, normalize: str, clip_norm: float) -> tuple[float, bool]:
        """Divide by global sequences/frames (or not: "sum"), clip; → (grad norm, finite)."""
        _, seqs, frames, _, _ = self.stats
        denom = {"sum": 1, "sequences": max(seqs, 1), "frames": max(frames, 1)}[normalize]
        if denom != 1:
            self.grad.div_(denom)
        norm = float(torch.linalg.vector_norm(self.grad))
        finite = bool(np.isfinite(norm)) and bool(np.isfinite(self.stats[0]))
        if finite and clip_norm and norm > clip_norm:
            self.grad.mul_(clip_norm / (norm + 1e-6))
        return norm, finite
