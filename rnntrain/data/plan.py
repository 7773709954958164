"""Epoch plans: which sequences form each step, from lengths alone.

``make_plan`` is a pure function of (dataset metadata, seed, epoch, rank, world size): no
file is read, so plans are testable without data and identical on every rank. A plan is a
list of Steps in chunk order (each chunk's steps are contiguous, so the reader visits each
chunk once), and every rank's plan has the same number of steps by construction.

Batches group sequences of similar length under a padded-frame budget (``batch_frames``
counts padding: n × longest ≤ budget): on speech-like length spreads random batches
waste about two thirds of the compute on padding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Step:
    """One optimizer step as seen by one rank.

    chunk: the chunk every sequence of this step lives in; seqs: this rank's share of the
    global batch (global ids, possibly empty when the batch has fewer sequences than ranks).
    """
    chunk: int
    seqs: tuple[int, ...]


def rng_for(seed: int, *keys: int) -> np.random.Generator:
    """A generator determined by (seed, keys) alone: no hidden global state."""
    return np.random.default_rng([seed & 0xFFFFFFFF, *[k & 0xFFFFFFFF for k in keys]])


def bucket_length(n: int, per_octave: int) -> int:
    """The padded length of a batch whose longest sequence has ``n`` frames.

    ``per_octave`` = 0: ``n`` itself. Otherwise the next size of a geometric ladder with
    ``per_octave`` sizes per doubling, rounded up to a multiple of 8: a GPU then sees a
    few tensor shapes again and again (kernels and cached allocations repeat) for at most
    2^(1/per_octave) times the padding (19% with 4), plus the rounding to 8.
    """
    if per_octave <= 0 or n <= 0:
        return int(n)

    def ladder(e: int) -> int:  # the e-th size: 2^(e/per_octave), up to a multiple of 8
        return -(-math.ceil(2.0 ** (e / per_octave) - 1e-9) // 8) * 8

    e = max(0, math.ceil(per_octave * math.log2(n) - 1e-9))
    while e > 0 and ladder(e - 1) >= n:  # the rounding to 8 can merge neighbouring sizes
        e -= 1
    return max(ladder(e), -(-int(n) // 8) * 8)


def bucket_lengths(lengths: np.ndarray, per_octave: int) -> np.ndarray:
    """``bucket_length`` of every entry (N,) → (N,) int64."""
    if per_octave <= 0:
        return np.asarray(lengths)
    return np.array([bucket_length(int(n), per_octave) for n in lengths], dtype=np.int64)


class _Rounded:
    """A dataset seen with bucket-rounded lengths (for batch budgets): the rest delegates."""

    def __init__(self, ds, lengths: np.ndarray):
        self._ds, self.lengths = ds, lengths

    def __getattr__(self, name):
        return getattr(self._ds, name)


def group_by_length(ids: np.ndarray, lengths: np.ndarray, batch_frames: int,
                    rng: np.random.Generator | None = None) -> list[np.ndarray]:
    """Sort ``ids`` by length and cut into batches with n × max_len ≤ batch_frames.

    Ties are broken randomly with ``rng`` so batch composition varies between epochs.
    A sequence longer than the budget forms a batch of its own.
    """
    if len(ids) == 0:
        return []
    key = rng.random(len(ids)) if rng is not None else np.arange(len(ids))
    order = ids[np.lexsort((key, lengths[ids]))]
    batches, start = [], 0
    for i in range(1, len(order) + 1):
        if i == len(order) or (i + 1 - start) * lengths[order[i]] > batch_frames:
            batches.append(order[start:i])
            start = i
    return batches


def deal(batch: np.ndarray, lengths: np.ndarray, rank: int, world: int) -> tuple[int, ...]:
    """Rank r's share of a batch, dealt in snake order over the length-sorted batch
    (ranks 0..W-1, then W-1..0, ...): plain round-robin would give rank 0 the longest
    sequence of every round, and the others would wait for it at every step."""
    order = batch[np.argsort(-lengths[batch], kind="stable")]
    pos = np.arange(len(order))
    owner = np.where((pos // world) % 2 == 0, pos % world, world - 1 - pos % world)
    return tuple(int(s) for s in order[owner == rank])


def make_plan(ds, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
              rank: int = 0, world: int = 1, shuffle: bool = True,
              round_lengths: int = 0) -> list[Step]:
    """The epoch's steps for ``rank`` of ``world``.

    ds: a Dataset (only lengths, chunks and shards are used); keep: (N,) bool mask of the
    sequences to train on (infeasible ones are False). Single-shard datasets: every rank
    forms the same global batches and takes its dealt share. Sharded datasets (manifest):
    see ``rnntrain.manifest.plan_sharded``. round_lengths > 0: the padded-frame budget
    counts each sequence at its ``bucket_length`` (the length the worker pads it to).
    """
    if round_lengths:
        ds = _Rounded(ds, bucket_lengths(ds.lengths, round_lengths))
    if len(ds.shards) > 1:
        from rnntrain.data.manifest import plan_sharded
        return plan_sharded(ds, keep, batch_frames, seed, epoch, rank, world, shuffle)
    rng = rng_for(seed, epoch)
    chunk_ids = np.arange(len(ds.chunks))
    if shuffle:
        chunk_ids = rng.permutation(chunk_ids)
    steps = []
    for k in chunk_ids.tolist():
        ids = ds.chunks[k].seqs
        ids = ids[keep[ids]]
        batches = group_by_length(ids, ds.lengths, batch_frames, rng if shuffle else None)
        if shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        steps += [Step(k, deal(b, ds.lengths, rank, world)) for b in batches]
    return steps


def padding_ratio(steps: list[Step], lengths: np.ndarray) -> float:
    """Padded frames / real frames over a plan (1.0 = no padding)."""
    padded = sum(len(s.seqs) * int(lengths[list(s.seqs)].max()) for s in steps if s.seqs)
    real = sum(int(lengths[list(s.seqs)].sum()) for s in steps if s.seqs)
    return padded / max(real, 1)


def chunk_order(steps: list[Step]) -> list[int]:
    """The chunks a plan visits, in order, each once."""
    out: list[int] = []
    for s in steps:
        if not out or out[-1] != s.chunk:
            assert s.chunk not in out, "a plan must visit each chunk once"
            out.append(s.chunk)
    return out


def resumed_plan(ds, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
                 rank: int, world: int, parts: list, round_lengths: int = 0) -> list[Step]:
    """The rest of an epoch that was interrupted and resumed on other rank counts.

    parts: [(world_k, pos_k), ...] in order: segment k of the epoch ran the plan of
    world_k ranks over the sequences that earlier segments had not trained, for pos_k
    steps. What a segment consumed is a pure function of the metadata and (world_k, pos_k)
    (the union of every rank's first pos_k steps), so the sequences left can be computed
    exactly and are re-dealt here to ``world`` ranks: none skipped, none repeated. The
    batches differ from an uninterrupted run's (they are cut from the sequences left).
    """
    left = keep.copy()
    for w, pos in parts:
        consumed = []
        for r in range(int(w)):
            for st in make_plan(ds, left, batch_frames, seed, epoch, r, int(w),
                                round_lengths=round_lengths)[:int(pos)]:
                consumed.extend(st.seqs)
        left[np.asarray(consumed, dtype=np.int64)] = False
    return make_plan(ds, left, batch_frames, seed, epoch, rank, world,
                     round_lengths=round_lengths)
