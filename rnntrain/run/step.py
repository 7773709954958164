"""One optimizer step as one unit: ``StepRunner``, and the batches that feed it.

A step, in order (``StepRunner.run``):
  split      the rank's batch into tasks of similar length (``pool.split_tasks``)
  pool       the workers compute the tasks into their own buffers (``TaskComputer``)
  reduce     the task buffers summed in task order into the flat message (``FlatGrad``)
  exchange   the message summed over ranks, stop flag included (``Exchange.reduce``:
             the step's one collective in allreduce mode). Overlapped (``dist.overlap``,
             one worker): the last task does the reduce and its backward starts the
             exchange in buckets (``Exchange.arm``); ``reduce`` waits for them
  normalise  by the global sequence/frame count and the fp16 loss scale; clip
  lr         the schedule's learning rate for this step
  update     the optimizer step, skipped on NaN/Inf without a host read (masked)
  publish    master mode: rank 0's weights (and stop verdict) to every rank
  average    the weight average's update (``train.average = "ema"``); with CPU worker
             threads it is applied during the next step, on the core of the first worker
             left without a task (the weights do not change until that step's update)
and returns a ``StepResult``. The loop (``run.train``) sees batches in and figures out.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import numpy as np
import torch

from rnntrain.augment import Augmenter
from rnntrain.compute import allocator
from rnntrain.compute.device import Fence, LossScaler, worker_start
from rnntrain.compute.optim import lr_factor, set_lr
from rnntrain.compute.pool import BatchTiming, Task, WorkerPool, split_tasks
from rnntrain.compute.tasks import FlatGrad, Stat, TaskComputer, cost_model_for
from rnntrain.data.chunkbuf import ChunkBuffers
from rnntrain.data.plan import Batch, BatchPlanner, chunk_order
from rnntrain.data.reader import ChunkReader
from rnntrain.parallel.comm import Comm
from rnntrain.parallel.exchange import Exchange
from rnntrain import trace
from rnntrain.run.faults import BadSteps
from rnntrain.run.state import TrainState


@dataclass
class FedBatch:
    """A plan entry with its frames: what the loop hands to ``StepRunner.run``."""
    epoch: int
    index: int                 # position in the epoch's plan
    epoch_len: int             # batches in the epoch's plan
    batch: Batch
    payload: dict | None       # sequence id → frames (T_i, F), the batch's whole chunk;
    # set to None by the feed when it moves on to the next chunk (the frames are views of
    # a reader buffer that then serves another chunk: see rnntrain.data.chunkbuf)
    wait_s: float              # time the loop waited for the chunk reader
    upcoming: tuple | None = None  # the next batch's sequences (split while this one runs)


class EpochFeed:
    """The plan's batches from ``start`` on with their frames, read by one ``ChunkReader``
    (at most two chunks resident: the previous one is dropped before the next is taken).
    ``first_step``: the step counter at ``start`` (for the trace window). ``reader``: the
    run's ``RunReader.stream("train")``, which must have this plan's chunks from ``start``
    on queued; None: a reader of its own, closed by ``close`` (idempotent). ``wait_s``:
    the time this feed waited for chunks."""

    def __init__(self, ds, plan: list[Batch], epoch: int, start: int, first_step: int,
                 reader: "_Stream | None" = None):
        self.plan, self.epoch, self.start, self.first_step = plan, epoch, start, first_step
        self._own = reader is None
        self.reader = ChunkReader(partial(ds.load_chunk, buffers=ChunkBuffers()),
                                  chunk_order(plan[start:])) if self._own else reader
        self.wait_s = 0.0

    def __iter__(self) -> Iterator[FedBatch]:
        chunk, payload, fed = None, None, None
        for i in range(self.start, len(self.plan)):
            batch = self.plan[i]
            trace.begin_step(self.first_step + i - self.start)
            t0 = time.perf_counter()
            if batch.chunk != chunk:
                payload = None  # drop the old chunk: at most two are resident
                if fed is not None:  # the consumer's last batch holds it too
                    fed.payload = None
                if chunk is not None:  # a switch inside the epoch (single-chunk data: never)
                    allocator.trim()  # what the steps on it left free (compute.allocator)
                t = time.perf_counter()
                chunk, payload = self.reader.next()
                self.wait_s += time.perf_counter() - t
                assert chunk == batch.chunk, "reader out of plan order"
            upcoming = self.plan[i + 1].seqs if i + 1 < len(self.plan) else None
            fed = FedBatch(self.epoch, i, len(self.plan), batch, payload,
                           time.perf_counter() - t0, upcoming)
            yield fed

    def close(self):
        if self._own:
            self.reader.close()


class RunReader:
    """The chunk reader of a whole training run: one loader thread (every NetCDF call of
    the run happens on it) serving each epoch's training chunks and the validation set's,
    in the order the loop takes them, at most two chunks resident in all (training and
    validation chunks counted together: the consumer releases one before it takes the
    next, and the thread loads one ahead).

    At the start of epoch e the loop queues the rest of epoch e (unless it is already
    queued), the validation chunks that follow it (``queue("val", ...)``, in the order
    ``evaluate`` takes them) and epoch e+1's chunks (its plan is a pure function of the
    lengths, seed, epoch and rank). So the thread reads the validation set while epoch e's
    last chunk trains and epoch e+1's first chunk while validation and the checkpoints run;
    without a validation set it reads e+1's first chunk during e's last chunk. A failed
    read is raised by the ``next()`` that wants that chunk (the chunks queued before it
    are served), and ``close`` joins the thread.

        reader = RunReader(train_ds, val_ds)
        reader.queue("train", chunk_order(plan)); reader.queue("val", chunks)
        feed = EpochFeed(train_ds, plan, epoch, 0, step, reader.stream("train"))
        evaluate(..., reader=reader.stream("val"))
    """

    def __init__(self, train_ds, val_ds=None):
        self._sources = {"train": train_ds, "val": val_ds}
        self.buffers = ChunkBuffers()  # the chunks' frames, both sources (rnntrain.data.chunkbuf)
        self.reader = ChunkReader(self._load)

    def _load(self, key: tuple[str, int]) -> dict:
        source, k = key
        return self._sources[source].load_chunk(k, self.buffers)

    def queue(self, source: str, chunks):
        """Append ``source``'s ("train" or "val") chunk ids to the order served."""
        assert self._sources[source] is not None
        self.reader.extend((source, int(k)) for k in chunks)

    @property
    def load_s(self) -> float:
        """The loader thread's read time so far (every source)."""
        return self.reader.load_s

    def stream(self, source: str) -> "_Stream":
        """What a consumer of ``source``'s chunks (``EpochFeed``, ``evaluate``) reads from."""
        return _Stream(self.reader, source)

    def close(self):
        self.reader.close()


class _Stream:
    """One source's view of a ``RunReader``: ``next()`` → (chunk id, payload), in the
    queued order; the reader is not closed by it."""

    def __init__(self, reader: ChunkReader, source: str):
        self._reader, self.source = reader, source

    def next(self) -> tuple[int, dict]:
        (source, k), payload = self._reader.next()
        assert source == self.source, f"reader out of order: {source} chunk for {self.source}"
        return k, payload


@dataclass
class StepResult:
    """One step's figures. The tensors stay on the device until a log step reads them."""
    stats: torch.Tensor    # (N_STATS,) the global figures, indexed by compute.tasks.Stat
    norm: torch.Tensor     # () gradient norm before clipping
    finite: torch.Tensor   # () bool: loss and gradient finite (the update was applied)
    timing: BatchTiming    # the workers' busy and barrier-wait times
    split: np.ndarray      # (5,) s: data wait, compute, reduce tasks, exchange, update
    stop: bool             # every rank: some rank asked to stop after this step


class StepRunner:
    """Owns the step's machinery (task computer, worker pool, flat gradient, exchange,
    loss scaler, NaN guard) and runs one step at a time (see the module docstring).

    Build it, ``start(state)`` once (start-up sync of weights, optimizer and state from
    rank 0; the fp16 loss scale and the bad-step counts from the state), ``run`` each
    batch, ``close`` at the end. ``cfg``: the whole Config (train, compute, optim, dist sections);
    ``planner``: the run's ``BatchPlanner`` (its dataset, and the ``round_lengths`` the
    tasks pad with, so the planner's budget and the tasks' padding always agree);
    ``augment``: the training augmentation the workers apply (None: off); ``averager``: the
    run's ``WeightAverage`` (None: none), updated after every step.
    """

    def __init__(self, cfg, model, opt: torch.optim.Optimizer, comm: Comm, device: torch.device,
                 workers: int, planner: BatchPlanner, total_steps: int,
                 scaler: LossScaler | None = None, augment: Augmenter | None = None,
                 averager=None):
        tc = cfg.train
        self.cfg, self.opt, self.device, self.ds = cfg, opt, device, planner.ds
        self.workers, self.total_steps = workers, total_steps
        params = list(model.parameters())
        self.flat = FlatGrad(params, device)
        self.exch = Exchange(comm, cfg.dist, self.flat, params, workers)
        # tasks pad to the lengths the planner budgeted for: one round_lengths for both
        self.computer = TaskComputer(model, device, tc.input_noise, cfg.compute.precision,
                                     planner.settings.round_lengths, scaler, augment)
        self.scaler = self.computer.scaler
        # one CPU worker runs on this thread: its intra-op threads then share one OpenMP
        # team with the update (see WorkerPool), instead of two teams throttling each other
        self.pool = WorkerPool(self.computer, workers, cfg.compute.intra_threads,
                               on_start=lambda w: worker_start(device, w),
                               inline=workers == 1 and device.type == "cpu")
        self.task_cost = cost_model_for(model, cfg.compute.precision if device.type == "cpu"
                                        else "fp32")
        self.bad: BadSteps | None = None
        # (P,) 0 for the parameters train.freeze names, 1 elsewhere; None: none frozen
        self.grad_mask: torch.Tensor | None = None
        self._ahead: tuple[tuple, list] | None = None  # (sequences, their task split)
        self.averager = averager
        # CPU worker threads: the average's update waits for a core a worker has left in
        # the next step (0.4-0.6 ms a step of the default model on the main thread, with
        # both cores idle, otherwise; docs/threads.md, "The update and the reverse")
        self._average_later = averager is not None and device.type == "cpu" and workers > 1

    def start(self, model, state: TrainState) -> TrainState:
        """Every rank: rank 0's weights, optimizer and training state (checksummed), then
        the state's fp16 loss scale and NaN/Inf counts into the step's machinery."""
        state = TrainState.from_dict(self.exch.sync_start(model, self.opt,
                                                          state.state_dict()))
        if self.scaler.enabled and state.loss_scale is not None:
            self.scaler.load_state_dict(state.loss_scale)
        self.bad = BadSteps(state, self.cfg.train.max_bad_steps, self.device)
        return state

    def run(self, fed: FedBatch, step: int, want_errors: bool, stop: bool) -> StepResult:
        """Optimizer step ``step`` (0-based counter) on ``fed``. ``want_errors``: count
        training label errors (a host read on a GPU); ``stop``: this rank asks to stop
        after this step (travels in the gradient message)."""
        tc, oc = self.cfg.train, self.cfg.optim
        t1 = time.perf_counter()
        seqs = fed.batch.seqs
        tasks = [Task(j, g, ([fed.payload[s] for s in g], [self.ds.targets[s] for s in g]))
                 for j, g in enumerate(self.split(seqs))]
        # overlapped: the last task sums the others, then its backward starts the exchange
        overlap = (self.flat, partial(self.exch.arm, stop)) if self.exch.overlapped else None
        self.computer.begin_step(len(tasks), (tc.seed, fed.epoch, fed.index), want_errors,
                                 overlap)
        self.pool.submit(tasks)
        if fed.upcoming is not None or self._average_later:
            # while the workers compute, on the core of the first worker left without a
            # task (Python here holds the GIL): the next batch's split, and the last
            # step's weight average (the weights are read-only until this step's update)
            self.pool.wait_for_a_free_worker()
            if fed.upcoming is not None:
                self._ahead = (fed.upcoming, self.split(fed.upcoming))
            if self.averager is not None:
                self.averager.flush()
        fences, timing = self.pool.wait()  # returns at the barrier
        t2 = time.perf_counter()
        if overlap is None:
            self.flat.reduce_tasks(self.computer.task_buffers(len(tasks)), fences)
        else:
            Fence.wait_all(fences)  # (already reduced by the last task)
        t3 = time.perf_counter()
        self.exch.reduce(step + 1, t2 - t1, stop)  # gradients, counts, stop: one message
        t4 = time.perf_counter()
        if self.grad_mask is not None:  # frozen parameters: no gradient, no share of the norm
            self.flat.grad.mul_(self.grad_mask)
        scale = self.scaler.scale if self.scaler.enabled else None  # device-side: no read
        norm, finite = self.flat.normalize_and_clip(oc.normalize, oc.clip_norm, scale)
        set_lr(self.opt, oc.lr * lr_factor(oc, step, fed.epoch_len, self.total_steps))
        if self.averager is not None:
            self.averager.flush()  # (done above; a must before the weights change)
        self.exch.apply_update(self.opt, finite)  # skipped on NaN/Inf; master: rank 0 only
        # an fp16 overflow the scale can still back off from is not a failing step
        self.bad.add(finite | self.scaler.update(finite, self.flat.stats_tensor[Stat.LOSS]))
        stop = self.exch.publish(step + 1)  # master mode: rank 0's weights to all
        if self._average_later:  # applied in the next step, or when the average is read
            self.averager.step_later()
        elif self.averager is not None:
            self.averager.step()
        t5 = time.perf_counter()
        t0 = t1 - fed.wait_s
        trace.phases(step, (t0, t1, t2, t3, t4, t5), seqs=len(seqs))
        return StepResult(self.flat.stats_tensor.clone(), norm, finite, timing,
                          np.array([fed.wait_s, t2 - t1, t3 - t2, t4 - t3, t5 - t4]), stop)

    def split(self, seqs: tuple) -> list[tuple]:
        """The tasks of a batch (``pool.split_tasks``: a function of the lengths alone, so
        computing it ahead, while the previous batch runs, changes nothing)."""
        if self._ahead is not None and self._ahead[0] == seqs:
            return self._ahead[1]
        n_tasks = self.workers * self.cfg.compute.tasks_per_worker
        return split_tasks(seqs, self.ds.lengths, n_tasks, self.task_cost, self.workers)

    def check_bad(self, step: int, fed: FedBatch, log):
        """Read the NaN/Inf counts on the host (see ``faults.BadSteps.check``)."""
        self.bad.check(step, lambda: [self.ds.tag(s) for s in fed.batch.seqs], log)

    def loss_scale_state(self) -> dict | None:
        """The fp16 loss scaler's state for ``TrainState.loss_scale`` (None: no scaling)."""
        return self.scaler.state_dict() if self.scaler.enabled else None

    def close(self):
        self.pool.close()
        self.exch.close()
