"""The training loop: config → data → model → loop → close, top to bottom.

Data flows one way: the epoch plan (lengths only) → the chunk reader (two chunks resident)
→ the worker pool (tasks, barrier) → fixed-order gradient reduce → MPI (one collective per
step, stand-in when alone) → normalise, clip, optimizer → metrics and checkpoints (rank 0).
Every random draw is a function of (seed, epoch, step, task), so a resumed run repeats the
uninterrupted one exactly.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rnntrain.run import checkpoint as ckpt
from rnntrain.parallel import mpi as dist
from rnntrain.run import trace
from rnntrain.config import Config, to_dict, to_toml
from rnntrain.data.dataset import Dataset, check_compatible
from rnntrain.compute.device import (autocast_dtype, host_every, memory_bytes, pick_device,
                                     worker_start)
from rnntrain.errors import UserError
from rnntrain.run.evaluate import evaluate
from rnntrain.parallel.exchange import Exchange
from rnntrain.run.faults import BadSteps, StopFlag, pause_point, resume_hint
from rnntrain.compute.model import (build_model, check_memory, count_params, flatten_params,
                                    init_uniform, unflatten_params)
from rnntrain.compute.optim import build_optimizer, lr_factor, set_lr
from rnntrain.data.plan import (chunk_order, make_plan, padding_ratio, remainder_note,
                                resumed_plan)
from rnntrain.tools.report import per_rank_split
from rnntrain.data.reader import ChunkReader
from rnntrain.run.runlog import RunLog, claim_run_folder, default_run_dir
from rnntrain.compute.pool import (Task, WorkerPool, cap_threads, default_threads, intra_threads,
                                   split_tasks)
from rnntrain.compute.tasks import FlatGrad, TaskComputer, cost_model_for


def describe_skipped(ds: Dataset, keep: np.ndarray, what: str) -> str:
    bad = np.flatnonzero(~keep)
    tags = ", ".join(ds.tag(int(i)) for i in bad[:8]) + (" ..." if len(bad) > 8 else "")
    return (f"{what}: skipping {len(bad)} of {ds.num_seqs} sequences too short for their "
            f"targets (frames after subsampling < labels + repeats): {tags}")


def train(cfg: Config, config_path: str | None = None, overrides=(), resume: str | None = None):
    """Train under ``cfg``; returns the run folder. The folder is locked from before its
    first write until the run ends (rank 0 holds it): a second training on it stops at
    once."""
    locks: list = []  # the run folder's lock, once _train has claimed it
    try:
        return _train(cfg, config_path, overrides, resume, locks)
    finally:
        for lock in locks:
            lock.release()


def _train(cfg: Config, config_path, overrides, resume, locks: list):
    comm = dist.init(cfg.dist)
    trace.attach(comm)  # aligns the ranks' clocks when --trace is on
    tc, rank = cfg.train, comm.rank
    device = pick_device(tc.device, comm.local_rank)
    autocast_dtype(tc.precision, device)  # fail now, not after reading data (fp16 needs CUDA)
    if tc.deterministic and device.type == "cuda":
        # the CPU path is deterministic by construction (fixed-order reduce, seeded tasks);
        # on a GPU, ask cuDNN for deterministic kernels (CTC's CUDA backward has none: warn)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.use_deterministic_algorithms(True, warn_only=True)
    # one worker feeds a GPU (its own stream); on CPU the rank's share of the cores
    workers = (tc.threads or 1) if device.type == "cuda" else \
        default_threads(tc.threads, tc.intra_threads, comm.local_size)
    workers = cap_threads(workers, tc.intra_threads, comm.local_size, device)

    # ---- data: metadata now, frames later on the reader thread
    train_ds = Dataset.open(cfg.data.train, cfg.data.chunk_frames)
    val_ds = Dataset.open(cfg.data.val, cfg.data.chunk_frames) if cfg.data.val else None
    if val_ds is not None:
        check_compatible(train_ds, val_ds, "training data")
    keep = train_ds.feasible(cfg.model.subsample)
    val_keep = val_ds.feasible(cfg.model.subsample) if val_ds is not None else None

    # ---- run folder (rank 0 locks it and writes; resolved config saved for reproducibility)
    resolved = to_toml(cfg)
    run_dir = Path(cfg.run.dir) if cfg.run.dir else default_run_dir(
        cfg.run.name or config_path, list(overrides), resolved)
    # never two live runs in one folder; never overwrite (and prune) another run's checkpoints
    locks += [lock for lock in [claim_run_folder(comm, run_dir, resume)] if lock]
    log = RunLog(run_dir if rank == 0 else None)
    if rank == 0:  # an MPI abort ends this process without the finally below
        dist.on_abort(lambda msg: log.set_status("failed", epoch=state["epoch"],
                                                 step=state["step"], error=msg))
    state = {"epoch": 0, "pos": 0, "step": 0}
    log.write_text("config.toml", resolved)
    if comm.size > 1:
        log.info(comm.roster())
    if not keep.all():
        log.info(describe_skipped(train_ds, keep, "train"))
    if val_keep is not None and not val_keep.all():
        log.info(describe_skipped(val_ds, val_keep, "val"))
    if keep.sum() == 0:
        raise UserError(f"{cfg.data.train}: no sequence is long enough for its target")

    # ---- model and optimizer: the same initial weights on every rank
    check_memory(cfg.model, train_ds.input_size, train_ds.num_labels,
                 5 + workers * tc.tasks_per_worker, memory_bytes(device))
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, train_ds.input_size, train_ds.num_labels)
    if cfg.model.cell == "peephole":
        init_uniform(model, 0.1)
    model.to(device).train()
    params = list(model.parameters())
    opt = build_optimizer(cfg.optim, params, fused=device.type == "cuda")
    flat = FlatGrad(params, device)
    exch = Exchange(comm, cfg.dist, flat, params)
    state = {"epoch": 0, "pos": 0, "step": 0, "best_ler": math.inf, "since_best": 0,
             "world": comm.size, "parts": []}
    if resume:  # rank 0 reads it; the other ranks receive it in sync_start
        ck = resume_checkpoint(comm, resume, run_dir, train_ds, model, opt, cfg)
        if ck is not None:
            state.update(ck["state"])
            log.info(f"resumed from {ck['path']} at epoch {state['epoch'] + 1} "
                     f"step {state['step']}")
    rerank_note = ranks_changed(state, comm.size)
    state = exch.sync_start(model, opt, state)  # rank 0's weights/optimizer, checksummed
    if rerank_note:
        log.info(rerank_note)
    bad = BadSteps(state, tc.max_bad_steps, device)

    plan0 = make_plan(train_ds, keep, tc.batch_frames, tc.seed, 0, rank, comm.size,
                      round_lengths=tc.round_lengths, strategy=tc.plan)
    comm.check_same(len(plan0), "steps per epoch")
    if note := remainder_note(train_ds, keep, comm.size, tc.plan, tc.batch_frames, tc.seed):
        log.info(note)
    total_steps = len(plan0) * tc.epochs
    log.info(f"rnntrain: {count_params(model):,} parameters, {train_ds.num_seqs} train sequences "
             f"({int(train_ds.lengths[keep].sum()):,} frames), {len(plan0)} steps/epoch, "
             f"{comm.size} rank(s) x {workers} worker(s) x {tc.intra_threads} thread(s) on "
             f"{device}, run folder {run_dir}")

    computer = TaskComputer(model, device, tc.input_noise, tc.precision, tc.round_lengths)
    # one CPU worker runs on this thread: its intra-op threads then share one OpenMP team
    # with the update (see WorkerPool), instead of two teams throttling each other
    pool = WorkerPool(computer, workers, tc.intra_threads,
                      on_start=lambda w: worker_start(device),
                      inline=workers == 1 and device.type == "cpu")
    task_cost = cost_model_for(model, tc.precision if device.type == "cpu" else "fp32")
    stop = StopFlag()
    last_ckpt_time, bar, reader = time.monotonic(), None, None
    every = host_every(device, tc.log_every)
    log.set_status("running")
    try:
        for epoch in range(state["epoch"], tc.epochs):
            # an epoch interrupted on another rank count goes on over the sequences left
            parts = state["parts"] if epoch == state["epoch"] else []
            plan = resumed_plan(train_ds, keep, tc.batch_frames, tc.seed, epoch, rank,
                                comm.size, parts, tc.round_lengths, tc.plan)
            start = state["pos"]
            reader = ChunkReader(train_ds.load_chunk, chunk_order(plan[start:]))
            bar = tqdm(total=len(plan), initial=start, desc=f"epoch {epoch + 1}/{tc.epochs}",
                       unit="step", disable=rank != 0, dynamic_ncols=True, mininterval=1.0)
            acc, chunk, payload = Window(device), None, None
            for i in range(start, len(plan)):
                step = plan[i]
                trace.begin_step(state["step"])
                t0 = time.perf_counter()
                if step.chunk != chunk:
                    payload = tasks = None  # drop the old chunk: at most two are resident
                    chunk, payload = reader.next()
                    assert chunk == step.chunk, "reader out of plan order"
                t1 = time.perf_counter()
                # split the batch into micro-batches of similar length for the workers
                groups = split_tasks(step.seqs, train_ds.lengths, workers * tc.tasks_per_worker,
                                     task_cost, workers)
                tasks = [Task(j, g, ([payload[s] for s in g], [train_ds.targets[s] for s in g]))
                         for j, g in enumerate(groups)]
                computer.ensure_buffers(len(tasks))
                computer.key = (tc.seed, epoch, i + sum(p for _, p in parts))
                log_now = (state["step"] + 1) % tc.log_every == 0 or i == len(plan) - 1
                computer.want_errors = every == 1 or log_now  # GPU: LER on logging steps
                computer.begin_step()
                results, timing = pool.run(tasks)  # returns at the barrier
                t2 = time.perf_counter()
                flat.reduce_tasks(computer.buffers[: len(tasks)], results)
                t3 = time.perf_counter()
                exch.reduce(state["step"] + 1, t2 - t1)  # gradients and counts: one collective
                t4 = time.perf_counter()
                scaler = computer.scaler  # fp16 only; device-side, no host reads below
                norm, finite = flat.normalize_and_clip(cfg.optim.normalize, cfg.optim.clip_norm,
                                                       scaler.scale if scaler.enabled else None)
                set_lr(opt, cfg.optim.lr * lr_factor(cfg.optim, state["step"], len(plan),
                                                     total_steps))
                exch.step(opt, finite)  # skipped on NaN/Inf; master mode: rank 0 only
                bad.add(finite | scaler.update(finite, flat.stats_tensor[0]))
                if (state["step"] + 1) % every == 0 or i == len(plan) - 1:
                    bad.check(state["step"] + 1, [train_ds.tag(s) for s in step.seqs], log)
                exch.publish(state["step"] + 1)  # master mode: rank 0's weights to all
                t5 = time.perf_counter()
                trace.phases(state["step"], (t0, t1, t2, t3, t4, t5), seqs=len(step.seqs))
                state["step"] += 1
                state["pos"] = i + 1
                acc.add(flat.stats_tensor, norm, timing, [t1 - t0, t2 - t1, t3 - t2, t4 - t3,
                                                          t5 - t4],
                        padding_ratio([step], train_ds.lengths))
                bar.update(1)
                if log_now:  # collectives: every rank logs at the same steps
                    rec = per_rank_split(comm, {**acc.flush(), **exch.window()})
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", ler=f"{rec['ler']:.3f}",
                                    fps=f"{rec['frames_per_s']:.0f}")
                    log.metrics(split="train", epoch=epoch, step=state["step"],
                                lr=opt.param_groups[0]["lr"], **rec)
                due = (cfg.checkpoint.every_steps and state["step"] % cfg.checkpoint.every_steps == 0) \
                    or time.monotonic() - last_ckpt_time > 60 * cfg.checkpoint.every_minutes
                pause_point("step", state["step"])
                stopping = stop.should_stop(comm)
                if due or stopping:
                    bad.check(state["step"], [train_ds.tag(s) for s in step.seqs], log)
                    save(log, cfg, model, opt, state, train_ds, f"step-{state['step']:08d}.pt")
                    last_ckpt_time = time.monotonic()
                if stopping:
                    launcher = dist.launcher_prefix(comm.size)
                    bar.close()
                    reader.close()
                    log.info(f"stopped by {stop.signal} after step {state['step']}; checkpoint "
                             f"saved; resume with: "
                             f"{resume_hint(config_path, overrides, run_dir, launcher)}")
                    return run_dir
            bar.close()
            reader.close()
            state["epoch"], state["pos"], state["parts"] = epoch + 1, 0, []
            if log.folder:
                log.info(f"epoch {epoch + 1}: data wait {reader.wait_s:.2f} s, "
                         f"loads {reader.load_s:.2f} s")
            # ---- validation, best and last checkpoints, early stopping
            improved = True
            if val_ds is not None and (epoch + 1) % tc.val_every_epochs == 0:
                with intra_threads(workers * tc.intra_threads):  # the workers sleep meanwhile
                    c = evaluate(model, val_ds, val_keep, tc.batch_frames, device, comm)["best"]
                summ = c.summary()
                log.metrics(split="val", epoch=epoch, step=state["step"], **summ)
                log.info(f"epoch {epoch + 1} val: LER {summ['ler']:.4f} (sub {summ['sub']:.4f} "
                         f"del {summ['del']:.4f} ins {summ['ins']:.4f}), seq error "
                         f"{summ['seq_error']:.4f}, loss {summ['loss']:.3f}")
                # ties in LER (common on small validation sets that reach 0) go to lower loss
                key = (summ["ler"], summ["loss"])
                improved = key < (state["best_ler"], state.get("best_loss", math.inf))
                if improved:
                    state["best_ler"], state["best_loss"], state["since_best"] = *key, 0
                else:
                    state["since_best"] += 1
            # best.pt before last.pt: last.pt records the new best score, so once it is
            # written a resume never validates this epoch again; a kill between the two
            # writes resumes from an older position and rewrites the same best.pt
            if improved:
                save(log, cfg, model, opt, state, train_ds, "best.pt")
                pause_point("best", state["step"])
            save(log, cfg, model, opt, state, train_ds, "last.pt")
            if tc.patience and state["since_best"] >= tc.patience:
                log.info(f"early stop: no improvement in {tc.patience} validations")
                break
        if cfg.data.test:  # the held-out score of the best checkpoint, once, at the end
            test_ds = Dataset.open(cfg.data.test, cfg.data.chunk_frames)
            check_compatible(train_ds, test_ds, "training data")
            load_best(log, model, comm)
            with intra_threads(workers * tc.intra_threads):
                summ = evaluate(model, test_ds, test_ds.feasible(cfg.model.subsample),
                                tc.batch_frames, device, comm)["best"].summary()
            log.metrics(split="test", epoch=state["epoch"] - 1, step=state["step"], **summ)
            log.info(f"test ({cfg.data.test}, best checkpoint): LER {summ['ler']:.4f} (sub "
                     f"{summ['sub']:.4f} del {summ['del']:.4f} ins {summ['ins']:.4f}), seq "
                     f"error {summ['seq_error']:.4f}, loss {summ['loss']:.3f}")
        return run_dir
    finally:  # on an error too: the bar must not redraw after the error message
        for obj in (bar, reader):
            if obj is not None:
                obj.close()
        stop.restore()
        pool.close()
        trace.finish(comm, failed=sys.exc_info()[0] is not None)
        log.finish(sys.exc_info()[1], stop.signal, state)
        dist.on_abort(None)
        log.close()


class Window:
    """Training figures accumulated between two metric lines."""

    def __init__(self, device: torch.device):
        self.t0, self.device = time.perf_counter(), device
        self.n = 0
        # summed on the device (fp64: exact counts), read once per metric line
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)
        self.norm = torch.zeros((), dtype=torch.float64, device=device)
        self.split = np.zeros(5)    # data wait, compute, reduce, comm, update
        self.barrier = self.pad = 0.0
        self.busy = self.idle = 0.0  # per-worker compute and barrier wait, summed (s)

    def add(self, stats, norm, timing, split, pad):
        self.n += 1
        self.sums += stats
        self.split += split
        self.barrier += timing.barrier_share
        self.busy = self.busy + np.asarray(timing.busy_s)
        self.idle = self.idle + np.asarray(timing.idle_s)
        self.norm += torch.where(torch.isfinite(norm), norm, torch.zeros_like(norm))
        self.pad += pad

    def flush(self) -> dict:
        *sums, norm = torch.cat([self.sums, self.norm.reshape(1)]).tolist()  # waits for the GPU
        dt = time.perf_counter() - self.t0
        loss, seqs, frames, errors, ref = sums
        n = max(self.n, 1)
        rec = {"loss": loss / max(seqs, 1), "ler": errors / max(ref, 1),
               "frames_per_s": frames / dt, "seqs": int(seqs), "grad_norm": norm / n,
               "padding": self.pad / n, "barrier_idle": self.barrier / n,
               "worker_compute_s": [round(float(b) / n, 6) for b in np.atleast_1d(self.busy)],
               "barrier_wait_s": float(np.mean(self.idle)) / n,
               **{k: v / n for k, v in zip(("data_wait_s", "compute_s", "reduce_s", "comm_s",
                                            "update_s"), self.split)}}
        self.__init__(self.device)
        return rec


def ranks_changed(state: dict, world: int) -> str | None:
    """A checkpoint written by a run on another number of ranks: the epoch it stopped in
    goes on over the sequences it had not trained yet, re-dealt to ``world`` ranks
    (``plan.resumed_plan``). Updates ``state``; returns the line to log, or None."""
    old = int(state.get("world", world))
    state.setdefault("parts", [])
    state["world"] = world
    if old == world:
        return None
    if state["pos"]:
        state["parts"] = [*state["parts"], [old, state["pos"]]]
        state["pos"] = 0
    return (f"resumed on {world} rank(s) from a checkpoint written on {old}: the rest of "
            f"epoch {state['epoch'] + 1} is re-dealt over the sequences not yet trained "
            "(none skipped or repeated); the run is not bit-identical to an uninterrupted "
            "one")


def load_best(log: RunLog, model, comm):
    """Every rank: the weights of checkpoints/best.pt (read by rank 0, then broadcast)."""
    if log.checkpoints is not None and (log.checkpoints / "best.pt").exists():
        model.load_state_dict(ckpt.load(log.checkpoints / "best.pt")["model"])
    if comm.size > 1:
        params = list(model.parameters())
        vec = flatten_params(params)
        comm.bcast_(vec, 0, what="best-checkpoint broadcast")
        unflatten_params(vec, params)


def save(log: RunLog, cfg, model, opt, state, ds, name: str):
    ckpt.save_training(log.checkpoints, name, cfg, model, opt, state, ds,
                       cfg.checkpoint.keep_last)


def resume_checkpoint(comm, resume: str, run_dir: Path, ds: Dataset, model, opt, cfg):
    """Rank 0 picks and loads the checkpoint (falling back past unusable ones) and returns
    it; the other ranks return None and receive it in ``Exchange.sync_start``. An error is
    raised on every rank."""
    ck, err = None, None
    if comm.rank == 0:
        try:
            ck = ckpt.load_for_resume(resume, run_dir, ds, model, opt, to_dict(cfg)["model"],
                                      warn=lambda m: print(m, file=sys.stderr, flush=True))
        except UserError as e:
            err = str(e)
    err = comm.bcast_obj(err)
    if err:
        raise UserError(err)
    return ck
