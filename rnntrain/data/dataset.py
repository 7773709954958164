"""Datasets: per-sequence metadata in memory, frames on disk in chunks.

A dataset is either one RNNLIB ``.nc`` file, served as *virtual chunks* of contiguous
sequences of about ``chunk_frames`` frames, or a manifest written by ``rnntrain-data
shard`` (chunk files grouped into shards). Either way the trainer sees the same thing:
global sequence ids 0..N-1 with lengths, targets and tags, and a list of chunks, each a
contiguous row range of one file. Plans are made from this metadata alone
(``rnntrain.data.plan``); frames are read only by ``load_chunk``, on the reader thread.

2-D data (images, RNNLIB numDims = 2): ``lengths`` are the widths (the time axis: plans
batch images of similar width) and ``heights`` the heights; ``load_chunk`` serves each
image as (W, P·F) column frames with its height zero-padded to ``frame_height`` = P
(the model's fixed input height), so the trainer, the workers and the evaluation see
1-D sequences of column vectors, exactly like a ``--layout columns`` file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rnntrain.data import manifest, ncdata
from rnntrain.data.chunkbuf import ChunkBuffers
from rnntrain.errors import DataError, UserError, check_regular_file, file_problem
from rnntrain.fsutil import verify_file


def min_frames(target: "list[int] | np.ndarray") -> int:
    """Shortest input (after subsampling) that can emit ``target`` under CTC: S + repeats
    (a repeated label needs a blank between its two frames)."""
    t = list(map(int, target))
    return len(t) + sum(1 for a, b in zip(t, t[1:]) if a == b)


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
    heights: np.ndarray | None = None  # (N,) image heights (2-D data); None: 1-D
    column_height: int = 0       # 1-D frames that are image columns of this height
    pad_height: int = 0          # 2-D: serve images padded to this height (0: the tallest)
    image_frontend: str = ""     # how images were converted (JSON; for inference)
    _headers: dict = field(default_factory=dict, repr=False)
    has_targets: bool = True     # False: opened for decoding a file without targetStrings
    frontend: dict | None = None  # the converters' front end (rnntrain.frontend), if recorded

    @property
    def is_2d(self) -> bool:
        return self.heights is not None

    @property
    def rows(self) -> np.ndarray:
        """(N,) rows of the file's ``inputs`` per sequence (height × width for images)."""
        return self.lengths if self.heights is None else self.lengths * self.heights

    @property
    def frame_height(self) -> int:
        """Pixels per column of the frames served (1 for plain 1-D features)."""
        if self.heights is not None:
            return self.pad_height or int(self.heights.max(initial=1))
        return self.column_height or 1

    @property
    def frame_size(self) -> int:
        """Values per served frame: the model's input size."""
        return self.input_size * self.frame_height if self.is_2d else self.input_size

    def set_pad_height(self, height: int, what: str):
        """Serve images padded to ``height`` (the model's); DataError naming the first
        taller image."""
        if self.heights is None:
            return
        tall = np.flatnonzero(self.heights > height)
        if len(tall):
            i = int(tall[0])
            raise DataError(self.source, f"image height {self.heights[i]} exceeds the "
                                         f"model's input height {height} ({what}; "
                                         f"{len(tall)} such images)", var="seqDims",
                            seq=i, tag=self.tags[i])
        self.pad_height = int(height)

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

    def load_chunk(self, k: int, buffers: ChunkBuffers | None = None) -> dict[int, np.ndarray]:
        """Read chunk k → {sequence id: (T_i, F) float32}. Call from the reader thread only.
        ``buffers``: the reader's (``rnntrain.data.chunkbuf``): the frames are views of one
        of its mappings (no chunk-sized block in the heap); None: of a new array."""
        c = self.chunks[k]
        if c.sha256:
            verify_chunk(c)
        if c.checked:
            self.check_chunk(k)
        rows = ncdata.read_rows(c.path, c.row_start, c.row_stop, buffers)
        # offsets relative to the chunk; the sequences are contiguous in the file
        lens = self.rows[c.seqs]
        offs = np.concatenate([[0], np.cumsum(lens)])
        if offs[-1] != len(rows):
            raise DataError(c.path, f"chunk rows {c.row_start}:{c.row_stop} do not match the "
                                    f"sequence lengths ({offs[-1]} frames)", var="inputs")
        ncdata.check_finite(c.path, rows, offs, c.first, lambda j: self.tags[c.seqs[j]])
        if self.heights is not None:
            p = self.frame_height
            return {int(s): ncdata.columns(rows[offs[j]:offs[j + 1]], int(self.heights[s]), p)
                    for j, s in enumerate(c.seqs)}
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

    def require_sequences(self):
        """DataError for a dataset without sequences: training, scoring or inspecting it
        would only report zeros (an LER of 0 on nothing looks like success)."""
        if self.num_seqs == 0:
            raise DataError(self.source, "holds no sequences (numSeqs = 0)", var="numSeqs")

    @staticmethod
    def open(path: str, chunk_frames: int = 2_000_000, need_targets: bool = True) -> "Dataset":
        """A .nc file, a sharded dataset's folder or its manifest.json. need_targets=False
        accepts a .nc file without targetStrings (decoding)."""
        p = Path(path)
        if p.is_dir():
            if not (p / "manifest.json").is_file():
                raise UserError(f"{path}: a folder without manifest.json (not a dataset, or "
                                "an interrupted rnntrain-data shard: run it again)")
            p = p / "manifest.json"
        if p.suffix == ".json":
            check_regular_file(p, "manifest")
            ds = from_manifest(p)
            if ds.chunks:  # the shard tool copies its inputs' front end into every chunk
                ds.frontend = read_frontend(ds.chunks[0].path)
        else:
            check_regular_file(p, "data file")  # a FIFO would block the read
            ds = from_nc(str(p), chunk_frames, need_targets)
        ds.require_sequences()
        return ds


def virtual_chunks(path: str, lengths: np.ndarray, chunk_frames: int, first_id: int = 0,
                   row0: int = 0) -> list[Chunk]:
    """Split a file's sequences into contiguous chunks of about ``chunk_frames`` frames.

    lengths: (N,) rows per sequence (for images height × width: memory is what counts)."""
    chunks, start, frames, row = [], 0, 0, row0
    for i, n in enumerate(lengths.tolist()):
        frames += n
        if frames >= chunk_frames or i == len(lengths) - 1:
            ids = np.arange(first_id + start, first_id + i + 1)
            chunks.append(Chunk(path, ids, row, row + frames, start))
            row, start, frames = row + frames, i + 1, 0
    return chunks


def from_nc(path: str, chunk_frames: int, need_targets: bool = True) -> Dataset:
    h = ncdata.read_header(path, need_targets)
    chunks = virtual_chunks(path, h.rows, chunk_frames)
    return Dataset(path, h.labels, h.input_size, h.lengths, h.targets, h.tags, chunks,
                   [list(range(len(chunks)))], heights=h.heights,
                   column_height=h.column_height, image_frontend=h.image_frontend,
                   has_targets=h.has_targets, frontend=read_frontend(path))


def read_frontend(path: str) -> dict | None:
    """The front end recorded by the audio converters (a checked plain dict), or None."""
    from rnntrain.frontend import ATTR, FrontEnd
    text = ncdata.read_attrs(path).get(ATTR)
    if text is None:
        return None
    return FrontEnd.from_json(str(text), f"{path}, attribute '{ATTR}'").to_dict()


def check_fits(ds: Dataset, labels: list[str], input_size: int, what: str):
    """``ds`` must have ``what``'s input size and alphabet (the training data's, a
    checkpoint's): DataError naming ``ds``'s file otherwise."""
    if ds.input_size != input_size:
        raise DataError(ds.source, f"inputPattSize {ds.input_size} differs from {what} "
                                   f"({input_size})")
    if list(ds.labels) != list(labels):
        diff = alphabet_difference(ds.labels, labels, "in this file", f"in {what}")
        raise DataError(ds.source, f"alphabet differs from {what} ({diff})", var="labels")


def alphabet_difference(have, want, here: str = "here", there: str = "there") -> str:
    """How alphabet ``have`` differs from ``want``, for a message: the labels only in one
    of them (a few named, with their counts), or the first position where the same labels
    stand in another order."""
    have, want = list(have), list(want)
    only_here = [x for x in have if x not in set(want)]
    only_there = [x for x in want if x not in set(have)]

    def some(xs):
        return f"{len(xs)} ({', '.join(map(repr, xs[:8]))}{', ...' if len(xs) > 8 else ''})"
    parts = [f"only {where}: {some(xs)}"
             for where, xs in ((here, only_here), (there, only_there)) if xs]
    if parts:
        return "; ".join(parts)
    if len(have) != len(want):
        return f"{len(have)} labels {here}, {len(want)} {there}, some repeated"
    i = next(i for i, (a, b) in enumerate(zip(have, want)) if a != b)
    return (f"the same {len(have)} labels in another order: label {i} is {have[i]!r} "
            f"{here}, {want[i]!r} {there}")


def check_compatible(a: Dataset, b: Dataset, what: str):
    """Validation/test data ``b`` must share the alphabet, input size and image layout of
    ``a``; 2-D images are served at ``a``'s height."""
    check_fits(b, a.labels, a.input_size, f"{what} {a.source}")
    if a.frontend is not None and b.frontend is not None and a.frontend != b.frontend:
        raise DataError(b.source, f"features or normalisation statistics differ from {what} "
                                  f"{a.source} (attribute 'rnntrain_frontend'; convert it with "
                                  f"--stats of the training set)")
    if a.is_2d != b.is_2d or a.column_height != b.column_height:
        raise DataError(b.source, f"image layout differs from {what} {a.source} (2-D: "
                                  f"{b.is_2d} vs {a.is_2d}; imageHeight {b.column_height} vs "
                                  f"{a.column_height})")
    b.set_pad_height(a.frame_height, f"{what} {a.source}")


def from_manifest(path) -> Dataset:
    """A Dataset over the chunk files a manifest lists (metadata only; no chunk is read)."""
    path = Path(path)
    man = manifest.read_manifest(path)
    root = path.parent
    ix = man["index"]
    where = str(path)
    # every path confined before anything is opened or hashed
    index_path = manifest.confined(root, manifest.require(ix, "file", where, str),
                                   f"{where} index")
    chunk_paths = [[manifest.confined(root, c["file"], f"{where} shard {s}")
                    for c in sh["chunks"]] for s, sh in enumerate(man["shards"])]
    idx = manifest.read_index(index_path, manifest.require(ix, "sha256", where, str),
                              manifest.require(ix, "bytes", where, int))
    lengths = idx["lengths"].astype(np.int64)
    heights = idx["heights"].astype(np.int64) if "heights" in idx else None
    rows = lengths if heights is None else lengths * heights
    toff = idx["target_offsets"].astype(np.int64)
    flat = idx["targets"].astype(np.int32)
    n = len(lengths)
    if len(toff) != n + 1 or len(idx["tags"]) != n or toff[-1] != len(flat) \
            or toff[0] != 0 or np.any(np.diff(toff) < 0):
        raise DataError(index_path, "index arrays have inconsistent sizes")
    if n and lengths.min() <= 0:
        i = int(np.argmin(lengths))
        raise DataError(index_path, f"length {lengths[i]} (every sequence needs a frame)",
                        var="lengths", seq=i)
    targets = [flat[toff[i]:toff[i + 1]] for i in range(n)]
    if len(flat) and (flat.min() < 0 or flat.max() >= len(man["labels"])):
        raise DataError(index_path, "target label index outside the alphabet")
    chunks, shards, first = [], [], 0
    for sh, paths in zip(man["shards"], chunk_paths):
        ids = []
        for c, cpath in zip(sh["chunks"], paths):
            if c["numSeqs"] < 0 or c["numTimesteps"] < 0 or c["bytes"] < 0:
                raise DataError(cpath, "negative numSeqs, numTimesteps or bytes in the "
                                       "manifest")
            seqs = np.arange(first, first + c["numSeqs"], dtype=np.int64)
            if seqs[-1:].size and seqs[-1] >= n or int(rows[seqs].sum()) != c["numTimesteps"]:
                raise DataError(cpath, "numSeqs/numTimesteps in the manifest do "
                                       "not match the sequence index")
            ids.append(len(chunks))
            chunks.append(Chunk(str(cpath), seqs, 0, c["numTimesteps"], 0,
                                c["sha256"], c["bytes"], checked=True))
            first += c["numSeqs"]
        shards.append(ids)
    if first != n:
        raise DataError(path, f"chunks hold {first} sequences but the index has {n}")
    return Dataset(str(path), list(man["labels"]), man["inputPattSize"], lengths, targets,
                   [str(t) for t in idx["tags"]], chunks, shards, within=man["within"],
                   heights=heights, column_height=int(man.get("imageHeight", 0)),
                   image_frontend=str(man.get("imageFrontend", "")))


def verify_chunk(chunk: Chunk):
    """Size and sha256 of a chunk file against the manifest; DataError naming the file."""
    if why := file_problem(chunk.path, "chunk file"):
        raise DataError(chunk.path, why)
    verify_file(chunk.path, chunk.nbytes, chunk.sha256, "chunk file")
