"""Evaluation: CTC loss, best-path (and beam) decoding, label error rates.

Used for validation during training and by ``rnntrain eval`` / ``rnntrain decode`` /
``rnntrain tune-decoder``. Forward only (``torch.inference_mode``), in batches of
``EVAL_BATCH_SCALE`` x the training batch's padded frames (fewer for a small set:
``eval_batch_frames``), on the worker pool: each worker takes a whole batch (forward, CTC
loss, best path, edit distances, beam search) with one intra-op thread, so one worker's
decoding and scoring overlap the other's forward. The per-batch counts are merged in plan
order, so the result does not depend on the timing. Under MPI each rank evaluates its
dealt share of every batch and the counts are summed.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import torch

from rnntrain.compute.model import ctc_loss_sum
from rnntrain.compute.pool import Task, WorkerPool, default_threads, intra_threads
from rnntrain.compute.tasks import collate
from rnntrain.data.chunkbuf import ChunkBuffers
from rnntrain.data.plan import make_plan
from rnntrain.data.reader import ChunkReader
from rnntrain.decode.score import ErrorCounts, padded_as_strings, ragged_as_strings
from rnntrain.decode.search import best_path_batch
from rnntrain.parallel.collectives import sum_over_ranks
from rnntrain.parallel.comm import Comm

# Evaluation batches hold this many times batch.batch_frames padded frames. No gradient,
# no autograd graph and no per-task gradient buffer is kept, so a forward pass over a
# batch holds a few layers' outputs (T x N x 2H floats) where training holds every
# layer's gates and states for the backward: with two workers each running a batch this
# large the activations stay below one training step's (docs/threads.md, "Validation and
# eval").
EVAL_BATCH_SCALE = 2
# ... but a small set is cut into at least this many batches (each no smaller than a
# quarter of that budget nor the longest sequence): 200 validation sequences of the
# reference workload made 4 batches for 2 workers, so a worker sat idle while the other
# finished the last one (docs/threads.md, "Validation and eval"). A constant, not the
# worker count: every MPI rank must plan the same batches.
EVAL_MIN_BATCHES = 8


def eval_batch_frames(lengths: np.ndarray, budget: int) -> int:
    """Padded frames per evaluation batch for sequences of ``lengths`` (those scored, all
    ranks'): ``budget``, or less for a set too small for ``EVAL_MIN_BATCHES`` batches of
    it, never below ``budget // 4`` (per-batch costs) nor the longest sequence."""
    if not len(lengths):
        return budget
    share = int(lengths.sum()) // EVAL_MIN_BATCHES
    return max(min(budget, share), budget // 4, int(lengths.max()))


@dataclass
class _Scored:
    """One batch's figures (``counts``), plus what the caller's callbacks need."""
    counts: dict
    hyps: list | None = None          # N label lists (the decoder's when there is one)
    log_probs: np.ndarray | None = None  # (T', N, C) float32
    lengths: np.ndarray | None = None    # (N,) output frames
    per_seq: list | None = None          # N results of the ``per_seq`` function


@dataclass
class _BatchScorer:
    """The worker function: one batch through the network, decoded and scored."""
    model: torch.nn.Module
    device: torch.device
    decoder: object = None
    space: int | None = None
    score: bool = True
    want_hyps: bool = False
    want_log_probs: bool = False
    decode_threads: int = 1
    # an ensemble's voting (``infer.ensemble.EnsembleNet.vote_batch``): x, lengths →
    # (averaged log-probs or None, output lengths or None, N voted label lists) in place
    # of the model's forward and best path; the loss is the averaged posteriors' (NaN
    # where the members' frame rates differ)
    vote: Callable | None = None
    per_seq: Callable | None = None   # (T', C) log-probs of one sequence -> any result

    def __call__(self, worker: int, task: Task) -> _Scored:
        frames, targets, scored = task.payload   # scored: what the hypotheses meet
        x, lengths = collate(frames)
        voted = None
        with torch.inference_mode():
            if self.vote is not None:
                lp, out_len, voted = self.vote(x.to(self.device), lengths)
            else:
                lp, out_len = self.model(x.to(self.device), lengths)
            loss = 0.0 if not self.score else float("nan") if lp is None else \
                float(ctc_loss_sum(lp, out_len, targets, self.model.blank))
            lp = lp.float().cpu().numpy() if lp is not None else None  # (T', N, C)
        lens = out_len.cpu().numpy() if out_len is not None else None
        best = ErrorCounts(loss_sum=loss, frames=int(lengths.sum()))
        refs, _ = ragged_as_strings(scored)
        if voted is not None:
            bp, n = _padded(voted)
        else:
            bp, n = best_path_batch(lp.argmax(-1), lens, self.model.blank)  # (N, L), (N,)
        best.add_keys(refs, padded_as_strings(bp, n), self.space)
        out = _Scored({"best": best}, log_probs=lp if self.want_log_probs else None,
                      lengths=lens if self.want_log_probs else None)
        if self.decoder is not None:
            hyps = self.decoder.decode_batch(lp, lens, self.decode_threads)
            beam = ErrorCounts()
            beam.add_keys(refs, ragged_as_strings(
                [np.asarray(h, np.int64) for h in hyps])[0], self.space)
            out.counts["beam"] = beam
            out.hyps = hyps if self.want_hyps else None
        elif self.want_hyps:
            out.hyps = [bp[j, : n[j]].tolist() for j in range(len(n))]
        if self.per_seq is not None:
            out.per_seq = [self.per_seq(lp[: lens[j], j]) for j in range(len(lens))]
        return out


def _padded(hyps: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """N label lists → labels (N, L) padded with -1, counts (N,) (``best_path_batch``'s
    layout)."""
    n = np.array([len(h) for h in hyps], np.int64)
    out = np.full((len(hyps), int(n.max(initial=0))), -1, np.int64)
    for j, h in enumerate(hyps):
        out[j, :len(h)] = h
    return out, n


def eval_batches(ds, keep: np.ndarray, batch_frames: int, rank: int = 0, world: int = 1,
                 batch_scale: int = EVAL_BATCH_SCALE) -> dict[int, list[tuple]]:
    """The evaluation plan of ``rank``: {chunk id: its batches (sequence-id tuples)}, in
    the order ``evaluate`` reads the chunks (a pure function of the lengths, like the
    training plan: a training run queues these chunks on its reader ahead of time)."""
    budget = eval_batch_frames(ds.lengths[keep], batch_frames * batch_scale)
    steps = make_plan(ds, keep, budget, seed=0, epoch=0, rank=rank, world=world,
                      shuffle=False)
    by_chunk: dict[int, list] = {}
    for s in steps:
        if s.seqs:  # a rank's share of a small batch may be empty
            by_chunk.setdefault(s.chunk, []).append(s.seqs)
    return by_chunk


def eval_workers(workers: int, device: torch.device, comm: Comm | None = None) -> int:
    """Worker threads for evaluation: ``workers``, else this rank's share of the usable
    cores (as training's default); one on a GPU (one stream)."""
    if device.type != "cpu":
        return 1
    return workers or default_threads(0, 1, comm.local_size if comm is not None else 1)


def evaluate(model, ds, keep: np.ndarray, batch_frames: int, device: torch.device,
             comm: Comm | None = None, beam: int = 0,
             on_hyp: Callable[[int, list[int]], None] | None = None,
             decoder=None, space: int | None = None, threads: int = 1,
             on_log_probs: Callable[[list[int], np.ndarray, np.ndarray], None] | None = None,
             score: bool = True, workers: int = 0, intra: int = 1,
             batch_scale: int = EVAL_BATCH_SCALE, vote: Callable | None = None,
             per_seq: Callable | None = None,
             on_seq: Callable[[int, object], None] | None = None,
             full_targets: dict[int, np.ndarray] | None = None, reader=None
             ) -> dict[str, ErrorCounts]:
    """Score ``ds`` (only sequences with keep[i]); returns {"best": counts[, "beam": counts]}.

    "beam" is the ``decoder``'s (a ``decode.beam.Decoder``: beam search, lexicon, LM), or a
    plain beam search of width ``beam``. ``space``: the word separator's label index, for
    word error rates. Infeasible sequences (keep False) are counted as skipped.
    on_hyp(seq id, labels) is called with each hypothesis (the decoder's if there is one),
    in plan order; on_log_probs(seq ids, log_probs (T, N, C), lengths (N,)) with each
    batch's network output (``tune-decoder`` keeps them to decode again). score=False
    (decoding: targets absent or not needed) skips the CTC loss. ``full_targets``
    {sequence: labels}: score those sequences' hypotheses against these instead of their
    targets (lines holding characters the alphabet lacks, ``ncdata.full_targets``; the
    CTC loss still uses the targets).

    ``workers`` threads (0: this rank's cores, see ``eval_workers``) each score whole
    batches of ``batch_scale`` x ``batch_frames`` padded frames (``eval_batch_frames``:
    less for a small set) with ``intra`` intra-op threads; ``threads``: the decoder's threads when one worker decodes alone.
    ``vote``: an ensemble's voting (see ``_BatchScorer.vote``; no decoder then).
    ``reader``: serves the set's chunks in the order of ``eval_batches`` (a training run's
    ``run.step.RunReader`` stream: validation on the run's one loader thread), not closed
    here; None: a ``ChunkReader`` of its own.
    """
    assert vote is None or (decoder is None and not beam and on_log_probs is None
                            and per_seq is None)
    rank, world = (comm.rank, comm.size) if comm is not None else (0, 1)
    workers = eval_workers(workers, device, comm)
    was_training = model.training
    model.eval()
    if decoder is None and beam:
        from rnntrain.decode.beam import Decoder
        decoder = Decoder(ds.labels, model.blank, beam=beam)
    counts = {"best": ErrorCounts()}
    if decoder is not None:
        counts["beam"] = ErrorCounts()
    counts["best"].skipped = int((~keep).sum()) if rank == 0 else 0
    by_chunk = eval_batches(ds, keep, batch_frames, rank, world, batch_scale)
    scorer = _BatchScorer(model, device, decoder, space, score, want_hyps=on_hyp is not None,
                          want_log_probs=on_log_probs is not None,
                          decode_threads=threads if workers == 1 else 1, vote=vote,
                          per_seq=per_seq)
    own = reader is None
    reader = ChunkReader(partial(ds.load_chunk, buffers=ChunkBuffers()), list(by_chunk)) \
        if own else reader
    try:
        # the pool sets the process-wide intra-op count: restored on the way out
        with intra_threads(torch.get_num_threads()), \
                WorkerPool(scorer, workers, intra, name="rnntrain-eval",
                           inline=workers == 1) as pool:
            for want in by_chunk:
                k, payload = reader.next()
                assert k == want, "reader out of plan order"
                batches = by_chunk[k]
                # costliest first in the queue (padded frames), merged back in plan order
                order = sorted(range(len(batches)), key=lambda i: -len(batches[i]) * max(
                    len(payload[s]) for s in batches[i]))
                full = full_targets or {}
                tasks = [Task(j, batches[i], ([payload[s] for s in batches[i]],
                                              [ds.targets[s] for s in batches[i]],
                                              [full.get(s, ds.targets[s]) for s in batches[i]]))
                         for j, i in enumerate(order)]
                results, _ = pool.run(tasks)
                payload = tasks = None  # the chunk can go once its batches are scored
                by_plan = [None] * len(batches)
                for j, i in enumerate(order):
                    by_plan[i] = results[j]
                for seqs, res in zip(batches, by_plan):
                    for key, c in res.counts.items():
                        counts[key].merge(c)
                    if on_log_probs is not None:
                        on_log_probs(list(seqs), res.log_probs, res.lengths)
                    if on_hyp is not None:
                        for sid, h in zip(seqs, res.hyps):
                            on_hyp(sid, h)
                    if on_seq is not None:
                        for sid, r in zip(seqs, res.per_seq):
                            on_seq(sid, r)
    finally:
        if own:
            reader.close()
        model.train(was_training)
    if comm is not None and comm.size > 1:
        for key, c in counts.items():
            counts[key] = ErrorCounts.from_array(sum_over_ranks(comm, c.as_array(),
                                                                 f"{key} error counts"))
    if decoder is not None:
        b = counts["beam"]
        b.loss_sum, b.frames, b.skipped = (counts["best"].loss_sum, counts["best"].frames,
                                           counts["best"].skipped)
    return counts
