"""The training loop: config → build → loop → close, top to bottom.

Data flows one way: the epoch plan (lengths only) → the chunk reader (two chunks resident,
``step.EpochFeed``) → one optimizer step (``step.StepRunner``: worker pool, fixed-order
reduce, the step's one collective, normalise/clip, masked update) → metrics
(``metrics.MetricsWindow``) and checkpoints (rank 0) of the ``state.TrainState``.
Every random draw is a function of (seed, epoch, batch index, task), so a resumed run
repeats the uninterrupted one exactly.
"""
from __future__ import annotations

import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from rnntrain.augment import Augmenter
from rnntrain.compute import allocator, lstmscan
from rnntrain.compute.device import autocast_dtype, host_every, memory_bytes, pick_device
from rnntrain.compute.model import (build_model, check_memory, count_params,
                                    init_blank_bias, init_uniform, total_subsample)
from rnntrain.compute.optim import build_optimizer
from rnntrain.compute.pool import cap_threads, default_threads
from rnntrain.config import Config, to_dict, to_toml
from rnntrain.data.dataset import Dataset, check_compatible
from rnntrain.data.folds import fold_masks
from rnntrain.data.plan import BatchPlanner, PlanSettings, chunk_order, padding_ratio
from rnntrain.data.ncdata import full_targets
from rnntrain.errors import SharedError, UserError
from rnntrain.parallel import collectives
from rnntrain.parallel import launch as dist
from rnntrain.parallel.comm import Comm
from rnntrain.parallel.exchange import overlap_wanted
from rnntrain.run import checkpoint as ckpt
from rnntrain import trace
from rnntrain.run import finetune, precision
from rnntrain.run.average import WeightAverage
from rnntrain.run.evaluate import eval_batches, evaluate
from rnntrain.run.faults import StopFlag, pause_point, resume_hint
from rnntrain.run.metrics import MetricsWindow
from rnntrain.artifact.runfolder import RunFolder
from rnntrain.run.runlog import RunLog
from rnntrain.run.state import TrainState
from rnntrain.run.step import EpochFeed, RunReader, StepRunner


def finished_note(state: TrainState, tc, config_path, overrides, run_dir) -> str | None:
    """Why a resumed run has nothing left to do (and how to train it further), or None."""
    hint = resume_hint(config_path, [o for o in overrides if not o.lstrip("-").startswith(
        ("train.epochs=", "train.patience="))], run_dir)
    if state.epoch >= tc.epochs:
        return (f"run {run_dir} is finished: {state.epoch} of train.epochs={tc.epochs} "
                f"epochs done; to train more, raise train.epochs: {hint} "
                f"train.epochs={state.epoch + tc.epochs}")
    if tc.patience and state.since_best >= tc.patience:
        return (f"run {run_dir} is finished: stopped early after {state.since_best} "
                f"validations without improvement (train.patience={tc.patience}); to train "
                f"more, raise train.patience (0 = never stop early): {hint} train.patience=0")
    return None


def describe_skipped(ds: Dataset, keep: np.ndarray, what: str,
                     within: np.ndarray | None = None) -> str:
    """The sequences of ``within`` (default: all) that ``keep`` leaves out, named."""
    within = np.ones(ds.num_seqs, bool) if within is None else within
    bad = np.flatnonzero(~keep & within)
    tags = ", ".join(ds.tag(int(i)) for i in bad[:8]) + (" ..." if len(bad) > 8 else "")
    return (f"{what}: skipping {len(bad)} of {int(within.sum())} sequences too short for "
            f"their targets (frames after subsampling < labels + repeats): {tags}")


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
    # the CLI sets it before torch is imported; from the Python API it holds for the
    # threads started from here on (the workers, the reader)
    allocator.configure(cfg.compute.allocator)
    t_start = time.monotonic()
    comm = dist.init(cfg.dist, cfg.compute.device)
    collectives.agree_config(comm, to_dict(cfg))  # a key that differs is named, not a checksum
    trace.attach(lambda: collectives.wait_for_all(comm))  # aligns the ranks' clocks (--trace)
    tc, rank = cfg.train, comm.rank
    device = pick_device(cfg.compute.device, comm.local_rank)
    if cfg.compute.precision != "auto":  # fail now, not after reading data (fp16 needs CUDA)
        autocast_dtype(cfg.compute.precision, device)
    if cfg.compute.deterministic and device.type == "cuda":
        # the CPU path is deterministic by construction (fixed-order reduce, seeded tasks);
        # on a GPU, ask cuDNN for deterministic kernels (CTC's CUDA backward has none: warn)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.use_deterministic_algorithms(True, warn_only=True)
    # one worker feeds a GPU (its own stream); on CPU the rank's share of the cores
    workers = (cfg.compute.threads or 1) if device.type == "cuda" else \
        default_threads(cfg.compute.threads, cfg.compute.intra_threads, comm.local_size)
    workers = cap_threads(workers, cfg.compute.intra_threads, comm.local_size, device)
    overlap_wanted(cfg.dist, comm, device, workers)  # refuse now, before reading any data

    # ---- data (metadata now, frames later on the reader thread) and the run folder
    train_ds, keep, val_ds, val_keep = open_data(cfg)
    # [augment]: checked against the data now, before the run folder is claimed
    augment = Augmenter.for_training(cfg, train_ds, total_subsample(cfg.model))
    resolved = to_toml(cfg)
    run = RunFolder(cfg.run.dir) if cfg.run.dir else RunFolder.default(
        cfg.run.name or config_path, list(overrides), resolved)
    run_dir = run.root
    writer = rank == 0  # the one rank that writes the run folder (logs, checkpoints)
    # never two live runs in one folder (the lock); never overwrite (and prune) another
    # run's checkpoints
    lock, why = run.claim(comm)
    locks += [lock] if lock else []
    if resume == "if-any":  # a requeued batch job: continue if there is something to continue
        resume = "auto" if why else None
    if not resume and why:
        raise SharedError(why)  # every rank got the verdict
    log = RunLog(run if writer else None, cfg.log)
    state = TrainState(world=comm.size)
    if writer:  # an MPI abort ends this process without the finally below
        dist.on_abort(lambda msg: log.set_status("failed", epoch=state.epoch,
                                                 step=state.step, error=msg))
    log.write_text(run.config.name, resolved)
    if comm.size > 1:
        log.info(collectives.rank_roster(comm))
    log_skipped(log, cfg, train_ds, keep, val_ds, val_keep)
    if augment is not None:
        log.info(f"augmentation: {augment.describe()}")
    if allocator.note():  # capped: with its large-block cache, or why not (one line)
        log.info(allocator.note())

    # ---- model, optimizer, plan size and the step's machinery (same weights everywhere)
    card = ckpt.ModelCard.of_data(train_ds, to_dict(cfg))  # what every checkpoint says it is
    if tc.init_from:  # fine-tuning: the output alphabet follows train.init_alphabet
        source = finetune.source(tc.init_from)
        card.init_from = str(source)
        card.labels = finetune.alphabet(tc.init_alphabet, ckpt.read(source).card.labels,
                                        train_ds.labels, source)
    card.weights = "average" if tc.average != "none" else "model"
    check_memory(cfg.model, train_ds.frame_size, len(card.labels),
                 5 + workers * cfg.compute.tasks_per_worker, memory_bytes(device))
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, train_ds.frame_size, len(card.labels),
                        train_ds.frame_height, cfg.compute.lstm)
    if cfg.model.cell == "lstm":  # (the peephole cell runs its own torch loop)
        log.info(lstmscan.note(cfg.compute.lstm, device.type, cfg.compute.precision))
    if cfg.model.cell == "peephole":
        init_uniform(model, 0.1)
    init_blank_bias(model, cfg.model.blank_bias)
    if tc.init_from and not resume:
        log.info(finetune.start_from(cfg, model, card.labels, train_ds)[1])
    model.to(device).train()
    frozen = {id(p) for p in finetune.frozen_parameters(model, tc.freeze)}
    # fused on CPU and CUDA: one kernel per update (compute/optim.py); a run resumed from a
    # checkpoint of an unfused optimizer keeps the saved groups' setting, and so its bits
    opt = build_optimizer(cfg.optim, [p for p in model.parameters() if id(p) not in frozen],
                          fused=device.type in ("cpu", "cuda"))
    averager = WeightAverage(model, tc.average, tc.ema_decay, tc.average_last) \
        if tc.average != "none" else None
    planner = BatchPlanner(train_ds, keep, PlanSettings.from_config(cfg), rank, comm.size)
    steps_per_epoch = planner.steps_per_epoch
    collectives.agree(comm, steps_per_epoch, "steps per epoch")
    if note := planner.remainder_note():
        log.info(note)
    stop, bar, feed, runner, reader = StopFlag(), None, None, None, None
    try:
        if resume:  # rank 0 reads it; the other ranks receive the state in runner.start
            ck = resume_checkpoint(comm, resume, run, train_ds,
                                   training_parts(model, opt, averager), cfg)
            if ck is not None:
                state.load_state_dict(ck.parts["state"])
                log.info(f"resumed from {ck.path} at epoch {state.epoch + 1} "
                         f"step {state.step}")
        # compute.precision = "auto": the checkpoint's choice, or timed now on copies
        choice = precision.choose(cfg, model, opt, comm, device, workers, planner, augment,
                                  state)
        if cfg.compute.precision == "auto":
            log.info(choice.describe())
            if choice.fps:
                log.metrics(**choice.record())
        # what the checkpoints record: only an "auto" run's choice (a run resumed with an
        # explicit precision drops an older auto choice)
        state.precision = choice.precision if cfg.compute.precision == "auto" else None
        runner = StepRunner(precision.with_precision(cfg, choice.precision), model, opt,
                            comm, device, workers, planner, steps_per_epoch * tc.epochs,
                            augment=augment, averager=averager)
        runner.grad_mask = finetune.gradient_mask(
            model, [p for p in model.parameters() if id(p) in frozen], device)
        rerank_note = state.on_ranks(comm.size)
        state = runner.start(model, state)  # rank 0's weights/optimizer/state, checksummed
        if resume and (done := finished_note(state, tc, config_path, overrides, run_dir)):
            log.info(done)  # status.json stays finished, with the run's own start time
            return run_dir
        if rerank_note:
            log.info(rerank_note)
        if runner.exch.overlapped:
            log.info(f"gradient exchange overlapped with backward: "
                     f"{len(runner.exch.buckets.buckets)} bucket(s) of about "
                     f"{cfg.dist.bucket_mb:g} MB (dist.overlap = \"{cfg.dist.overlap}\")")
        log.info(f"rnntrain: {count_params(model):,} parameters, {train_ds.num_seqs} train "
                 f"sequences ({int(train_ds.lengths[keep].sum()):,} frames), {steps_per_epoch}"
                 f" steps/epoch, {comm.size} rank(s) x {workers} worker(s) x "
                 f"{cfg.compute.intra_threads} thread(s) on {device}, run folder {run_dir}")
        every, last_ckpt = host_every(device, cfg.log.every_steps), time.monotonic()
        save = partial(save_checkpoint, run if writer else None, card,
                       training_parts(model, opt, averager), cfg, runner)
        log.set_status("running", resumed=bool(resume))
        # one loader thread for every epoch and validation pass: it reads ahead across
        # the epoch boundary (the validation set, then the next epoch's first chunk)
        reader = RunReader(train_ds, val_ds)
        val_chunks = list(eval_batches(val_ds, val_keep, cfg.batch.batch_frames, comm.rank,
                                       comm.size)) if val_ds is not None else []
        ahead = None  # the chunk order of the epoch already queued, with its number
        loads_logged = 0.0
        # lines whose stored targets lack characters the data's alphabet lacks are scored
        # against their whole text, as `rnntrain eval` scores them (ncdata.full_targets)
        val_full = full_targets(cfg.data.val, card.labels) if val_ds is not None else None
        val_full = val_full[0] if val_full else None
        if tc.val_at_start and val_ds is not None and state.step == 0 \
                and state.best_ler == math.inf:  # (a resume past this point has a score)
            # the starting weights compete for best.pt: "epoch 0" in the log and metrics
            reader.queue("val", val_chunks)
            summ = validate(log, model, val_ds, val_keep, cfg, device, comm, workers, -1, 0,
                            reader.stream("val"), val_full)
            state.record_validation(summ["ler"], summ["loss"])
            save(state, "best.pt")
            save(state, "last.pt")
        for epoch in range(state.epoch, tc.epochs):
            # an epoch interrupted on another rank count goes on over the sequences left
            planner.set_epoch(epoch, state.parts)
            plan = list(planner)
            if ahead is None:  # this process's first epoch (resumed: from state.pos on)
                reader.queue("train", chunk_order(plan[state.pos:]))
            else:
                assert ahead == (epoch, chunk_order(plan)), "queued plan differs"
            validating = val_ds is not None and (epoch + 1) % tc.val_every_epochs == 0
            if validating:
                reader.queue("val", val_chunks)
            if epoch + 1 < tc.epochs:  # a plan is a function of (lengths, seed, epoch, rank)
                ahead = (epoch + 1, chunk_order(planner.epoch(epoch + 1)))
                reader.queue("train", ahead[1])
            feed = EpochFeed(train_ds, plan, epoch, state.pos, state.step,
                             reader.stream("train"))
            bar = tqdm(total=len(plan), initial=state.pos, desc=f"epoch {epoch + 1}/{tc.epochs}",
                       unit="step", disable=rank != 0 or not log.bar, dynamic_ncols=True,
                       mininterval=1.0)
            window = MetricsWindow(device)
            for fed in feed:  # ---- one optimizer step
                last = fed.index == len(plan) - 1
                log_now = (state.step + 1) % cfg.log.every_steps == 0 or last
                res = runner.run(fed, state.step, want_errors=every == 1 or log_now,
                                 stop=stop.requested)  # GPU: LER on logging steps only
                state.advance(fed.index + 1)  # (the runner updates the weight average)
                window.add(res, padding_ratio([fed.batch], train_ds.lengths))
                bar.update(1)
                if state.step % every == 0 or last:
                    runner.check_bad(state.step, fed, log)
                if log_now:  # a collective: every rank logs at the same steps
                    rec = window.flush(runner.exch)
                    log_window(log, bar, rec, epoch, state.step, opt)
                    log.progress(epoch, tc.epochs, fed.index + 1, len(plan), rec)
                pause_point("step", state.step)
                stopping = stop.agree(res.stop)  # the verdict came with the step's message
                if stopping or checkpoint_due(cfg, state.step, last_ckpt):
                    runner.check_bad(state.step, fed, log)
                    save(state, f"step-{state.step:08d}.pt")
                    last_ckpt = time.monotonic()
                if stopping:
                    bar.close()
                    hint = resume_hint(config_path, overrides, run_dir,
                                       dist.launcher_prefix(comm.size))
                    log.info(f"stopped by {stop.signal} after step {state.step}; checkpoint "
                             f"saved; resume with: {hint}")
                    return run_dir
            fed = None  # the last chunk goes when validation takes its first
            bar.close()
            feed.close()
            state.end_epoch()
            if averager is not None:
                averager.end_epoch()
            if writer:
                # loads: the loader's read time since the last such line (what it read
                # ahead during the previous validation included)
                log.info(f"epoch {epoch + 1}: data wait {feed.wait_s:.2f} s, "
                         f"loads {reader.load_s - loads_logged:.2f} s")
            loads_logged = reader.load_s
            improved = True  # ---- validation, best and last checkpoints, early stopping
            if validating:
                own = averager.swap_in() if averager is not None else None  # score the average
                summ = validate(log, model, val_ds, val_keep, cfg, device, comm, workers, epoch,
                                state.step, reader.stream("val"), val_full)
                if own is not None:
                    averager.swap_out(own)
                improved = state.record_validation(summ["ler"], summ["loss"])
            # best.pt before last.pt: last.pt records the new best score, so once it is
            # written a resume never validates this epoch again; a kill between the two
            # writes resumes from an older position and rewrites the same best.pt
            if improved:
                save(state, "best.pt")
                pause_point("best", state.step)
            save(state, "last.pt")
            if tc.patience and state.since_best >= tc.patience:
                log.info(f"early stop: no improvement in {tc.patience} validations")
                break
        reader.close()  # (a read ahead for an epoch not trained ends here)
        test = None
        if cfg.data.test:  # the held-out score of the best checkpoint, once, at the end
            test = test_best(log, run if writer else None, model, train_ds, cfg, device,
                             comm, workers, state, card.labels)
        if val_ds is not None:  # the confidences' temperature, on the validation set
            calibrate_best(log, run if writer else None, model, val_ds, val_keep, cfg,
                           device, comm, workers)
        if writer:
            log.info(final_summary(run, state, test, time.monotonic() - t_start))
        return run_dir
    finally:  # on an error too: the bar must not redraw after the error message
        for obj in (bar, feed, reader):
            if obj is not None:
                obj.close()
        stop.restore()
        if runner is not None:
            runner.close()
        trace.finish(comm.rank, comm.size, lambda ev: collectives.gather_all(comm, ev),
                     failed=sys.exc_info()[0] is not None)
        log.finish(sys.exc_info()[1], stop.signal, state.state_dict())
        dist.on_abort(None)
        log.close()


def log_window(log: RunLog, bar, rec: dict, epoch: int, step: int, opt):
    """A train record: the progress bar's figures and a metrics line."""
    bar.set_postfix(loss=f"{rec['loss']:.3f}", ler=f"{rec['ler']:.3f}",
                    fps=f"{rec['frames_per_s']:.0f}")
    log.metrics(split="train", epoch=epoch, step=step, lr=opt.param_groups[0]["lr"], **rec)


def open_data(cfg: Config):
    """→ (train Dataset, its trainable mask (N,) bool, val Dataset or None, its mask).

    With ``data.folds``, both are the training file: the mask of one holds every fold but
    ``data.fold``, the other's that fold (``rnntrain.data.folds``)."""
    dc = cfg.data
    train_ds = Dataset.open(dc.train, dc.chunk_frames)
    from rnntrain.data.ncdata import out_of_alphabet_lines
    if n := out_of_alphabet_lines(dc.train):  # their targets lack what the alphabet lacks
        raise UserError(f"{dc.train}: {n} line(s) hold characters outside its alphabet (it "
                        "was converted as a validation/test set, with --labels-from); "
                        "convert training data with an alphabet that has them (--labels)")
    # a fold's validation set is the training file again (its own metadata object: the
    # reader of one never shares state with the other's)
    val_path = dc.train if dc.folds else dc.val
    val_ds = Dataset.open(val_path, dc.chunk_frames) if val_path else None
    if val_ds is not None:
        check_compatible(train_ds, val_ds, "training data")
    sub = total_subsample(cfg.model)  # frame stacking x the conv front end's width pooling
    keep = train_ds.feasible(sub)
    val_keep = val_ds.feasible(sub) if val_ds is not None else None
    if dc.folds:
        if train_ds.num_seqs < dc.folds:
            raise UserError(f"{dc.train}: {train_ds.num_seqs} sequences cannot make "
                            f"data.folds = {dc.folds} folds")
        mine, held = fold_masks(train_ds.num_seqs, dc.folds, dc.fold, cfg.train.seed)
        keep, val_keep = keep & mine, val_keep & held
    return train_ds, keep, val_ds, val_keep


def log_skipped(log: RunLog, cfg: Config, train_ds, keep, val_ds, val_keep):
    """Name the sequences too short for their targets; none left to train on is an error."""
    mine = held = None  # the sequences each set holds: all, or a fold's
    if (dc := cfg.data).folds:
        mine, held = fold_masks(train_ds.num_seqs, dc.folds, dc.fold, cfg.train.seed)
        log.info(f"fold {dc.fold} of {dc.folds} (data.folds, seed {cfg.train.seed}): "
                 f"training on {int(mine.sum())} of the {train_ds.num_seqs} sequences of "
                 f"{dc.train}, validating on the other {int(held.sum())}")
    if (keep != (mine if mine is not None else True)).any():
        log.info(describe_skipped(train_ds, keep, "train", mine))
    if val_keep is not None and (val_keep != (held if held is not None else True)).any():
        log.info(describe_skipped(val_ds, val_keep, "val", held))
    if keep.sum() == 0:
        raise UserError(f"{cfg.data.train}: no sequence is long enough for its target")


def checkpoint_due(cfg: Config, step: int, last_time: float) -> bool:
    """A step checkpoint every ``checkpoint.every_steps`` steps or ``every_minutes``."""
    every = cfg.checkpoint.every_steps
    return bool(every and step % every == 0) or \
        time.monotonic() - last_time > 60 * cfg.checkpoint.every_minutes


def validate(log: RunLog, model, val_ds, val_keep, cfg: Config, device, comm: Comm, workers: int,
             epoch: int, step: int, reader=None, full=None) -> dict:
    """Score the validation set (every rank; counts summed over ranks), log it, → summary.
    ``reader``: the run's reader stream with the set's chunks queued (``RunReader``);
    ``full``: ``evaluate``'s ``full_targets``."""
    t0 = time.perf_counter()
    # the training workers sleep meanwhile: evaluation's own workers take the same cores
    c = evaluate(model, val_ds, val_keep, cfg.batch.batch_frames, device, comm, workers=workers,
                 intra=cfg.compute.intra_threads, reader=reader, full_targets=full)["best"]
    seconds = time.perf_counter() - t0
    summ = c.summary()
    log.metrics(split="val", epoch=epoch, step=step, **summ, seconds=round(seconds, 3),
                frames_per_s=c.frames / max(seconds, 1e-9))
    log.info(f"epoch {epoch + 1} val: LER {summ['ler']:.4f} (sub {summ['sub']:.4f} "
             f"del {summ['del']:.4f} ins {summ['ins']:.4f}), seq error "
             f"{summ['seq_error']:.4f}, loss {summ['loss']:.3f}")
    return summ


def test_best(log: RunLog, run: RunFolder | None, model, train_ds, cfg: Config, device, comm: Comm,
              workers: int, state: TrainState, labels):
    """Score data.test with the best checkpoint's weights (every rank), and log it;
    ``labels``: the model's alphabet (lines holding characters the test file's lacks are
    scored against their whole text)."""
    test_ds = Dataset.open(cfg.data.test, cfg.data.chunk_frames)
    check_compatible(train_ds, test_ds, "training data")
    load_best(run, model, comm)
    full = full_targets(cfg.data.test, labels)
    summ = evaluate(model, test_ds, test_ds.feasible(total_subsample(cfg.model)),
                    cfg.batch.batch_frames, device, comm, workers=workers,
                    intra=cfg.compute.intra_threads,
                    full_targets=full[0] if full else None)["best"].summary()
    log.metrics(split="test", epoch=state.epoch - 1, step=state.step, **summ)
    log.info(f"test ({cfg.data.test}, best checkpoint): LER {summ['ler']:.4f} (sub "
             f"{summ['sub']:.4f} del {summ['del']:.4f} ins {summ['ins']:.4f}), seq "
             f"error {summ['seq_error']:.4f}, loss {summ['loss']:.3f}")
    return summ


def calibrate_best(log: RunLog, run: RunFolder | None, model, val_ds, val_keep, cfg: Config,
                   device, comm: Comm, workers: int):
    """Fit the temperature of the best checkpoint's confidences on the validation set and
    store it in best.pt (``rnntrain calibrate`` does the same for any checkpoint). The
    writing rank (``run``) alone scores the whole set; the weights are the best
    checkpoint's on every rank."""
    from rnntrain.run.calibrate import calibrate, store
    load_best(run, model, comm)
    if run is None or not run.best.exists():
        return
    cal = calibrate(model, val_ds, val_keep, cfg.batch.batch_frames, device, workers=workers,
                    data=str(cfg.data.val))
    if cal.labels == 0:
        log.info("calibration: the best checkpoint emits no label on the validation set; "
                 "confidences stay uncalibrated")
        return
    store(run.best, cal)
    log.info(f"calibration (validation set, best checkpoint): {cal.describe()}")


def best_validation(metrics_path: Path) -> tuple[float, int] | None:
    """(LER, 1-based epoch) of the best validation record in ``metrics.jsonl`` (ties go to
    the lower loss, as ``TrainState.record_validation``), over every session of the run;
    None without one."""
    best = None
    try:
        lines = metrics_path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        if isinstance(r, dict) and r.get("split") == "val" and "ler" in r:
            key = (r["ler"], r.get("loss", math.inf), int(r.get("epoch", 0)) + 1)
            best = key if best is None or key[:2] < best[:2] else best
    return None if best is None else (best[0], best[2])


def final_summary(run: RunFolder, state: TrainState, test: dict | None,
                  seconds: float) -> str:
    """The line a training ends on: best validation LER, its epoch, where best.pt is,
    the test LER (with data.test) and the wall time of this process."""
    m, s = divmod(int(round(seconds)), 60)
    wall = f"{m} min {s} s" if m else f"{s} s"
    best = best_validation(run.metrics)
    head = (f"best validation LER {best[0]:.4f} at epoch {best[1]}"
            + (" (the starting weights)" if best[1] == 0 else "") if best else
            "no validation set (best.pt is the last epoch's)")
    tail = f", test LER {test['ler']:.4f}" if test else ""
    return (f"finished {state.epoch} epoch(s), {state.step} steps: {head}{tail}; model "
            f"{run.best}; wall time {wall}")


def load_best(run: RunFolder | None, model, comm: Comm):
    """Every rank: the weights of checkpoints/best.pt (read by the writing rank, which
    holds ``run``; then broadcast)."""
    if run is not None and run.best.exists():  # the weights inference would use
        model.load_state_dict(ckpt.read(run.best).inference_weights())
    collectives.broadcast_weights(comm, list(model.parameters()), "best-checkpoint broadcast")


def training_parts(model, opt, averager=None) -> dict:
    """The parts of the training a checkpoint holds, by name (``checkpoint.Stateful``):
    a resume restores each from its entry (the ``OPTIONAL_PARTS`` where older files lack
    them). The TrainState (the plan position and scores) is passed at save time
    (``save_checkpoint``)."""
    parts = {"model": model, "optim": opt}
    if averager is not None:
        parts["average"] = averager
    return parts


OPTIONAL_PARTS = ("average",)  # a run that starts averaging on resume starts it there


def save_checkpoint(run: RunFolder | None, card: ckpt.ModelCard, parts: dict, cfg,
                    runner: StepRunner, state: TrainState, name: str):
    """``checkpoints/name`` with the card, the training parts and the training state, fp16
    loss scale included. ``run``: the writing rank's run folder, None on the others."""
    if run is None:
        return
    state.loss_scale = runner.loss_scale_state()
    ckpt.save(run.checkpoint(name), card, {**parts, "state": state})
    if name.startswith("step-"):  # only once the new one is complete
        run.prune(cfg.checkpoint.keep_last)


def resume_checkpoint(comm: Comm, resume: str, run: RunFolder, ds: Dataset, parts: dict, cfg):
    """Rank 0 picks and loads the checkpoint into ``parts`` (falling back past unusable
    ones) and returns it; the other ranks return None and receive its state in
    ``StepRunner.start``. An error is raised on every rank."""
    ck, err = None, None
    if comm.rank == 0:
        try:
            ck = ckpt.load_for_resume(resume, run, ds, parts, to_dict(cfg)["model"],
                                      optional=OPTIONAL_PARTS,
                                      warn=lambda m: print(m, file=sys.stderr, flush=True))
        except UserError as e:
            err = str(e)
    err = collectives.from_root(comm, err)
    if err:
        raise UserError(err)
    return ck
