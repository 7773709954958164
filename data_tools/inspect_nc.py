"""``rnntrain-data inspect``: what is in a dataset, and what will be skipped."""
from __future__ import annotations

import numpy as np

from rnntrain.data.dataset import Dataset


def histogram(values: np.ndarray, bins: int = 10, width: int = 40) -> list[str]:
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < bins:  # few distinct integers: one bin each, no fractional edges
        counts = np.bincount(values - lo, minlength=hi - lo + 1)
        top = max(int(counts.max()), 1)
        return [f"  {lo + i:>7}{'':8} {int(c):>7} {'#' * round(width * c / top)}"
                for i, c in enumerate(counts)]
    counts, edges = np.histogram(values, bins=bins)
    top = max(int(counts.max()), 1)
    return [f"  {int(edges[i]):>7}-{int(edges[i + 1]):<7} {int(c):>7} {'#' * round(width * c / top)}"
            for i, c in enumerate(counts)]


def inspect(path: str, subsample: int = 1, chunk_frames: int = 2_000_000,
            problems: list[str] | None = None) -> str:
    """The report as text; failed chunk checksums are also appended to ``problems``."""
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
             *(["  length histogram (frames):", *histogram(ds.lengths)] if not ds.is_2d else
               [f"  images         2-D (numDims 2): height min {ds.heights.min()}, median "
                f"{int(np.median(ds.heights))}, max {ds.heights.max()} (served padded to "
                f"{ds.frame_height}); {int(ds.rows.sum()):,} pixels, "
                f"{ds.rows.sum() / max(ds.frame_height * ds.lengths.sum(), 1):.0%} of them "
                "after padding",
                "  width histogram (columns, the time axis):", *histogram(ds.lengths),
                "  height histogram (pixels):", *histogram(ds.heights)]),
             *([f"  imageHeight    {ds.column_height} (frames are image columns)"]
               if ds.column_height else [])]
    keep = ds.feasible(subsample)
    bad = np.flatnonzero(~keep)
    lines.append(f"  infeasible     {len(bad)} sequences too short for their targets "
                 f"(subsample {subsample})" + (": " + ", ".join(ds.tag(int(i)) for i in bad[:10])
                                               if len(bad) else ""))
    if len(ds.shards) > 1 or ds.chunks[0].sha256:
        lines += manifest_report(ds, problems if problems is not None else [])
    lines += nonfinite_report(ds, problems if problems is not None else [])
    return "\n".join(lines)


def nonfinite_report(ds: Dataset, problems: list[str]) -> list[str]:
    """Sequences whose inputs hold NaN or Inf (training would stop at the first). Reads
    every frame once, one chunk at a time."""
    from rnntrain.data import ncdata
    from rnntrain.errors import UserError
    bad: list[int] = []
    for c in ds.chunks:
        try:
            rows = ncdata.read_rows(c.path, c.row_start, c.row_stop)
        except UserError as e:  # unreadable or never-written rows: reported, not raised
            problems.append(str(e))
            return [f"  inputs         cannot be scanned: {e}"]
        finite = np.isfinite(rows).all(axis=1)
        if finite.all():
            continue
        offs = np.concatenate([[0], np.cumsum(ds.lengths[c.seqs])])
        for j, s in enumerate(c.seqs):
            if not finite[offs[j]:offs[j + 1]].all():
                bad.append(int(s))
    if not bad:
        return ["  inputs         all frames finite"]
    names = ", ".join(ds.tag(i) for i in bad[:10]) + (" ..." if len(bad) > 10 else "")
    msg = f"{len(bad)} sequences have NaN or Inf inputs (training stops at them): {names}"
    problems.append(f"{ds.source}: {msg}")
    return [f"  inputs         {msg}"]


def manifest_report(ds: Dataset, problems: list[str]) -> list[str]:
    """Checksums of every chunk, frames and length profile per shard, order warnings."""
    from rnntrain.errors import UserError
    from rnntrain.data.dataset import verify_chunk
    bad = []
    for c in ds.chunks:
        try:
            verify_chunk(c)
        except UserError as e:
            bad.append(str(e))
            problems.append(str(e))
    lines = [f"  checksums      {len(ds.chunks) - len(bad)} of {len(ds.chunks)} chunk files OK"
             + ("" if not bad else "; FAILED:"), *[f"    {b}" for b in bad],
             f"  shards ({ds.within} inside): frames, sequences, length quartiles "
             "(min/25%/50%/75%/max)"]
    totals = []
    for s, sh in enumerate(ds.shards):
        ids = np.concatenate([ds.chunks[k].seqs for k in sh])
        lens = ds.lengths[ids]
        totals.append(int(lens.sum()))
        q = np.percentile(lens, [0, 25, 50, 75, 100]).astype(int)
        lines.append(f"    shard {s:>3}  {totals[-1]:>12,}  {len(ids):>8}  "
                     f"{'/'.join(str(v) for v in q)}  ({len(sh)} chunks)")
        if ds.within == "sorted" and np.any(np.diff(lens) < 0):
            lines.append(f"    warning: shard {s} should be sorted by length but is not "
                         "(the plan still sorts inside each chunk; re-shard to restore "
                         "length-classed chunks)")
    spread = (max(totals) - min(totals)) / max(max(totals), 1)
    lines.append(f"  shard frame spread  {100 * spread:.2f}% (largest vs smallest)")
    if bad:
        lines.append("  error: some chunk files do not match the manifest; re-run "
                     "rnntrain-data shard")
    return lines
