"""``rnntrain-data inspect``: what is in a dataset, and what will be skipped."""
from __future__ import annotations

import numpy as np

from rnntrain.dataset import Dataset


def histogram(values: np.ndarray, bins: int = 10, width: int = 40) -> list[str]:
    counts, edges = np.histogram(values, bins=bins)
    top = max(int(counts.max()), 1)
    return [f"  {int(edges[i]):>7}-{int(edges[i + 1]):<7} {int(c):>7} {'#' * round(width * c / top)}"
            for i, c in enumerate(counts)]


def inspect(path: str, subsample: int = 1, chunk_frames: int = 2_000_000) -> str:
    ds = Dataset.open(path, chunk_frames)
    tl = ds.target_lengths
    lines = [f"{path}",
             f"  sequences      {ds.num_seqs}",
             f"  frames         {int(ds.lengths.sum()):,} (min {ds.lengths.min()}, median "
             f"{int(np.median(ds.lengths))}, max {ds.lengths.max()})",
             f"  inputPattSize  {ds.input_size}",
             f"  labels         {ds.num_labels}: {' '.join(ds.labels[:40])}"
             f"{' ...' if ds.num_labels > 40 else ''} (+ blank = {ds.num_labels})",
             f"  target labels  {int(tl.sum()):,} (min {tl.min()}, mean {tl.mean():.1f}, "
             f"max {tl.max()}); frames per label {ds.lengths.sum() / max(tl.sum(), 1):.1f}",
             f"  chunks         {len(ds.chunks)} in {len(ds.shards)} shard(s)",
             "  length histogram (frames):", *histogram(ds.lengths)]
    keep = ds.feasible(subsample)
    bad = np.flatnonzero(~keep)
    lines.append(f"  infeasible     {len(bad)} sequences too short for their targets "
                 f"(subsample {subsample})" + (": " + ", ".join(ds.tag(int(i)) for i in bad[:10])
                                               if len(bad) else ""))
    return "\n".join(lines)
