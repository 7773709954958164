"""``rnntrain-data shard``: length-sorted shards of RNNLIB data, written streaming.

All sequences of all inputs are sorted by length (ties broken by the seed) and dealt
round-robin into N shards: shard r takes sorted positions r, r+N, r+2N, … so every shard
has the same length profile and nearly the same frame total. Inside a shard the sequences
stay sorted (``--within sorted``, ours: the plan groups them into batches by length and
shuffles the order of batches) or are shuffled (``--within shuffle``, the RNNLIB recipe).
Each shard is cut into chunk files in RNNLIB layout at the same positions in every shard
(so chunk c of every shard covers the same length class), then ``index.npz`` and, last,
``manifest.json`` are written (see ``rnntrain.data.manifest``).

Memory: the length, target and tag arrays of the whole corpus plus one output chunk of
frames; frames are read sequence by sequence from the open inputs. 2-D inputs (images)
are dealt by width and written as 2-D chunk files; chunks are cut by rows (height ×
width), so a chunk holds about ``chunk_frames`` pixels' worth of rows.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rnntrain.data import ncdata
from rnntrain.data.dataset import Chunk, Dataset
from rnntrain.errors import DataError, UserError
from rnntrain.data.manifest import FORMAT, VERSION
from rnntrain.fsutil import atomic_write, sha256_file
from rnntrain.data.plan import rng_for


@dataclass
class Corpus:
    """The metadata of all inputs, in input order (sequence i of the concatenation)."""
    labels: list[str]
    input_size: int
    dtype: np.dtype
    files: list[str]
    file_of: np.ndarray      # (N,) input index
    row_of: np.ndarray       # (N,) first row in that input
    lengths: np.ndarray      # (N,) frames (2-D: widths)
    targets: list[np.ndarray]
    tags: list[str]
    heights: np.ndarray | None = None  # (N,) 2-D inputs: image heights
    column_height: int = 0
    image_frontend: str = ""           # rnntrain-data images settings (JSON), kept along

    @property
    def rows(self) -> np.ndarray:
        return self.lengths if self.heights is None else self.lengths * self.heights


def read_corpus(paths: list[str], merge_labels: bool) -> Corpus:
    """Headers of all inputs; alphabets and inputPattSize must agree (or be merged)."""
    heads = [ncdata.read_header(p) for p in paths]
    first = heads[0]
    labels = list(first.labels)
    for h in heads[1:]:
        if h.input_size != first.input_size:
            raise DataError(h.path, f"inputPattSize {h.input_size} differs from "
                                    f"{first.path} ({first.input_size})")
        if (h.heights is None) != (first.heights is None) or \
                h.column_height != first.column_height:
            raise DataError(h.path, f"image layout (numDims, imageHeight) differs from "
                                    f"{first.path}")
        if h.labels != first.labels and not merge_labels:
            raise DataError(h.path, f"alphabet differs from {first.path} ({len(h.labels)} vs "
                                    f"{len(first.labels)} labels; first difference: "
                                    f"{_first_diff(h.labels, first.labels)}); pass "
                                    "--merge-labels to use the union of the alphabets",
                            var="labels")
        labels += [lb for lb in h.labels if lb not in labels]
    index = {lb: k for k, lb in enumerate(labels)}
    targets, tags, file_of, row_of = [], [], [], []
    dtypes = set()
    for f, h in enumerate(heads):
        remap = np.array([index[lb] for lb in h.labels], dtype=np.int32)
        targets += [remap[t] for t in h.targets]
        tags += h.tags
        file_of.append(np.full(h.num_seqs, f, np.int64))
        row_of.append(h.offsets[:-1])
        with ncdata.NC_LOCK, ncdata._open(h.path) as ds:
            dtypes.add(np.dtype(ds.variables["inputs"].dtype))
    # keep the inputs' type when they agree, so that a round trip is bit-exact
    dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.float32)
    return Corpus(labels, first.input_size, dtype, [h.path for h in heads],
                  np.concatenate(file_of), np.concatenate(row_of),
                  np.concatenate([h.lengths for h in heads]), targets, tags,
                  None if first.heights is None else np.concatenate([h.heights for h in heads]),
                  first.column_height, first.image_frontend)


def _first_diff(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"label {i} is '{x}' vs '{y}'"
    return f"{len(a)} vs {len(b)} labels"


def assign_shards(lengths: np.ndarray, shards: int, seed: int, within: str) -> list[np.ndarray]:
    """Input sequence indices per shard.

    The length-sorted list is dealt in rounds of N: each shard takes one sequence of each
    round (so shard r's k-th sequence is as long as every other shard's k-th), and inside
    a round the longest goes to the shard with the fewest frames so far. Plain
    round-robin (r, r+N, …) would always give shard N-1 the longest of each round and let
    the frame totals drift apart by up to the whole length range; this keeps them within
    about one length step. ``within == "shuffle"`` then shuffles inside each shard.
    """
    rng = rng_for(seed, 0x5AAD)
    order = np.lexsort((rng.random(len(lengths)), lengths))   # by length, random ties
    totals = np.zeros(shards, np.int64)
    out: list[list[int]] = [[] for _ in range(shards)]
    # the incomplete round (if N does not divide the corpus) is the shortest one: the
    # shards that miss it lack a short sequence, and plans align shards at their end
    first = len(order) % shards
    cuts = sorted({0, *range(first, len(order) + 1, shards)})
    # rounds from the longest down, so that the last corrections use the shortest
    # sequences (the long tail would otherwise decide the final imbalance)
    for a, b in reversed(list(zip(cuts[:-1], cuts[1:]))):
        rnd = order[a:b][::-1]                                 # longest first
        # fewest frames first; ties by shard number (deterministic)
        for i, r in zip(rnd.tolist(), np.lexsort((np.arange(shards), totals)).tolist()):
            out[r].append(i)
            totals[r] += lengths[i]
    res = [np.array(o[::-1], dtype=np.int64) for o in out]    # ascending length
    if within == "shuffle":
        res = [rng.permutation(s) for s in res]
    return res


def shard_chunks(ids: np.ndarray, cuts: list[int]) -> list[tuple[int, np.ndarray]]:
    """A shard's chunks as (chunk number, sequence indices): its slices between the shared
    ``cuts``, positions aligned at the end (a shorter shard starts later); empty ones
    dropped."""
    off = cuts[-1] - len(ids)
    parts = [(c, ids[max(a - off, 0):max(b - off, 0)])
             for c, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
    return [(c, part) for c, part in parts if len(part)]


def metadata_dataset(lengths: np.ndarray, parts: list[list[np.ndarray]], within: str,
                     source: str = "sim") -> Dataset:
    """The Dataset a manifest opens as, from each shard's chunks (``parts[s]``: arrays of
    corpus indices), without payload: for plans, simulations and tests. Global ids are
    consecutive over shards and chunks, as in a written manifest."""
    lens, chunks, shards, first = [], [], [], 0
    for s, shard_parts in enumerate(parts):
        ids = []
        for part in shard_parts:
            ids.append(len(chunks))
            chunks.append(Chunk(f"{source}-shard-{s}", np.arange(first, first + len(part)), 0,
                                int(lengths[part].sum()), 0))
            lens.append(lengths[part])
            first += len(part)
        shards.append(ids)
    lens = np.concatenate(lens)
    n = len(lens)
    return Dataset(source, ["a"], 1, lens, [np.zeros(1, np.int32)] * n, [""] * n, chunks,
                   shards, within=within)


def chunk_bounds(per_shard: list[np.ndarray], lengths: np.ndarray, chunk_frames: int | None,
                 chunk_seqs: int | None) -> list[int]:
    """Position cuts shared by all shards: [0, c1, c2, …, max shard size], positions
    counted so that every shard ends at the last one (a shorter shard starts at 1).

    By frames, the cut uses the longest sequence over the shards at each position, so no
    shard's chunk exceeds about ``chunk_frames`` frames.
    """
    width = max(len(s) for s in per_shard)
    if chunk_seqs:
        return list(range(0, width, chunk_seqs)) + [width]
    longest = np.zeros(width, np.int64)
    for s in per_shard:   # positions aligned at the end (see assign_shards)
        longest[width - len(s):] = np.maximum(longest[width - len(s):], lengths[s])
    cuts, acc = [0], 0
    for i, n in enumerate(longest.tolist()):
        acc += n
        if acc >= chunk_frames and i + 1 < width:
            cuts.append(i + 1)
            acc = 0
    return cuts + [width]


class Inputs:
    """The input files, opened once, read sequence by sequence (under NC_LOCK)."""

    def __init__(self, corpus: Corpus):
        self.c = corpus
        self.handles = []
        try:
            for p in corpus.files:
                with ncdata.NC_LOCK:
                    ds = ncdata._open(p)
                    ds.variables["inputs"].set_auto_maskandscale(False)
                self.handles.append(ds)
        except BaseException:
            self.close()
            raise

    def read(self, i: int) -> np.ndarray:
        """(T_i, F) frames of input sequence i in the inputs' own type."""
        c = self.c
        f, r, n = int(c.file_of[i]), int(c.row_of[i]), int(c.rows[i])
        try:
            with ncdata.NC_LOCK:
                x = np.asarray(self.handles[f].variables["inputs"][r:r + n, :])
        except (OSError, RuntimeError, IndexError) as e:
            raise DataError(c.files[f], f"cannot read rows {r}:{r + n} ({e})", var="inputs",
                            seq=i, tag=c.tags[i]) from None
        if x.shape[0] != n:
            raise DataError(c.files[f], f"expected {n} rows at {r}, got {x.shape[0]} "
                                        "(truncated file?)", var="inputs")
        return x

    def close(self):
        with ncdata.NC_LOCK:
            for h in self.handles:
                h.close()
        self.handles = []


def frontend_attrs(paths: list[str]) -> dict:
    """The inputs' recorded front end, when they all share one (else none is kept: a
    model trained on a mix could not say how to make its frames)."""
    from rnntrain.frontend import ATTR
    found = {ncdata.read_attrs(p).get(ATTR) for p in paths}
    return {ATTR: found.pop()} if len(found) == 1 and None not in found else {}


def write_chunk(path: Path, inputs: Inputs, ids: np.ndarray, fmt: str,
                attrs: dict | None = None) -> dict:
    """One chunk file holding input sequences ``ids`` in order; its manifest entry."""
    c = inputs.c
    with ncdata.NcWriter(path, c.labels, c.input_size, c.lengths[ids],
                         [" ".join(c.labels[k] for k in c.targets[i]) for i in ids],
                         [c.tags[i] for i in ids], fmt, dtype=c.dtype,
                         heights=None if c.heights is None else c.heights[ids],
                         attrs={**({"imageHeight": c.column_height} if c.column_height else {}),
                                **({"rnntrain_images": c.image_frontend}
                                   if c.image_frontend else {}),
                                **(attrs or {})}) as w:
        for i in ids:
            w.append(inputs.read(int(i)))
    return {"numSeqs": int(len(ids)), "numTimesteps": int(c.rows[ids].sum()),
            "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def shard(paths: list[str], shards: int, out: str, chunk_frames: int | None = None,
          chunk_seqs: int | None = None, seed: int = 1, within: str = "sorted",
          merge_labels: bool = False, fmt: str = "NETCDF3_64BIT_OFFSET",
          progress=None) -> Path:
    """Write the sharded dataset into ``out``; returns the manifest path."""
    if shards < 1:
        raise UserError(f"--shards must be at least 1 (got {shards})")
    if chunk_frames is not None and chunk_seqs is not None:
        raise UserError("give --chunk-frames or --chunk-seqs, not both")
    if chunk_seqs is None and chunk_frames is None:
        chunk_frames = 2_000_000
    if any(v is not None and v < 1 for v in (chunk_frames, chunk_seqs)):
        raise UserError("--chunk-frames / --chunk-seqs must be positive")
    if within not in ("sorted", "shuffle"):
        raise UserError(f"--within must be 'sorted' or 'shuffle' (got {within!r})")
    outdir = Path(out)
    if (outdir / "manifest.json").exists():
        raise UserError(f"{outdir}: already holds a dataset (manifest.json); choose another "
                        "--out or delete it")
    corpus = read_corpus(paths, merge_labels)
    n = len(corpus.lengths)
    if n < shards:
        raise UserError(f"{n} sequences cannot fill {shards} shards")
    per_shard = assign_shards(corpus.lengths, shards, seed, within)
    cuts = chunk_bounds(per_shard, corpus.rows, chunk_frames, chunk_seqs)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{outdir}: cannot create the output folder ({e.strerror or e})") from None
    attrs = frontend_attrs(corpus.files)
    inputs = Inputs(corpus)
    entries, order = [], []
    try:
        for s, ids in enumerate(per_shard):
            sdir = outdir / f"shard-{s:03d}"
            sdir.mkdir(exist_ok=True)
            chunks = []
            for c, part in shard_chunks(ids, cuts):
                name = f"shard-{s:03d}/chunk-{c:04d}.nc"
                entry = write_chunk(outdir / name, inputs, part, fmt, attrs)
                chunks.append({"file": name, **entry})
                order.append(part)
                if progress:
                    progress(s, c, entry)
            entries.append({"frames": int(corpus.rows[ids].sum()), "numSeqs": int(len(ids)),
                            "chunks": chunks})
        order = np.concatenate(order)
        index = write_index(outdir / "index.npz", corpus, order)
        manifest = {"format": FORMAT, "version": VERSION, "labels": corpus.labels,
                    "inputPattSize": corpus.input_size, "within": within, "seed": seed,
                    "numSeqs": n, "numTimesteps": int(corpus.rows.sum()),
                    "numDims": 1 if corpus.heights is None else 2,
                    "imageHeight": corpus.column_height, "imageFrontend": corpus.image_frontend,
                    "sources": [{"file": os.path.abspath(p)} for p in corpus.files],
                    "index": index, "shards": entries}
        write_json_atomic(outdir / "manifest.json", manifest)
    except (OSError, RuntimeError) as e:
        # disk full, permissions (netCDF-C reports a full disk as a RuntimeError, often a
        # confusing one such as "Operation not allowed in define mode"): one clear line,
        # the free space, and no manifest
        free = shutil.disk_usage(outdir).free
        raise UserError(f"{outdir}: writing failed ({getattr(e, 'strerror', None) or e}; "
                        f"{free / 1e6:,.1f} MB free on that disk"
                        f"{': full?' if free < 64e6 else ''}); no manifest was written") from None
    finally:
        inputs.close()
    return outdir / "manifest.json"


def write_index(path: Path, corpus: Corpus, order: np.ndarray) -> dict:
    """Per-sequence metadata in global id order (= ``order`` of input indices)."""
    tl = np.array([len(corpus.targets[i]) for i in order], dtype=np.int64)
    flat = (np.concatenate([corpus.targets[i] for i in order]) if len(order)
            else np.zeros(0, np.int32)).astype(np.int32)
    extra = {} if corpus.heights is None else {"heights": corpus.heights[order]}
    atomic_write(path, lambda fh: np.savez(
        fh, lengths=corpus.lengths[order].astype(np.int64), **extra,
        target_offsets=np.concatenate([[0], np.cumsum(tl)]).astype(np.int64),
        targets=flat, tags=np.array([corpus.tags[i] for i in order], dtype=str)))
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def write_json_atomic(path: Path, obj: dict):
    atomic_write(path, json.dumps(obj, indent=1))

