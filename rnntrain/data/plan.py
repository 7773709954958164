"""Epoch plans: which sequences form each step, from lengths alone.

``make_plan`` is a pure function of (dataset metadata, seed, epoch, rank, world size,
strategy): no file is read, so plans are testable without data and identical on every
rank. A plan is a list of Steps in chunk order (each chunk's steps are contiguous, so the
reader visits each chunk once), and every rank's plan has the same number of steps by
construction.

Strategies (``PLANNERS``, chosen with ``batch.plan`` or ``make_plan(strategy=...)``):

``length``
    One file (or any dataset seen as one): per chunk, sequences sorted by length and cut
    into global batches under a padded-frame budget (``batch_frames`` counts padding:
    n × longest ≤ budget), cut back to a multiple of ``batch_multiple`` sequences
    where that many fit (default: W, so that every rank gets as many); each batch is
    dealt over the ranks in snake order. One rank with ``batch_multiple = W`` plans
    exactly the global batches of W ranks. On
    speech-like length spreads random batches waste about two thirds of the compute on
    padding.
``sharded``
    A manifest written by ``rnntrain-data shard``: rank r of W serves shards r, r+W, r+2W,
    … (S shards, S a multiple of W). Shards were dealt round-robin from one length-sorted
    list, so shard r's k-th sequence is about as long as every other shard's k-th.
    Batches are therefore defined over *positions* (the same for all shards of a round)
    using the longest sequence over the shards at each position, so every rank has the
    same number of steps by construction and, at step k, a batch of the same length
    class. Batch order is shuffled per chunk, chunk order per epoch, both with a seed
    shared by all ranks. Each rank reads only its own shards.
``random``
    The naive data-parallel baseline the benchmarks compare against: each rank takes a
    random 1/W of the sequences and batches them alone under ``batch_frames / W``; per
    chunk all ranks stop at the shortest rank's step count, so a few batches per chunk
    are not trained in an epoch (``remainder_note`` says how many sequences).
``auto`` (the default)
    ``sharded`` for a dataset with more than one shard, ``length`` otherwise.

A training run holds one ``BatchPlanner``: its ``PlanSettings`` (the config's plan keys,
read in one place) and the dataset's lengths are fixed once, then ``epoch(e, rank)``,
``set_epoch`` + iteration, ``resume`` (an epoch interrupted on other rank counts) and
``state_dict`` give the epochs, over the pure ``make_plan``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from rnntrain.errors import UserError


@dataclass(frozen=True)
class Batch:
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


def group_by_length(ids: np.ndarray, lengths: np.ndarray, batch_frames: int,
                    rng: np.random.Generator | None = None, multiple: int = 1
                    ) -> list[np.ndarray]:
    """Sort ``ids`` by length and cut into batches with n × max_len ≤ batch_frames.

    Ties are broken randomly with ``rng`` so batch composition varies between epochs.
    A sequence longer than the budget forms a batch of its own. ``multiple`` (the number
    of ranks that share each batch): a batch is cut back to a multiple of it where at
    least that many sequences fit, so that every rank gets as many sequences (the batch
    after it starts earlier); the last batch keeps what is left. 1 cuts where the budget
    ends.
    """
    if len(ids) == 0:
        return []
    key = rng.random(len(ids)) if rng is not None else np.arange(len(ids))
    order = ids[np.lexsort((key, lengths[ids]))]
    batches, start = [], 0
    i = 1
    while i <= len(order):
        if i == len(order) or (i + 1 - start) * lengths[order[i]] > batch_frames:
            n = i - start
            if i < len(order) and n > multiple:
                n -= n % multiple  # rather than a rank with one sequence more
            batches.append(order[start:start + n])
            start += n
            i = start
        i += 1
    return batches


def snake_share(batch: np.ndarray, lengths: np.ndarray, rank: int, world: int) -> tuple[int, ...]:
    """Rank r's share of a batch, dealt in snake order over the length-sorted batch
    (ranks 0..W-1, then W-1..0, ...): plain round-robin would give rank 0 the longest
    sequence of every round, and the others would wait for it at every step."""
    order = batch[np.argsort(-lengths[batch], kind="stable")]
    pos = np.arange(len(order))
    owner = np.where((pos // world) % 2 == 0, pos % world, world - 1 - pos % world)
    return tuple(int(s) for s in order[owner == rank])


def plan_length(ds, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
                rank: int = 0, world: int = 1, shuffle: bool = True,
                multiple: int = 0) -> list[Batch]:
    """The ``length`` strategy (see the module doc): every rank forms the same global
    batches, chunk by chunk, and takes its dealt share (``snake_share``). ``multiple``:
    batches hold a multiple of it where that many fit (0: ``world``)."""
    rng = rng_for(seed, epoch)
    chunk_ids = np.arange(len(ds.chunks))
    if shuffle:
        chunk_ids = rng.permutation(chunk_ids)
    steps = []
    for k in chunk_ids.tolist():
        ids = ds.chunks[k].seqs
        ids = ids[keep[ids]]
        batches = group_by_length(ids, ds.lengths, batch_frames, rng if shuffle else None,
                                  multiple=multiple or world)
        if shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        steps += [Batch(k, snake_share(b, ds.lengths, rank, world)) for b in batches]
    return steps


def _positions(ds, shard: list[int]) -> list[np.ndarray]:
    """Per chunk of a shard, its sequence ids in position order.

    Sorted shards: ascending length inside each chunk (what the tool writes; re-sorting
    makes a hand-edited manifest still plannable). Shuffled shards: file order.
    """
    out = []
    for k in shard:
        ids = ds.chunks[k].seqs
        if ds.within == "sorted":
            ids = ids[np.argsort(ds.lengths[ids], kind="stable")]
        out.append(ids)
    return out


def _blocks(per_shard: list[list[np.ndarray]]) -> list[list[tuple[int, int, list[int]]]]:
    """Cut positions at every chunk boundary of any shard of the round.

    Shards are aligned at their *end* (their longest sequences): the tool deals the
    incomplete round of a corpus that does not divide evenly at the short end, so a
    shorter shard lacks a short sequence at position 0, not a long one at the end.
    Returns blocks, each a list of segments (start, stop, chunk index per shard or -1
    where the shard has no sequence). A segment lies in one chunk per shard; a block ends
    where no shard's chunk goes on, so blocks can be visited in any order and each chunk
    is read once. With aligned chunks (what the tool writes) a block is one chunk.
    """
    sizes = [sum(len(c) for c in chunks) for chunks in per_shard]
    width = max(sizes)
    ends = [width - n + np.cumsum([len(c) for c in chunks], dtype=np.int64)
            for n, chunks in zip(sizes, per_shard)]
    cuts = sorted({0, *(width - n for n in sizes)}.union(*[e.tolist() for e in ends]))
    segs = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        owner = []
        for n, e in zip(sizes, ends):
            j = int(np.searchsorted(e, a, side="right"))
            owner.append(j if a >= width - n and j < len(e) else -1)
        segs.append((a, b, owner))
    blocks: list[list] = []
    for i, seg in enumerate(segs):
        prev = segs[i - 1][2] if i else None
        if prev is None or all(p != o or p < 0 for p, o in zip(prev, seg[2])):
            blocks.append([])
        blocks[-1].append(seg)
    return blocks


def plan_sharded(ds, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
                 rank: int = 0, world: int = 1, shuffle: bool = True) -> list[Batch]:
    """Rank ``rank``'s steps for one epoch over a sharded dataset (see the module doc).

    The global batch of a step is the union of the ranks' batches: n positions × W ranks
    sequences with n × W × (longest at those positions) ≤ ``batch_frames``, so W ranks
    with budget B train on the same batch sizes as one rank with B. Every rank computes
    the same structure from metadata alone and takes its own shard's sequences.
    """
    n_shards = len(ds.shards)
    if n_shards % world:
        divisors = [str(d) for d in range(1, n_shards + 1) if n_shards % d == 0]
        raise UserError(f"{ds.source}: {n_shards} shards cannot be dealt evenly to {world} "
                        f"ranks; re-shard with --shards a multiple of {world} (or run on "
                        f"{', '.join(divisors)} ranks)")
    rng = rng_for(seed, epoch, 0x5A4D)
    blocks = []   # per block: its segments as (per-rank chunk ids, per-rank position lists)
    for rnd in range(n_shards // world):
        group = [ds.shards[rnd * world + r] for r in range(world)]
        per_shard = [_positions(ds, sh) for sh in group]
        flat = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in per_shard]
        width = max(len(f) for f in flat)
        # end-aligned positions (see _blocks): -1 marks "no sequence here"
        flat = [np.concatenate([np.full(width - len(f), -1, np.int64), f]) for f in flat]
        for blk in _blocks(per_shard):
            blocks.append([([group[r][o[r]] if o[r] >= 0 else -1 for r in range(world)],
                            [f[a:b] for f in flat]) for a, b, o in blk])
    steps: list[Batch] = []
    for u in (rng.permutation(len(blocks)) if shuffle else range(len(blocks))):
        for chunk_of, pos in blocks[u]:
            batches = _batches(ds, keep, pos, batch_frames, world)
            if shuffle:
                batches = [batches[i] for i in rng.permutation(len(batches))]
            mine = pos[rank]
            for bpos in batches:
                ids = mine[bpos]
                ids = ids[ids >= 0]
                ids = ids[keep[ids]]
                ids = ids[np.argsort(-ds.lengths[ids], kind="stable")]
                steps.append(Batch(chunk_of[rank], tuple(int(s) for s in ids)))
    return _fill_empty(steps, ds.source, rank)


def _batches(ds, keep: np.ndarray, pos: list[np.ndarray], batch_frames: int,
             world: int) -> list[np.ndarray]:
    """Batches (arrays of positions) of one segment, from the longest kept sequence over
    the ranks at each position; positions where no rank keeps anything are left out.

    pos: per rank, the segment's sequence ids by position (-1: none), all of one length.
    """
    longest = np.zeros(len(pos[0]), np.int64)
    for p in pos:
        ok = p >= 0
        longest[ok] = np.maximum(longest[ok], np.where(keep[p[ok]], ds.lengths[p[ok]], 0))
    live = np.flatnonzero(longest > 0)
    return _cut(live, longest, batch_frames, world)


def _fill_empty(steps: list[Batch], source: str, rank: int) -> list[Batch]:
    """Steps where this rank's shard has already ended (chunk -1, no sequences) stay on a
    chunk the rank visits anyway, so the reader neither moves nor reads anything extra."""
    real = [s.chunk for s in steps if s.chunk >= 0]
    if steps and not real:
        raise UserError(f"{source}: rank {rank}'s shards hold no sequences")
    prev = real[0] if real else -1
    out = []
    for s in steps:
        prev = s.chunk if s.chunk >= 0 else prev
        out.append(s if s.chunk >= 0 else Batch(prev, s.seqs))
    return out


def _cut(live: np.ndarray, longest: np.ndarray, batch_frames: int,
         world: int) -> list[np.ndarray]:
    """Cut ascending positions into batches with n × world × max(longest) ≤ batch_frames."""
    batches, start, peak = [], 0, 0
    for i in range(len(live)):
        peak_i = max(peak, int(longest[live[i]]))
        if i > start and (i + 1 - start) * world * peak_i > batch_frames:
            batches.append(live[start:i])
            start, peak_i = i, int(longest[live[i]])
        peak = peak_i
    if len(live):
        batches.append(live[start:])
    return batches


def plan_random(ds, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
                rank: int = 0, world: int = 1, shuffle: bool = True) -> list[Batch]:
    """The ``random`` strategy (see the module doc): rank r batches its own random 1/W of
    each chunk alone under ``batch_frames // W``; per chunk every rank keeps the shortest
    rank's step count, so that all ranks take the same number of steps."""
    owner = np.empty(ds.num_seqs, np.int64)  # a fixed random deal, the same every epoch
    owner[rng_for(seed, 991).permutation(ds.num_seqs)] = np.arange(ds.num_seqs) % world
    chunk_ids = np.arange(len(ds.chunks))
    if shuffle and len(chunk_ids) > 1:
        chunk_ids = rng_for(seed, epoch).permutation(chunk_ids)
    # every rank's generators, drawn chunk after chunk: each rank needs all ranks' counts
    draws = [(rng_for(seed, epoch, r), rng_for(seed, epoch, r, 1)) for r in range(world)]
    steps = []
    for k in chunk_ids.tolist():
        ids = ds.chunks[k].seqs
        per_rank = []
        for r, (rng_batch, rng_order) in enumerate(draws):
            mine = ids[keep[ids] & (owner[ids] == r)]
            batches = group_by_length(mine, ds.lengths, max(1, batch_frames // world),
                                      rng_batch if shuffle else None)
            order = rng_order.permutation(len(batches)) if shuffle else range(len(batches))
            per_rank.append([batches[i] for i in order])
        n = min(len(b) for b in per_rank)
        steps += [Batch(k, tuple(int(s) for s in b)) for b in per_rank[rank][:n]]
    return steps


Planner = Callable[..., "list[Batch]"]
# strategy name -> planner(ds, keep, batch_frames, seed, epoch, rank, world, shuffle)
PLANNERS: dict[str, Planner] = {"length": plan_length, "sharded": plan_sharded,
                                "random": plan_random}
STRATEGIES = ("auto", *PLANNERS)


def strategy_for(ds, strategy: str = "auto") -> str:
    """The planner ``auto`` picks for ``ds`` (or ``strategy`` itself, checked)."""
    if strategy == "auto":
        return "sharded" if len(ds.shards) > 1 else "length"
    if strategy not in PLANNERS:
        raise UserError(f"plan strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return strategy


@dataclass(frozen=True)
class PlanSettings:
    """The batch plan's settings, fixed for a run (the training config's plan keys)."""
    batch_frames: int
    """padded-frame budget of a global batch (n × longest, all ranks together)"""
    seed: int
    """seed of the plan's draws (shuffles, tie breaks); with the epoch, all it depends on"""
    round_lengths: int = 0
    """> 0: each sequence counts at its ``bucket_length`` (what the worker pads it to);
    the task computer pads with the same value (``StepRunner`` takes it from here)"""
    strategy: str = "auto"
    """a key of ``PLANNERS`` or "auto" (see the module doc)"""
    batch_multiple: int = 0
    """the ``length`` planner's sequences-per-batch multiple (0: the world size)"""

    @classmethod
    def from_config(cls, cfg) -> "PlanSettings":
        """The settings of a ``Config`` (the one place that maps config keys to them)."""
        b = cfg.batch
        return cls(b.batch_frames, cfg.train.seed, b.round_lengths, b.plan, b.batch_multiple)

    def plan(self, ds, keep: np.ndarray, epoch: int, rank: int = 0,
             world: int = 1) -> list[Batch]:
        """``make_plan`` under these settings."""
        return make_plan(ds, keep, self.batch_frames, self.seed, epoch, rank, world,
                         round_lengths=self.round_lengths, strategy=self.strategy,
                         batch_multiple=self.batch_multiple)


def make_plan(ds, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
              rank: int = 0, world: int = 1, shuffle: bool = True,
              round_lengths: int = 0, strategy: str = "auto",
              batch_multiple: int = 0) -> list[Batch]:
    """The epoch's steps for ``rank`` of ``world``.

    ds: a Dataset (only lengths, chunks, shards and ``within`` are used); keep: (N,) bool
    mask of the sequences to train on (infeasible ones are False); strategy: a key of
    ``PLANNERS`` or "auto" (see the module doc). round_lengths > 0: the padded-frame budget
    counts each sequence at its ``bucket_length`` (the length the worker pads it to).
    batch_multiple: the ``length`` planner's sequences-per-batch multiple (0: ``world``;
    see ``plan_length``); the other planners give every rank equal counts by design.
    """
    name = strategy_for(ds, strategy)
    if round_lengths:
        ds = dataclasses.replace(ds, lengths=bucket_lengths(ds.lengths, round_lengths))
    if name == "length":
        return plan_length(ds, keep, batch_frames, seed, epoch, rank, world, shuffle,
                           batch_multiple)
    return PLANNERS[name](ds, keep, batch_frames, seed, epoch, rank, world, shuffle)


def padding_ratio(steps: list[Batch], lengths: np.ndarray) -> float:
    """Padded frames / real frames over a plan (1.0 = no padding)."""
    padded = sum(len(s.seqs) * int(lengths[list(s.seqs)].max()) for s in steps if s.seqs)
    real = sum(int(lengths[list(s.seqs)].sum()) for s in steps if s.seqs)
    return padded / max(real, 1)


def chunk_order(steps: list[Batch]) -> list[int]:
    """The chunks a plan visits, in order, each once."""
    out: list[int] = []
    for s in steps:
        if not out or out[-1] != s.chunk:
            assert s.chunk not in out, "a plan must visit each chunk once"
            out.append(s.chunk)
    return out


def remainder_note(ds, keep: np.ndarray, world: int, settings: PlanSettings) -> str | None:
    """One line on sequences that cannot be dealt evenly over ``world`` ranks (or None).

    ``sharded``: nothing is dropped; in the last steps of a segment the ranks whose shard
    is shorter train on fewer (possibly no) sequences. ``random``: the batches beyond the
    shortest rank's count in each chunk are not trained; the note counts them in epoch 1.
    Reported once so the user knows.
    """
    strategy = strategy_for(ds, settings.strategy)
    if strategy == "random" and world > 1:
        planned = sum(len(s.seqs) for r in range(world)
                      for s in plan_random(ds, keep, settings.batch_frames, settings.seed,
                                           0, r, world))
        lost = int(keep.sum()) - planned
        return (f"{ds.source}: batch.plan = 'random' leaves {lost} of {int(keep.sum())} "
                f"sequences untrained in epoch 1 (the ranks stop at the shortest rank's "
                f"steps in each chunk)") if lost else None
    if strategy != "sharded" or len(ds.shards) % world:
        return None
    per_rank = np.zeros(world, np.int64)
    for s, sh in enumerate(ds.shards):
        for k in sh:
            per_rank[s % world] += int(keep[ds.chunks[k].seqs].sum())
    spread = int(per_rank.max() - per_rank.min())
    if spread == 0:
        return None
    return (f"{ds.source}: ranks hold {per_rank.min()}-{per_rank.max()} trainable sequences "
            f"each; the {spread} extra sequence(s) are trained in steps where other ranks "
            f"have fewer (none are dropped)")


def resumed_plan(ds, keep: np.ndarray, settings: PlanSettings, epoch: int, rank: int,
                 world: int, parts: Sequence[Sequence[int]]) -> list[Batch]:
    """The rest of an epoch that was interrupted and resumed on other rank counts.

    parts: [(world_k, pos_k), ...] in order: segment k of the epoch ran the plan of
    world_k ranks over the sequences that earlier segments had not trained, for pos_k
    steps. What a segment consumed is a pure function of the metadata and (world_k, pos_k)
    (the union of every rank's first pos_k steps), so the sequences left can be computed
    exactly and are re-dealt here to ``world`` ranks: none skipped, none repeated. The
    batches differ from an uninterrupted run's (they are cut from the sequences left).
    Without parts: the epoch's plan itself.
    """
    left = keep.copy()
    for w, pos in parts:
        consumed = []
        for r in range(int(w)):
            for st in settings.plan(ds, left, epoch, r, int(w))[:int(pos)]:
                consumed.extend(st.seqs)
        left[np.asarray(consumed, dtype=np.int64)] = False
    return settings.plan(ds, left, epoch, rank, world)


class BatchPlanner:
    """The epoch plans of one training run: the settings (``PlanSettings``) and the
    dataset's lengths are fixed once, then each epoch's batches come from them (lhotse's
    sampler shape: settings once, ``set_epoch``, ``state_dict``), over the pure
    ``make_plan``. Every rank builds the same planner; ``rank`` and ``world`` are this
    process's place in the job.

        planner = BatchPlanner(ds, keep, PlanSettings.from_config(cfg), rank, world)
        planner.set_epoch(epoch, state.parts)   # parts: an epoch resumed on other ranks
        for batch in planner: ...               # this rank's batches of that epoch

    ``epoch(e, rank)`` is the plain plan of any epoch and rank (a pure function: tests,
    benches); ``resume(e, parts)`` the rest of an epoch interrupted on other rank counts.
    """

    def __init__(self, ds, keep: np.ndarray, settings: PlanSettings, rank: int = 0,
                 world: int = 1):
        """ds: the Dataset (lengths, chunks, shards; no frames are read); keep: (N,) bool,
        the sequences to train on."""
        assert 0 <= rank < world
        self.ds, self.keep, self.settings = ds, keep, settings
        self.rank, self.world = rank, world
        self._epoch, self._parts = 0, []
        self._steps: int | None = None

    def epoch(self, epoch: int, rank: int | None = None) -> list[Batch]:
        """Rank ``rank``'s (default: this rank's) batches of epoch ``epoch`` (0-based)."""
        return self.settings.plan(self.ds, self.keep, epoch,
                                  self.rank if rank is None else rank, self.world)

    def resume(self, epoch: int, parts: Sequence[Sequence[int]],
               rank: int | None = None) -> list[Batch]:
        """The rest of epoch ``epoch`` after the segments ``parts`` ([(world_k, steps_k)]:
        see ``resumed_plan``) ran on other rank counts; without parts, ``epoch(epoch)``."""
        rank = self.rank if rank is None else rank
        if not parts:
            return self.epoch(epoch, rank)
        return resumed_plan(self.ds, self.keep, self.settings, epoch, rank, self.world, parts)

    def set_epoch(self, epoch: int, parts: Sequence[Sequence[int]] = ()):
        """The epoch (and its segments trained on other rank counts) that iterating the
        planner gives."""
        self._epoch, self._parts = epoch, [list(p) for p in parts]

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.resume(self._epoch, self._parts))

    @property
    def steps_per_epoch(self) -> int:
        """Batches in an uninterrupted epoch (the same for every epoch and rank)."""
        if self._steps is None:
            self._steps = len(self.epoch(0))
        return self._steps

    def remainder_note(self) -> str | None:
        """The one line on sequences not dealt evenly over the ranks (see the function)."""
        return remainder_note(self.ds, self.keep, self.world, self.settings)

    def state_dict(self) -> dict:
        """Where the planner stands (plain values): the settings, the epoch and its
        segments on other rank counts."""
        return {"settings": dataclasses.asdict(self.settings), "epoch": self._epoch,
                "parts": [list(p) for p in self._parts]}

    def load_state_dict(self, state: dict):
        """Continue from ``state_dict()``: the same settings are required (other settings
        give another plan, so the position in it would mean nothing)."""
        if state["settings"] != dataclasses.asdict(self.settings):
            raise UserError(f"batch plan settings differ from the recorded ones: "
                            f"{state['settings']} vs {dataclasses.asdict(self.settings)}")
        self.set_epoch(state["epoch"], state["parts"])
