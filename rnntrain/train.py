"""The training loop: config → data → model → loop → close, top to bottom.

Data flows one way: the epoch plan (lengths only) → the chunk reader (two chunks resident)
→ the worker pool (tasks, barrier) → fixed-order gradient reduce → MPI (one collective per
step, stand-in when alone) → normalise, clip, optimizer → metrics and checkpoints (rank 0).
Every random draw is a function of (seed, epoch, step, task), so a resumed run repeats the
uninterrupted one exactly.
"""
from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import checkpoint as ckpt
from . import dist
from .config import Config, to_dict, to_toml
from .dataset import Dataset, check_compatible
from .errors import UserError
from .evaluate import evaluate
from .manifest import remainder_note
from .model import build_model, count_params, init_uniform
from .optim import build_optimizer, lr_factor, set_lr
from .plan import chunk_order, make_plan, padding_ratio
from .reader import ChunkReader
from .runlog import RunLog, default_run_dir
from .scheduler import Task, WorkerPool, split_tasks
from .step import FlatGrad, TaskComputer


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"train.device = {name!r} but CUDA is not available here")
        idx = int(name[5:]) if ":" in name else local_rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


class StopFlag:
    """SIGINT/SIGTERM ask the loop to stop at the next step boundary (with a checkpoint)."""

    def __init__(self):
        self.signal = None
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)

    def _handle(self, signum, _frame):
        if self.signal is not None:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def describe_skipped(ds: Dataset, keep: np.ndarray, what: str) -> str:
    bad = np.flatnonzero(~keep)
    tags = ", ".join(ds.tag(int(i)) for i in bad[:8]) + (" ..." if len(bad) > 8 else "")
    return (f"{what}: skipping {len(bad)} of {ds.num_seqs} sequences too short for their "
            f"targets (frames after subsampling < labels + repeats): {tags}")


def train(cfg: Config, config_path: str | None = None, overrides=(), resume: str | None = None):
    comm = dist.init(cfg.dist)
    tc, rank = cfg.train, comm.rank
    device = pick_device(tc.device, comm.local_rank)
    cores = max(1, (os.cpu_count() or 1) // max(comm.local_size, 1))
    workers = tc.threads or max(1, cores // tc.intra_threads)

    # ---- data: metadata now, frames later on the reader thread
    train_ds = Dataset.open(cfg.data.train, cfg.data.chunk_frames)
    val_ds = Dataset.open(cfg.data.val, cfg.data.chunk_frames) if cfg.data.val else None
    if val_ds is not None:
        check_compatible(train_ds, val_ds, "training data")
    keep = train_ds.feasible(cfg.model.subsample)
    val_keep = val_ds.feasible(cfg.model.subsample) if val_ds is not None else None

    # ---- run folder (rank 0 writes; resolved config saved for reproducibility)
    resolved = to_toml(cfg)
    run_dir = Path(cfg.run.dir) if cfg.run.dir else default_run_dir(config_path, list(overrides),
                                                                     resolved)
    log = RunLog(run_dir if rank == 0 else None)
    log.write_text("config.toml", resolved)
    if not keep.all():
        log.info(describe_skipped(train_ds, keep, "train"))
    if keep.sum() == 0:
        raise UserError(f"{cfg.data.train}: no sequence is long enough for its target")

    # ---- model and optimizer: the same initial weights on every rank
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, train_ds.input_size, train_ds.num_labels)
    if cfg.model.cell == "peephole":
        init_uniform(model, 0.1)
    model.to(device).train()
    params = list(model.parameters())
    opt = build_optimizer(cfg.optim, params)
    flat = FlatGrad(params, device)
    state = {"epoch": 0, "pos": 0, "step": 0, "best_ler": math.inf, "since_best": 0}
    if resume:
        ck = resume_checkpoint(resume, run_dir, train_ds, cfg)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        state.update(ck["state"])
        log.info(f"resumed from {ck['path']} at epoch {state['epoch']} step {state['step']}")
    sync_parameters(comm, params)

    plan0 = make_plan(train_ds, keep, tc.batch_frames, tc.seed, 0, rank, comm.size)
    comm.check_same(len(plan0), "steps per epoch")
    if note := remainder_note(train_ds, keep, comm.size):
        log.info(note)
    total_steps = len(plan0) * tc.epochs
    log.info(f"rnntrain: {count_params(model):,} parameters, {train_ds.num_seqs} train sequences "
             f"({int(train_ds.lengths[keep].sum()):,} frames), {len(plan0)} steps/epoch, "
             f"{comm.size} rank(s) x {workers} worker(s) x {tc.intra_threads} thread(s) on "
             f"{device}, run folder {run_dir}")

    computer = TaskComputer(model, device, tc.input_noise, tc.precision)
    pool = WorkerPool(computer, workers, tc.intra_threads,
                      on_start=lambda w: torch.set_num_threads(tc.intra_threads))
    stop = StopFlag()
    last_ckpt_time, bad_steps = time.monotonic(), 0
    try:
        for epoch in range(state["epoch"], tc.epochs):
            plan = make_plan(train_ds, keep, tc.batch_frames, tc.seed, epoch, rank, comm.size)
            start = state["pos"]
            reader = ChunkReader(train_ds.load_chunk, chunk_order(plan[start:]))
            bar = tqdm(total=len(plan), initial=start, desc=f"epoch {epoch + 1}/{tc.epochs}",
                       unit="step", disable=rank != 0, dynamic_ncols=True, mininterval=1.0)
            acc, chunk, payload = Window(), None, None
            for i in range(start, len(plan)):
                step = plan[i]
                t0 = time.perf_counter()
                if step.chunk != chunk:
                    payload = tasks = None  # drop the old chunk: at most two are resident
                    chunk, payload = reader.next()
                    assert chunk == step.chunk, "reader out of plan order"
                t1 = time.perf_counter()
                # split the batch into micro-batches of similar length for the workers
                groups = split_tasks(step.seqs, train_ds.lengths, workers * tc.tasks_per_worker)
                tasks = [Task(j, g, ([payload[s] for s in g], [train_ds.targets[s] for s in g]))
                         for j, g in enumerate(groups)]
                computer.ensure_buffers(len(tasks))
                computer.key = (tc.seed, epoch, i)
                results, timing = pool.run(tasks)  # returns at the barrier
                t2 = time.perf_counter()
                flat.reduce_tasks(computer.buffers[: len(tasks)], results)
                t3 = time.perf_counter()
                allreduce(comm, flat)  # gradients and counts in one collective
                t4 = time.perf_counter()
                norm, finite = flat.normalize_and_clip(cfg.optim.normalize, cfg.optim.clip_norm)
                if finite:
                    set_lr(opt, cfg.optim.lr * lr_factor(cfg.optim, state["step"], len(plan),
                                                         total_steps))
                    opt.step()
                    bad_steps = 0
                else:
                    bad_steps += 1
                    log.info(f"step {state['step']}: loss or gradient is NaN/Inf; update skipped")
                    if bad_steps >= tc.max_bad_steps:
                        raise UserError(f"{bad_steps} steps in a row with NaN/Inf loss or "
                                        f"gradient (last batch: sequences "
                                        f"{', '.join(train_ds.tag(s) for s in step.seqs[:8])})")
                t5 = time.perf_counter()
                state["step"] += 1
                state["pos"] = i + 1
                acc.add(flat.stats, norm, timing, [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4],
                        padding_ratio([step], train_ds.lengths))
                bar.update(1)
                if state["step"] % tc.log_every == 0 or i == len(plan) - 1:
                    rec = acc.flush()
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", ler=f"{rec['ler']:.3f}",
                                    fps=f"{rec['frames_per_s']:.0f}")
                    log.metrics(split="train", epoch=epoch, step=state["step"],
                                lr=opt.param_groups[0]["lr"], **rec)
                due = (cfg.checkpoint.every_steps and state["step"] % cfg.checkpoint.every_steps == 0) \
                    or time.monotonic() - last_ckpt_time > 60 * cfg.checkpoint.every_minutes
                if due or stop.signal:
                    save(log, cfg, model, opt, state, train_ds, f"step-{state['step']:08d}.pt")
                    last_ckpt_time = time.monotonic()
                if stop.signal:
                    bar.close()
                    reader.close()
                    log.info(f"stopped by {stop.signal} after step {state['step']}; resume with: "
                             f"rnntrain train {config_path or 'CONFIG'} run.dir={run_dir} --resume")
                    return run_dir
            bar.close()
            reader.close()
            state["epoch"], state["pos"] = epoch + 1, 0
            if log.folder:
                log.info(f"epoch {epoch + 1}: data wait {reader.wait_s:.2f} s, "
                         f"loads {reader.load_s:.2f} s")
            # ---- validation, best and last checkpoints, early stopping
            improved = True
            if val_ds is not None and (epoch + 1) % tc.val_every_epochs == 0:
                c = evaluate(model, val_ds, val_keep, tc.batch_frames, device, comm)["best"]
                summ = c.summary()
                log.metrics(split="val", epoch=epoch, step=state["step"], **summ)
                log.info(f"epoch {epoch + 1} val: LER {summ['ler']:.4f} (sub {summ['sub']:.4f} "
                         f"del {summ['del']:.4f} ins {summ['ins']:.4f}), seq error "
                         f"{summ['seq_error']:.4f}, loss {summ['loss']:.3f}")
                improved = summ["ler"] < state["best_ler"]
                if improved:
                    state["best_ler"], state["since_best"] = summ["ler"], 0
                else:
                    state["since_best"] += 1
            save(log, cfg, model, opt, state, train_ds, "last.pt")
            if improved:
                save(log, cfg, model, opt, state, train_ds, "best.pt")
            if tc.patience and state["since_best"] >= tc.patience:
                log.info(f"early stop: no improvement in {tc.patience} validations")
                break
        if cfg.data.test and log.folder is not None:
            log.info(f"training done; evaluate the test set with: rnntrain eval "
                     f"{run_dir}/checkpoints/best.pt {cfg.data.test}")
        return run_dir
    finally:
        stop.restore()
        pool.close()
        log.close()


class Window:
    """Training figures accumulated between two metric lines."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.n = 0
        self.sums = np.zeros(5)
        self.split = np.zeros(5)    # data wait, compute, reduce, comm, update
        self.barrier = self.norm = self.pad = 0.0

    def add(self, stats, norm, timing, split, pad):
        self.n += 1
        self.sums += stats
        self.split += split
        self.barrier += timing.barrier_share
        self.norm += norm if np.isfinite(norm) else 0.0
        self.pad += pad

    def flush(self) -> dict:
        dt = time.perf_counter() - self.t0
        loss, seqs, frames, errors, ref = self.sums
        n = max(self.n, 1)
        rec = {"loss": loss / max(seqs, 1), "ler": errors / max(ref, 1),
               "frames_per_s": frames / dt, "seqs": int(seqs), "grad_norm": self.norm / n,
               "padding": self.pad / n, "barrier_idle": self.barrier / n,
               **{k: v / n for k, v in zip(("data_wait_s", "compute_s", "reduce_s", "comm_s",
                                            "update_s"), self.split)}}
        self.__init__()
        return rec


def allreduce(comm, flat: FlatGrad):
    if comm.size == 1:
        return
    if flat.buf.device.type == "cpu":
        comm.allreduce_(flat.buf.numpy())
    else:  # through host memory unless the MPI is CUDA-aware
        host = flat.buf.cpu().numpy()
        flat.buf.copy_(torch.from_numpy(comm.allreduce_(host)))


def sync_parameters(comm, params):
    """Rank 0's weights everywhere, then check that every rank holds the same bytes."""
    if comm.size == 1:
        return
    vec = torch.nn.utils.parameters_to_vector(params).detach().cpu().contiguous()
    comm.bcast_(vec.numpy(), root=0)
    torch.nn.utils.vector_to_parameters(vec.to(params[0].device), params)
    comm.check_same(float(vec.double().sum()), "parameter checksum after broadcast")


def save(log: RunLog, cfg, model, opt, state, ds, name: str):
    if log.checkpoints is None:
        return
    ckpt.save_atomic({"format": ckpt.FORMAT_VERSION, "model": model.state_dict(),
                      "optim": opt.state_dict(), "state": dict(state), "config": to_dict(cfg),
                      "labels": list(ds.labels), "input_size": ds.input_size},
                     log.checkpoints / name)
    if name.startswith("step-"):
        ckpt.prune(log.checkpoints, cfg.checkpoint.keep_last)


def resume_checkpoint(resume: str, run_dir: Path, ds: Dataset, cfg) -> dict:
    """``--resume auto`` (newest in the run folder) or a path; falls back to older ones."""
    folder = run_dir / "checkpoints"
    if resume == "auto":
        cands = ckpt.step_checkpoints(folder)[::-1] + [folder / "last.pt"]
        cands = [c for c in cands if c.exists()]
        cands.sort(key=lambda p: -p.stat().st_mtime)
        if not cands:
            raise UserError(f"--resume auto: no checkpoint in {folder}")
    else:
        cands = [Path(resume)]
    for i, path in enumerate(cands):
        try:
            ck = ckpt.load(path)
            if ck["input_size"] != ds.input_size or ck["labels"] != ds.labels:
                raise UserError(f"{path}: inputPattSize/alphabet differ from {ds.source}")
            if ck["config"]["model"] != to_dict(cfg)["model"]:
                raise UserError(f"{path}: model section differs from the config")
            ck["path"] = str(path)
            return ck
        except UserError as e:
            if i == len(cands) - 1:
                raise
            print(f"warning: {e}; falling back to {cands[i + 1]}", flush=True)
    raise AssertionError("unreachable")
