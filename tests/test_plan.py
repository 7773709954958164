"""Epoch plans: deterministic, disjoint and complete across ranks, equal step counts.

Plans are pure functions of metadata, so most tests build Datasets from length arrays
(the same Dataset class the readers fill); one test plans a real sharded dataset.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_tools.shard import assign_shards, chunk_bounds, metadata_dataset, shard_chunks
from rnntrain.data.dataset import Dataset, virtual_chunks
from rnntrain.errors import UserError
from rnntrain.data.plan import (PLANNERS, Batch, BatchPlanner, PlanSettings, bucket_lengths,
                                chunk_order, group_by_length, make_plan, padding_ratio,
                                remainder_note, rng_for)


def speech_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Log-normal lengths like utterances (median ~300 frames, long tail)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(300), 0.5, n), 20, 3000).astype(np.int64)


def single(lengths: np.ndarray, chunk_frames: int) -> Dataset:
    n = len(lengths)
    chunks = virtual_chunks("x.nc", lengths, chunk_frames)
    return Dataset("x.nc", ["a"], 1, lengths, [np.zeros(1, np.int32)] * n, [""] * n, chunks,
                   [list(range(len(chunks)))])


def sharded(lengths: np.ndarray, n_shards: int, per_chunk: int, within: str = "sorted",
            chunk_sizes=None) -> Dataset:
    """What the shard tool writes (its own dealing and chunk cuts, without payload), or
    shards cut into per-shard ``chunk_sizes`` like a hand-made manifest; global ids
    consecutive over shards and chunks."""
    shards_src = assign_shards(lengths, n_shards, 5, within)
    if chunk_sizes:
        parts = []
        for src, sizes in zip(shards_src, chunk_sizes):
            ends = np.cumsum([0, *sizes])
            assert ends[-1] >= len(src)
            parts.append([p for p in (src[a:b] for a, b in zip(ends[:-1], ends[1:])) if len(p)])
    else:
        cuts = chunk_bounds(shards_src, lengths, None, per_chunk)
        parts = [[p for _, p in shard_chunks(src, cuts)] for src in shards_src]
    return metadata_dataset(lengths, parts, within, "m.json")


def check_plans(ds: Dataset, keep: np.ndarray, world: int, batch_frames: int, seed=3, epoch=1):
    plans = [make_plan(ds, keep, batch_frames, seed, epoch, r, world) for r in range(world)]
    # equal step counts by construction
    assert len({len(p) for p in plans}) == 1
    # disjoint and complete over the kept sequences
    ids = [s for p in plans for step in p for s in step.seqs]
    assert sorted(ids) == np.flatnonzero(keep).tolist()
    for r, p in enumerate(plans):
        order = chunk_order(p)          # asserts each chunk is visited once, contiguously
        for step in p:
            assert all(s in set(ds.chunks[step.chunk].seqs.tolist()) for s in step.seqs)
        # only the rank's own shards (sharded datasets)
        if len(ds.shards) > 1:
            mine = {k for s, sh in enumerate(ds.shards) if s % world == r for k in sh}
            assert set(order) <= mine
    # deterministic: the same arguments give the same plan
    assert plans[0] == make_plan(ds, keep, batch_frames, seed, epoch, 0, world)
    # global batches respect the padded-frame budget (unless one position alone exceeds it)
    for k in range(len(plans[0])):
        batch = [s for p in plans for s in p[k].seqs]
        if batch:
            longest = int(ds.lengths[batch].max())
            per_rank = max(len(p[k].seqs) for p in plans)
            assert per_rank == 1 or len(batch) * longest <= batch_frames
    return plans


@pytest.mark.parametrize("world", [1, 2, 3])
def test_single_file_plans(world):
    lengths = speech_lengths(1500)
    ds = single(lengths, 60_000)
    keep = np.ones(len(lengths), bool)
    keep[::17] = False                       # infeasible sequences are left out
    plans = check_plans(ds, keep, world, 12_000)
    assert plans[0] != make_plan(ds, keep, 12_000, 3, 2, 0, world)   # epochs differ


@pytest.mark.parametrize("within", ["sorted", "shuffle"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_sharded_plans(within, world):
    lengths = speech_lengths(2003, seed=1)  # 2003 = 4 × 500 + 3: a remainder to deal
    ds = sharded(lengths, 4, 120, within)
    keep = np.ones(ds.num_seqs, bool)
    keep[::13] = False
    check_plans(ds, keep, world, 24_000)


def test_sharded_needs_multiple_of_world():
    ds = sharded(speech_lengths(100), 4, 50)
    with pytest.raises(UserError, match="4 shards cannot be dealt evenly to 3 ranks"):
        make_plan(ds, np.ones(100, bool), 5000, 1, 0, 0, 3)


def test_unaligned_chunks_still_plannable():
    """A hand-made manifest whose shards are cut at different positions."""
    lengths = speech_lengths(400, seed=2)
    ds = sharded(lengths, 2, 0, chunk_sizes=[[50, 150, 0], [120, 20, 60]])
    check_plans(ds, np.ones(400, bool), 2, 8000)
    check_plans(ds, np.ones(400, bool), 1, 8000)


def step_spread(plans, lengths) -> float:
    """Mean over steps of (max − min)/max of the ranks' padded step cost."""
    out = []
    for k in range(len(plans[0])):
        cost = [len(p[k].seqs) * int(lengths[list(p[k].seqs)].max()) if p[k].seqs else 0
                for p in plans]
        out.append((max(cost) - min(cost)) / max(max(cost), 1))
    return float(np.mean(out))


def test_sorted_shards_balance_steps_and_padding():
    """Ours (sorted shards, length-grouped batches) vs the RNNLIB recipe (shuffled
    within shards, consecutive batches): the ranks' step costs agree and padding is low."""
    lengths = speech_lengths(8000, seed=3)
    keep = np.ones(8000, bool)
    ours = sharded(lengths, 8, 500, "sorted")
    rnnlib = sharded(lengths, 8, 500, "shuffle")
    p_ours = [make_plan(ours, keep, 40_000, 1, 0, r, 8) for r in range(8)]
    p_rnnlib = [make_plan(rnnlib, keep, 40_000, 1, 0, r, 8) for r in range(8)]
    assert step_spread(p_ours, ours.lengths) < 0.05
    assert step_spread(p_rnnlib, rnnlib.lengths) > 0.3
    assert padding_ratio([s for p in p_ours for s in p], ours.lengths) < 1.05
    assert padding_ratio([s for p in p_rnnlib for s in p], rnnlib.lengths) > 1.5


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), shards=st.sampled_from([1, 2, 3, 4, 6]),
       per_chunk=st.integers(1, 80), budget=st.integers(50, 5000),
       within=st.sampled_from(["sorted", "shuffle"]), seed=st.integers(0, 2**31),
       drop=st.integers(0, 5))
def test_plan_properties(n, shards, per_chunk, budget, within, seed, drop):
    if n < shards:
        n = shards
    lengths = np.random.default_rng(seed).integers(1, 400, n)
    ds = sharded(lengths, shards, per_chunk, within)
    keep = np.ones(n, bool)
    if drop:
        keep[::drop + 1] = False
    for world in [w for w in (1, 2, 3) if shards % w == 0]:
        kept = [keep[[k for s, sh in enumerate(ds.shards) if s % world == r
                      for c in sh for k in ds.chunks[c].seqs]].any() for r in range(world)]
        try:
            check_plans(ds, keep, world, budget, seed=seed)
        except UserError as e:  # only for a rank with nothing to train: one clear error
            assert "shards hold no sequences" in str(e) and not all(kept), e


def test_real_manifest_plan(tmp_path, synth_pair):
    """The shard tool's output plans the same way on 1, 2 and 4 ranks."""
    from data_tools.shard import shard
    man = shard([str(synth_pair[0])], 4, str(tmp_path / "d"), chunk_seqs=10)
    ds = Dataset.open(str(man))
    keep = ds.feasible(1)
    for world in (1, 2, 4):
        check_plans(ds, keep, world, 800)


# ---- the strategies behind make_plan(strategy=...) / batch.plan

def naive_random_plan(ds, keep, batch_frames, seed, epoch, rank, world):
    """The random baseline written out for one chunk, as the benchmark first had it:
    rank r takes perm[r::world] and batches it alone; all ranks stop at the shortest."""
    perm = rng_for(seed, 991).permutation(ds.num_seqs)
    plans = []
    for r in range(world):
        mine = np.zeros(ds.num_seqs, bool)
        mine[perm[r::world]] = True
        batches = group_by_length(np.flatnonzero(keep & mine), ds.lengths,
                                  max(1, batch_frames // world), rng_for(seed, epoch, r))
        order = rng_for(seed, epoch, r, 1).permutation(len(batches))
        plans.append([Batch(0, tuple(int(s) for s in batches[i])) for i in order])
    n = min(len(p) for p in plans)
    return plans[rank][:n]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_random_strategy_one_chunk_matches_the_written_out_baseline(world):
    lengths = speech_lengths(700, seed=4)
    ds = single(lengths, 10**9)
    keep = np.ones(700, bool)
    keep[::11] = False
    for r in range(world):
        assert make_plan(ds, keep, 9000, 2, 1, r, world, strategy="random") == \
            naive_random_plan(ds, keep, 9000, 2, 1, r, world)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_random_strategy_over_chunks(world):
    """Several chunks (a sharded dataset too): equal step counts, disjoint, kept only,
    each chunk visited once; the note counts exactly the sequences left out."""
    lengths = speech_lengths(1600, seed=5)
    for ds in (single(lengths, 50_000), sharded(lengths, 4, 100)):
        keep = np.ones(ds.num_seqs, bool)
        keep[::7] = False
        plans = [make_plan(ds, keep, 12_000, 3, 0, r, world, strategy="random")
                 for r in range(world)]
        assert len({len(p) for p in plans}) == 1
        ids = [s for p in plans for step in p for s in step.seqs]
        assert len(ids) == len(set(ids)) and keep[ids].all()
        for p in plans:
            chunk_order(p)
            for step in p:
                assert set(step.seqs) <= set(ds.chunks[step.chunk].seqs.tolist())
                assert len(step.seqs) * ds.lengths[list(step.seqs)].max() <= \
                    max(12_000 // world, int(ds.lengths[list(step.seqs)].max()))
        lost = int(keep.sum()) - len(ids)
        note = remainder_note(ds, keep, world, PlanSettings(12_000, 3, strategy="random"))
        if world == 1:
            assert lost == 0 and note is None
        else:
            assert lost > 0 and f"leaves {lost} of {int(keep.sum())} sequences" in note


def test_auto_strategy_and_unknown_names():
    lengths = speech_lengths(900, seed=6)
    one, many = single(lengths, 30_000), sharded(lengths, 4, 100)
    keep = np.ones(900, bool)
    for r in range(2):
        assert make_plan(one, keep, 9000, 1, 0, r, 2) == \
            make_plan(one, keep, 9000, 1, 0, r, 2, strategy="length")
        assert make_plan(many, keep, 9000, 1, 0, r, 2) == \
            make_plan(many, keep, 9000, 1, 0, r, 2, strategy="sharded")
    # "length" plans a sharded dataset too (every rank reads every chunk)
    check_plans_of = [make_plan(many, keep, 9000, 1, 0, r, 2, strategy="length")
                      for r in range(2)]
    assert sorted(s for p in check_plans_of for st_ in p for s in st_.seqs) == list(range(900))
    with pytest.raises(UserError, match="plan strategy 'bogus'; choose one of auto, length, "
                                        "sharded, random"):
        make_plan(one, keep, 9000, 1, 0, strategy="bogus")
    assert set(PLANNERS) == {"length", "sharded", "random"}


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), budget=st.integers(50, 4000), multiple=st.integers(1, 4),
       seed=st.integers(0, 2**31))
def test_group_by_length_cuts_to_a_multiple_of_the_ranks(n, budget, multiple, seed):
    """Every sequence once, sorted; each batch within the budget (or one sequence over
    it); every batch but the last holds a multiple of ``multiple`` sequences where that
    many fit, and is cut back by fewer than ``multiple`` from the greedy cut; with
    multiple=1 the batches are exactly the greedy ones."""
    lengths = np.random.default_rng(seed).integers(1, 400, n)
    ids = np.arange(n)
    got = group_by_length(ids, lengths, budget, rng_for(seed, 1), multiple)
    greedy = group_by_length(ids, lengths, budget, rng_for(seed, 1))
    assert sorted(np.concatenate(got).tolist()) == list(range(n))
    flat = np.concatenate(got)
    assert (np.diff(lengths[flat]) >= 0).all()
    for b in got:
        assert len(b) == 1 or len(b) * lengths[b].max() <= budget
    for b in got[:-1]:
        # the greedy cut from this batch's start, brute force
        fit = 1
        while (flat.tolist().index(b[0]) + fit < n and
               (fit + 1) * lengths[flat[flat.tolist().index(b[0]) + fit]] <= budget):
            fit += 1
        want = fit - fit % multiple if fit > multiple else fit
        assert len(b) == want, (len(b), fit)
    if multiple == 1:
        assert [b.tolist() for b in got] == [b.tolist() for b in greedy]


@pytest.mark.parametrize("world", [2, 3])
def test_length_plan_gives_ranks_equal_counts_and_one_rank_can_replay_it(world):
    """The `length` planner on W ranks: at every step the ranks' shares are the batches of
    one rank planned with batch_multiple = W (so one rank can reproduce the W-rank run),
    and the counts differ only where fewer than W sequences fit or at a chunk's end."""
    lengths = speech_lengths(900, seed=6)
    ds = single(lengths, 60_000)
    keep = np.ones(900, bool)
    keep[::13] = False
    ranks = [make_plan(ds, keep, 7000, 3, 2, r, world, strategy="length")
             for r in range(world)]
    one = make_plan(ds, keep, 7000, 3, 2, strategy="length", batch_multiple=world)
    assert len(one) == len(ranks[0])
    uneven = 0
    for k, step in enumerate(one):
        shares = [ranks[r][k] for r in range(world)]
        assert sorted(s for sh in shares for s in sh.seqs) == sorted(step.seqs)
        counts = {len(sh.seqs) for sh in shares}
        uneven += len(counts) > 1
        assert len(counts) == 1 or len(step.seqs) % world, k
    assert uneven <= len(ds.chunks) + sum(len(s.seqs) < world for s in one)
    # the greedy cut (batch_multiple 1) would have given some rank one sequence more often
    greedy = make_plan(ds, keep, 7000, 3, 2, strategy="length", batch_multiple=1)
    assert sum(len(s.seqs) % world != 0 for s in greedy) > uneven


# ---- the planner object: settings once, then epochs


@pytest.mark.parametrize("strategy,round_lengths", [("auto", 0), ("length", 4), ("random", 0)])
def test_planner_is_make_plan_under_its_settings(strategy, round_lengths):
    """Settings fixed once: each epoch and rank is exactly the pure make_plan with those
    settings spelled out; iterating after set_epoch gives the same; the remainder note is
    the function's."""
    lengths = speech_lengths(900, seed=6)
    ds = sharded(lengths, 4, 100) if strategy == "auto" else single(lengths, 60_000)
    keep = np.ones(ds.num_seqs, bool)
    keep[::9] = False
    settings = PlanSettings(9000, 4, round_lengths, strategy, batch_multiple=0)
    world = 2
    planners = [BatchPlanner(ds, keep, settings, r, world) for r in range(world)]
    for epoch in (0, 3):
        for r, planner in enumerate(planners):
            want = make_plan(ds, keep, 9000, 4, epoch, r, world, round_lengths=round_lengths,
                             strategy=strategy)
            assert planner.epoch(epoch) == want == planners[0].epoch(epoch, r)
            planner.set_epoch(epoch)
            assert list(planner) == want
            assert planner.steps_per_epoch == len(planner.epoch(0))
    assert planners[0].remainder_note() == remainder_note(ds, keep, world, settings)
    if round_lengths:  # the budget counts the padded (bucketed) lengths, as the tasks pad
        padded = bucket_lengths(ds.lengths, round_lengths)
        for shares in zip(*(p.epoch(0) for p in planners)):
            batch = [s for b in shares for s in b.seqs]  # the global batch of a step
            assert len(batch) == 1 or len(batch) * padded[batch].max() <= 9000


def test_planner_resume_and_state_dict_cover_an_epoch_split_over_rank_counts():
    """An epoch run for 3 steps on 2 ranks, then resumed alone from the planner's state:
    every kept sequence is trained exactly once (against the plain set of kept ids); the
    state round-trips, and other settings are refused."""
    lengths = speech_lengths(600, seed=8)
    ds = single(lengths, 40_000)
    keep = np.ones(600, bool)
    keep[::5] = False
    settings = PlanSettings(7000, 2)
    seen = [s for r in range(2) for b in BatchPlanner(ds, keep, settings, r, 2).epoch(1)[:3]
            for s in b.seqs]
    alone = BatchPlanner(ds, keep, settings)
    alone.set_epoch(1, [(2, 3)])
    state = alone.state_dict()
    again = BatchPlanner(ds, keep, settings)
    again.load_state_dict(state)
    rest = list(again)
    assert rest == alone.resume(1, [(2, 3)]) == list(alone)
    seen += [s for b in rest for s in b.seqs]
    assert sorted(seen) == np.flatnonzero(keep).tolist()
    assert again.resume(1, []) == again.epoch(1)
    with pytest.raises(UserError, match="batch plan settings differ"):
        BatchPlanner(ds, keep, PlanSettings(7001, 2)).load_state_dict(state)


def test_plan_settings_come_from_the_config_once():
    from rnntrain.config import Config
    cfg = Config()
    cfg.batch.batch_frames, cfg.batch.round_lengths, cfg.batch.plan = 1234, 3, "random"
    got = PlanSettings.from_config(cfg)
    assert (got.batch_frames, got.seed, got.round_lengths, got.strategy, got.batch_multiple) \
        == (1234, cfg.train.seed, 3, "random", cfg.batch.batch_multiple)
