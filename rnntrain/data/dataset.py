"""Datasets: per-sequence metadata in memory, frames on disk in chunks.

A dataset is either one RNNLIB ``.nc`` file, served as *virtual chunks* of contiguous
sequences of about ``chunk_frames`` frames, or a manifest written by ``rnntrain-data
shard`` (chunk files grouped into shards). Either way the trainer sees the same thing:
global sequence ids 0..N-1 with lengths, targets and tags, and a list of chunks, each a
contiguous row range of one file. Plans are made from this metadata alone
(``rnntrain.data.plan``); frames are read only by ``load_chunk``, on the reader thread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rnntrain.data import ncdata
from rnntrain.errors import DataError, UserError, check_regular_file
from rnntrain.compute.model import min_frames


@dataclass
class Chunk:
    """Sequences ``seqs`` (global ids, file order) = rows [row_start, row_stop) of ``path``."""
    path: str
    seqs: np.ndarray
    row_start: int
    row_stop: int
    first: int                   # index in the file of the first sequence
    sha256: str = ""             # verified on load when set (manifests)
    nbytes: int = 0
    checked: bool = False        # a file of its own (manifests): header checked on load

    @property
    def frames(self) -> int:
        return self.row_stop - self.row_start


@dataclass
class Dataset:
    source: str
    labels: list[str]
    input_size: int
    lengths: np.ndarray          # (N,) frames
    targets: list[np.ndarray]    # N label-index arrays
    tags: list[str]
    chunks: list[Chunk]
    shards: list[list[int]]      # chunk indices of each shard
    within: str = "sorted"       # "sorted" (ours) or "shuffle" (the RNNLIB recipe)
    _headers: dict = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.lengths)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def target_lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.targets], dtype=np.int64)

    def tag(self, i: int) -> str:
        return self.tags[i] or f"#{i}"

    def feasible(self, subsample: int = 1) -> np.ndarray:
        """(N,) bool: the sequence is long enough (after stacking) for its CTC target."""
        out_len = (self.lengths + subsample - 1) // subsample
        need = np.array([min_frames(t) for t in self.targets], dtype=np.int64)
        return out_len >= need

    def load_chunk(self, k: int) -> dict[int, np.ndarray]:
        """Read chunk k → {sequence id: (T_i, F) float32}. Call from the reader thread only."""
        c = self.chunks[k]
        if c.sha256:
            from rnntrain.data.manifest import verify_chunk
            verify_chunk(c)
        if c.checked:
            self.check_chunk(k)
        rows = ncdata.read_rows(c.path, c.row_start, c.row_stop)
        # offsets relative to the chunk; the sequences are contiguous in the file
        lens = self.lengths[c.seqs]
        offs = np.concatenate([[0], np.cumsum(lens)])
        if offs[-1] != len(rows):
            raise DataError(c.path, f"chunk rows {c.row_start}:{c.row_stop} do not match the "
                                    f"sequence lengths ({offs[-1]} frames)", var="inputs")
        if not np.isfinite(rows).all():
            bad = int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
            j = int(np.searchsorted(offs, bad, side="right") - 1)
            raise DataError(c.path, f"NaN or Inf in frame {bad - offs[j]}", var="inputs",
                            seq=c.first + j, tag=self.tags[c.seqs[j]])
        return {int(s): rows[offs[j]:offs[j + 1]] for j, s in enumerate(c.seqs)}

    def check_chunk(self, k: int):
        """A chunk file must hold the sequences the index says, in order: the same count,
        lengths, targets and (where the file has them) tags. Cheap (the file's header, no
        frames) and always done: chunk files swapped between shards or chunks would
        otherwise pair frames with the wrong targets, and sha256 is optional."""
        c = self.chunks[k]
        h = ncdata.read_header(c.path)
        if h.num_seqs != len(c.seqs):
            raise DataError(c.path, f"holds {h.num_seqs} sequences, the manifest index says "
                                    f"{len(c.seqs)} for this chunk (files swapped or "
                                    "replaced? re-run rnntrain-data shard)", var="numSeqs")
        if h.input_size != self.input_size or h.labels != self.labels:
            raise DataError(c.path, "inputPattSize or alphabet differs from the manifest")
        want = self.lengths[c.seqs]
        for j in np.flatnonzero(h.lengths != want)[:1]:
            raise DataError(c.path, f"length {h.lengths[j]}, the manifest index says "
                                    f"{want[j]} (files swapped or replaced? re-run "
                                    "rnntrain-data shard)", var="seqLengths", seq=int(j),
                            tag=h.tags[j])
        for j, s in enumerate(c.seqs):
            if h.tags[j] and h.tags[j] != self.tags[s]:
                raise DataError(c.path, f"tag differs from the manifest index's "
                                        f"'{self.tags[s]}' (files swapped or replaced?)",
                                var="seqTags", seq=j, tag=h.tags[j])
            if not np.array_equal(h.targets[j], self.targets[s]):
                raise DataError(c.path, "target differs from the manifest index (files "
                                        "swapped or replaced?)", var="targetStrings",
                                seq=j, tag=h.tags[j])

    @staticmethod
    def open(path: str, chunk_frames: int = 2_000_000) -> "Dataset":
        p = Path(path)
        if p.is_dir():
            if not (p / "manifest.json").is_file():
                raise UserError(f"{path}: a folder without manifest.json (not a dataset, or "
                                "an interrupted rnntrain-data shard: run it again)")
            p = p / "manifest.json"
        if p.suffix == ".json":
            check_regular_file(p, "manifest")
            from rnntrain.data.manifest import open_manifest
            ds = open_manifest(p)
        else:
            check_regular_file(p, "data file")
            ds = from_nc(str(p), chunk_frames)
        ds.require_sequences()
        return ds

    def require_sequences(self):
        """DataError for a dataset without sequences: training, scoring or inspecting it
        would only report zeros (an LER of 0 on nothing looks like success)."""
        if self.num_seqs == 0:
            raise DataError(self.source, "holds no sequences (numSeqs = 0)", var="numSeqs")


def virtual_chunks(path: str, lengths: np.ndarray, chunk_frames: int, first_id: int = 0,
                   row0: int = 0) -> list[Chunk]:
    """Split a file's sequences into contiguous chunks of about ``chunk_frames`` frames."""
    chunks, start, frames, row = [], 0, 0, row0
    for i, n in enumerate(lengths.tolist()):
        frames += n
        if frames >= chunk_frames or i == len(lengths) - 1:
            ids = np.arange(first_id + start, first_id + i + 1)
            chunks.append(Chunk(path, ids, row, row + frames, start))
            row, start, frames = row + frames, i + 1, 0
    return chunks


def from_nc(path: str, chunk_frames: int) -> Dataset:
    h = ncdata.read_header(path)
    chunks = virtual_chunks(path, h.lengths, chunk_frames)
    return Dataset(path, h.labels, h.input_size, h.lengths, h.targets, h.tags, chunks,
                   [list(range(len(chunks)))])


def check_compatible(a: Dataset, b: Dataset, what: str):
    """Validation/test data must share the training alphabet and input size."""
    if a.input_size != b.input_size:
        raise DataError(b.source, f"inputPattSize {b.input_size} differs from {what} "
                                  f"{a.source} ({a.input_size})")
    if a.labels != b.labels:
        raise DataError(b.source, f"alphabet differs from {what} {a.source} "
                                  f"({b.labels[:10]} vs {a.labels[:10]})", var="labels")
