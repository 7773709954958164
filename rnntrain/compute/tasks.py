"""The compute of one step: tasks on the workers, then the fixed-order reduce.

Workers run ``TaskComputer`` on micro-batches: collate and pad their own frames, forward,
CTC, and ``torch.autograd.grad`` into the task's own flat gradient buffer (never into the
shared ``.grad``). The main thread sums the task buffers in task order into one flat
contiguous buffer (``FlatGrad``), which is also the MPI message; the parameters' ``.grad``
are views into it, so the optimizer reads the reduced gradient without a copy.
``run.step.StepRunner`` drives both, then the exchange and the update.
"""
from __future__ import annotations

from enum import IntEnum
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from rnntrain.augment import Augmenter
from rnntrain.decode.score import label_errors, padded_as_strings, ragged_as_strings
from rnntrain.decode.search import best_path_batch
from rnntrain.compute.device import Fence, LossScaler, autocast_dtype, to_device
from rnntrain.compute.model import ctc_loss_sum, training_flops_per_frame
from rnntrain.data.plan import bucket_length, rng_for
from rnntrain.compute.pool import CostModel, Task



class Stat(IntEnum):
    """The slots of a step's figures vector (N_STATS,), the one definition of its layout:
    carried at the end of every task buffer and of the gradient message, so the reduce and
    one collective sum both, and they stay on the device until read at a log interval."""
    LOSS = 0     # sum of the sequences' CTC losses
    SEQS = 1     # sequences
    FRAMES = 2   # input frames
    ERRORS = 3   # label errors of the best path (0 where a step does not count them)
    REFS = 4     # reference labels (0 where a step does not count errors)


N_STATS = len(Stat)


class StepStats(NamedTuple):
    """The figures read on the host, named as ``Stat``'s slots (loss float, counts int)."""
    loss: float
    seqs: int
    frames: int
    errors: int
    refs: int

    @classmethod
    def from_values(cls, values) -> "StepStats":
        """From the N_STATS values in ``Stat`` order (counts are exact in float)."""
        loss, *counts = (float(v) for v in values)
        return cls(loss, *(int(round(c)) for c in counts))


assert StepStats._fields == tuple(s.name.lower() for s in Stat)
# the gradient message has one more slot after the stats: the stop flag (number of ranks
# asking to stop, see ``FlatGrad.msg``), so that stopping needs no collective of its own
MSG_TAIL = N_STATS + 1


def collate(frames: list[np.ndarray], pin: bool = False, pad_to: int = 0):
    """N arrays (T_i, F) → zero-padded (T, N, F) float32 tensor and lengths (N,) int64.

    T = max(T_i, pad_to) (``pad_to``: the bucket length, see ``plan.bucket_length``);
    ``pin`` builds it in page-locked memory so the copy to a GPU need not block the host.
    """
    lengths = torch.tensor([len(f) for f in frames], dtype=torch.long)
    # one C call (the worker holds the GIL while collating: keep it short)
    x = pad_sequence([torch.from_numpy(a) for a in frames])
    if pad_to > x.shape[0]:
        x = F.pad(x, (0, 0, 0, 0, 0, pad_to - x.shape[0]))
    return (x.pin_memory() if pin else x), lengths


class TaskComputer:
    """The worker function: forward, CTC and backward of one task into a flat buffer.

    Task ``k`` writes only ``buffers[k]``: [gradient | loss, seqs, frames, errors, refs].
    Nothing in ``__call__`` reads a device value on the host unless ``want_errors`` is set
    (the training label errors need the best path on the host): on a GPU the step runner
    sets it on logging steps only, on CPU on every step (free there). ``begin_step`` sets
    it, with the step's random key, before the pool runs the tasks.
    """

    def __init__(self, model, device: torch.device, input_noise: float = 0.0,
                 precision: str = "fp32", round_lengths: int = 0,
                 scaler: LossScaler | None = None, augment: "Augmenter | None" = None):
        self.model, self.device, self.noise = model, device, input_noise
        # per-sequence training augmentation (rnntrain.augment), before collation
        self.augment = augment
        self.params = [p for p in model.parameters()]
        self.numel = sum(p.numel() for p in self.params)
        self.buffers: list[torch.Tensor] = []
        # per buffer, its gradient part as one view per parameter (shaped like it): the
        # task's gradients are copied in by one C++ call (``torch._foreach_copy_``), not
        # by a Python-level reshape per parameter (each one a GIL hand-off on a worker)
        self.grad_views: list[list[torch.Tensor]] = []
        self.precision, self.round_lengths = precision, round_lengths
        self.dtype = autocast_dtype(precision, device)
        # fp16 loss scale: the workers multiply the loss by it (owned by the step runner)
        self.scaler = scaler or LossScaler(device, enabled=precision == "fp16")
        self.key = (0, 0, 0)  # (seed, epoch, batch index): set by begin_step
        self.n_tasks, self.overlap = 0, None  # set by begin_step
        self.want_errors = True
        # (best (T', N), lengths (N,), targets, blank) -> (label errors, reference labels);
        # replaced only by `python -m bench threads` to time the per-sequence Python DP
        self.count_errors = task_label_errors
        self.ready = Fence(device)

    def ensure_buffers(self, n: int):
        while len(self.buffers) < n:
            buf = torch.zeros(self.numel + N_STATS, device=self.device)
            self.buffers.append(buf)
            views, off = [], 0
            for p in self.params:
                views.append(buf[off: off + p.numel()].view_as(p))
                off += p.numel()
            self.grad_views.append(views)

    def begin_step(self, n_tasks: int = 0, key: tuple[int, int, int] | None = None,
                   want_errors: bool | None = None,
                   overlap: "tuple[FlatGrad, Callable[[], None]] | None" = None):
        """Main thread, before ``pool.run``: buffers for ``n_tasks`` tasks, the step's
        random key (seed, epoch, batch index) and whether to count label errors; the
        workers' streams then wait for everything queued so far (the previous update, the
        previous reduce of the task buffers).

        ``overlap`` = (flat, arm): the exchange overlaps the last task's backward (one
        worker, so the tasks run in order on it). That task sums the earlier task buffers
        and its own figures into ``flat`` (the order of ``FlatGrad.reduce_tasks``), calls
        ``arm()`` and runs ``backward()``, which adds its gradient into the ``.grad``
        views of ``flat`` (the same sum, last term last) and fires the exchange's
        per-parameter hooks as each gradient is final."""
        self.ensure_buffers(n_tasks)
        if key is not None:
            self.key = key
        if want_errors is not None:
            self.want_errors = want_errors
        self.n_tasks, self.overlap = n_tasks, overlap
        self.ready = Fence(self.device).mark()

    def task_buffers(self, n: int) -> list[torch.Tensor]:
        """The first ``n`` task buffers, in task order (what ``FlatGrad.reduce_tasks``
        sums)."""
        return self.buffers[:n]

    def __call__(self, worker: int, task: Task) -> Fence:
        """Returns a fence marked after this task's last kernel (wait on it to read the
        task buffer from another stream)."""
        frames, targets = task.payload
        if self.augment is not None:  # a function of (seed, epoch, sequence id) alone
            frames = [self.augment(self.key[1], s, f, t)
                      for s, f, t in zip(task.seqs, frames, targets)]
        # longest first: the LSTM packs without a device-side permutation (no index copy)
        order = sorted(range(len(frames)), key=lambda j: -len(frames[j]))
        frames, targets = [frames[j] for j in order], [targets[j] for j in order]
        cuda = self.device.type == "cuda"
        pad_to = bucket_length(max(len(f) for f in frames), self.round_lengths)
        x, lengths = collate(frames, pin=cuda, pad_to=pad_to)
        gen = torch.Generator().manual_seed(int(rng_for(*self.key, task.index).integers(2**62)))
        if self.noise:
            pad = torch.arange(x.shape[0]).unsqueeze(1) >= lengths.unsqueeze(0)  # (T, N)
            x += torch.randn(x.shape, generator=gen).mul_(self.noise).masked_fill_(
                pad.unsqueeze(-1), 0.0)  # padding stays zero
        self.ready.wait()
        x = to_device(x, self.device)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            log_probs, out_len = self.model(x, lengths, gen)
        loss = ctc_loss_sum(log_probs, out_len, targets, self.model.blank)
        scaled = loss * self.scaler.scale if self.scaler.enabled else loss
        buf = self.buffers[task.index]
        if self.overlap is not None and task.index == self.n_tasks - 1:
            # figures first: they travel in the first bucket, which starts during backward
            self._figures(buf[self.numel:], loss, lengths, log_probs, out_len, targets)
            flat, arm = self.overlap
            flat.reduce_tasks(self.buffers[: task.index])  # ran before, on this stream
            flat.stats_tensor.add_(buf[self.numel:])
            arm()
            scaled.backward()  # into flat's .grad views; the hooks start the buckets
            return Fence(self.device).mark()
        grads = torch.autograd.grad(scaled, self.params)
        torch._foreach_copy_(self.grad_views[task.index], grads)  # a copy: the same bits
        self._figures(buf[self.numel:], loss, lengths, log_probs, out_len, targets)
        return Fence(self.device).mark()

    def _figures(self, tail: torch.Tensor, loss, lengths, log_probs, out_len, targets):
        """tail (N_STATS,) ← the task's figures (``Stat`` slots)."""
        tail[Stat.LOSS].copy_(loss.detach())
        tail[Stat.SEQS].fill_(len(lengths))
        tail[Stat.FRAMES].fill_(int(lengths.sum()))
        errors = ref = 0
        if self.want_errors:  # a host read of the best path: see the class docstring
            # vectorised best path and one compiled edit-distance call for the whole task
            # (rapidfuzz releases the GIL; no per-sequence Python loop on the workers)
            best = log_probs.detach().argmax(-1).cpu().numpy()  # (T', N)
            errors, ref = self.count_errors(best, out_len.cpu().numpy(), targets,
                                            self.model.blank)
        tail[Stat.ERRORS].fill_(errors)
        tail[Stat.REFS].fill_(ref)


def task_label_errors(best: np.ndarray, lengths: np.ndarray, targets, blank: int
                      ) -> tuple[int, int]:
    """Frame argmaxes (T', N), output lengths (N,) and N target arrays → (best-path label
    errors summed over the task, reference labels): no per-sequence Python loop."""
    hyp, n = best_path_batch(best, lengths, blank)
    refs, ref_len = ragged_as_strings(targets)
    return int(label_errors(refs, padded_as_strings(hyp, n)).sum()), int(ref_len.sum())


def cost_model_for(model, precision: str = "fp32") -> CostModel:
    """The task cost model (``pool.CostModel``) for a CTCModel trained in
    ``precision``: per-task, per-sequence and per-step overheads in frame equivalents of
    this model's per-input-frame work."""
    rnn = model.rnns[0]
    dirs = 2 if rnn.bidirectional else 1
    rnn_in = getattr(model, "rnn_input_size", model.input_size)
    flops = training_flops_per_frame(rnn_in * model.subsample, rnn.hidden_size,
                                     len(model.rnns), dirs == 2, model.num_classes)
    k = getattr(model, "total_subsample", model.subsample)
    flops = flops / k
    if getattr(model, "frontend", None) is not None:
        flops += model.frontend.flops_per_column()
    params = sum(p.numel() for p in model.parameters())
    return CostModel.for_model(flops, params, len(model.rnns) * dirs, precision, k)


class FlatGrad:
    """One contiguous buffer [gradient | figures (``Stat`` slots)]; ``.grad`` of
    every parameter is a view into it. It lives on the model's device; the figures at its
    end stay there too (``stats_tensor``) until the loop reads them.

    ``msg`` is the gradient message between ranks: ``buf`` plus one slot, the stop flag
    (``STOP``), in the same storage, so the stop request travels with the gradient at no
    extra collective and, on the CPU, without a copy.
    """

    STOP = N_STATS  # index of the stop flag in the message tail (after the stats)

    def __init__(self, params: list[torch.nn.Parameter], device: torch.device):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.msg = torch.zeros(self.numel + MSG_TAIL, dtype=torch.float32, device=device)
        self.buf = self.msg[: self.numel + N_STATS]
        self.grad = self.buf[: self.numel]
        off = 0
        for p in params:
            p.grad = self.grad[off: off + p.numel()].view_as(p)
            off += p.numel()

    def reduce_tasks(self, buffers: list[torch.Tensor], fences: list | None = None):
        """Sum the task buffers (gradients and figures) in task order: deterministic."""
        for f in fences or ():
            f.wait()
        if len(buffers) > 1:  # b0 + b1 in one pass (a copy, then an add, was two)
            torch.add(buffers[0], buffers[1], out=self.buf)
        elif buffers:
            self.buf.copy_(buffers[0])      # one pass less than zero_ + add_
        else:
            self.buf.zero_()
        for b in buffers[2:]:
            self.buf.add_(b)

    @property
    def stats_tensor(self) -> torch.Tensor:
        """(N_STATS,) on the device: the figures, indexed by ``Stat``."""
        return self.buf[self.numel:]

    @property
    def stats(self) -> StepStats:
        """The same figures read on the host (a synchronisation on a GPU)."""
        return StepStats.from_values(self.stats_tensor.tolist())

    def normalize_and_clip(self, normalize: str, clip_norm: float,
                           loss_scale: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Divide by global sequences/frames (or not: "sum") and by the fp16 loss scale,
        clip to ``clip_norm``; → (grad norm, finite) as 0-dim device tensors, no host read.
        """
        tail = self.stats_tensor
        denom = {"sum": None, "sequences": tail[Stat.SEQS],
                 "frames": tail[Stat.FRAMES]}[normalize]
        if denom is not None:
            denom = denom.clamp(min=1.0)
        if loss_scale is not None:
            denom = loss_scale if denom is None else denom * loss_scale
        if denom is not None:
            self.grad.div_(denom)
        norm = torch.linalg.vector_norm(self.grad)
        finite = torch.isfinite(norm) & torch.isfinite(tail[Stat.LOSS])
        if clip_norm:  # factor min(1, clip / norm): a multiply by exactly 1 below the limit
            factor = (clip_norm / (norm + 1e-6)).clamp(max=1.0)
            # on the CPU reading it is free, and a multiply by 1 changes no bit: skip its
            # pass over the gradient (on a GPU the read would wait for the queue)
            if self.grad.device.type != "cpu" or float(factor) != 1.0:
                self.grad.mul_(factor)
        return norm, finite
