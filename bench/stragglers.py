"""Straggler idle of N = 64 ranks: random shards vs the RNNLIB recipe vs ours.

A simulation from lengths alone: the real shard tool's dealing (``data_tools.shard.assign_shards``)
and the real epoch planner (``rnntrain.data.plan.make_plan``) on a speech-like corpus; the
cost of a rank's step is its padded frames (n × longest: an LSTM's time at fixed width).
Straggler idle = Σ_steps Σ_ranks (max_rank − rank) / (N × Σ_steps max_rank): the share
of the ranks' time spent waiting for the slowest rank at the step's gradient allreduce.

    python -m bench.stragglers [--quick]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from data_tools.shard import assign_shards, chunk_bounds, metadata_dataset, shard_chunks
from rnntrain.data.dataset import Dataset, virtual_chunks
from rnntrain.data.plan import make_plan, padding_ratio

RANKS = 64


def speech_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Utterance lengths at 100 frames/s: log-normal, median 3 s, long tail, 0.2-30 s."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(300), 0.5, n), 20, 3000).astype(np.int64)


def sharded(lengths: np.ndarray, per_shard: list[np.ndarray], within: str,
            chunk_frames: int) -> Dataset:
    """A manifest-like Dataset for shards given as lists of corpus indices (what
    ``rnntrain-data shard`` writes, without the payload)."""
    cuts = chunk_bounds(per_shard, lengths, chunk_frames, None)
    return metadata_dataset(lengths, [[p for _, p in shard_chunks(src, cuts)]
                                      for src in per_shard], within)


def simulate(ds: Dataset, batch_frames: int, ranks: int = RANKS) -> dict:
    keep = np.ones(ds.num_seqs, bool)
    plans = [make_plan(ds, keep, batch_frames, 1, 0, r, ranks) for r in range(ranks)]
    steps = len(plans[0])
    assert all(len(p) == steps for p in plans)
    cost = np.zeros((steps, ranks))
    for r, p in enumerate(plans):
        for k, st in enumerate(p):
            if st.seqs:
                cost[k, r] = len(st.seqs) * ds.lengths[list(st.seqs)].max()
    peak = cost.max(axis=1)
    return {"steps": steps, "idle": 1 - cost.sum() / (ranks * peak.sum()),
            "pad": padding_ratio([s for p in plans for s in p], ds.lengths),
            "seqs_per_step": ds.num_seqs / steps}


def run(quick: bool = False) -> str:
    n = 20_000 if quick else 100_000
    lengths = speech_lengths(n)
    per_rank_frames = 8000                    # ~27 median utterances per rank and step
    budget = per_rank_frames * RANKS
    chunk_frames = 400_000                    # per shard: ~1300 utterances per chunk
    rng = np.random.default_rng(3)
    t0 = time.perf_counter()
    rand = [np.sort(s) for s in np.array_split(rng.permutation(n), RANKS)]
    rand = [rng.permutation(s) for s in rand]
    rows = [
        ("random shards (shuffled, consecutive batches)",
         sharded(lengths, rand, "shuffle", chunk_frames)),
        ("RNNLIB recipe (sorted, dealt, shuffled within shard)",
         sharded(lengths, assign_shards(lengths, RANKS, 1, "shuffle"), "shuffle", chunk_frames)),
        ("ours (sorted, dealt, length-grouped batches, shared batch order)",
         sharded(lengths, assign_shards(lengths, RANKS, 1, "sorted"), "sorted", chunk_frames)),
    ]
    single = Dataset("sim", ["a"], 1, lengths, [np.zeros(1, np.int32)] * n, [""] * n,
                     virtual_chunks("sim", lengths, chunk_frames * RANKS), [[0]])
    single.shards = [list(range(len(single.chunks)))]
    rows.append(("ours, one unsharded file (global batches dealt to ranks)", single))
    res = [(name, simulate(ds, budget)) for name, ds in rows]
    secs = time.perf_counter() - t0
    out = [
        "## Straggler idle at 64 ranks (simulation)",
        "",
        f"{n:,} speech-like utterances (log-normal lengths, median 300 frames, 20-3000), "
        f"{RANKS} ranks, a global batch budget of {budget:,} padded frames "
        f"({per_rank_frames:,} per rank), chunks of ~{chunk_frames:,} frames per shard. "
        "A rank's step cost is its padded frames (n × longest); straggler idle = "
        "Σ_steps Σ_ranks (max − rank) / (N × Σ_steps max). Real shard dealing and real "
        "epoch plans, no payload.",
        "",
        "| sharding and batching | steps/epoch | seqs/step | straggler idle | padding ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in res:
        out.append(f"| {name} | {r['steps']} | {r['seqs_per_step']:.0f} | "
                   f"{100 * r['idle']:.1f}% | {r['pad']:.3f} |")
    ours = res[2][1]
    out += ["", f"Ours: {100 * ours['idle']:.2f}% idle (goal ≤ 2%), "
            f"{res[0][1]['idle'] / max(ours['idle'], 1e-9):.0f}x less than random shards and "
            f"{res[1][1]['idle'] / max(ours['idle'], 1e-9):.0f}x less than the RNNLIB recipe "
            f"(simulated in {secs:.0f} s).", "",
            f"Reproduce: `python -m bench.stragglers{' --quick' if quick else ''}`", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
