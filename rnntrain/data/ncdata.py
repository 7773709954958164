"""RNNLIB's NetCDF layout, read and written exactly.

Layout (one file = one set of sequences):
  dimensions  numSeqs, inputPattSize, numLabels (alphabet, no blank), numTimesteps (the
              first dimension of ``inputs``; any name), optional numDims (1 or 2), and
              the widths of the char arrays (any names).
  inputs(numTimesteps, inputPattSize)   any numeric type; sequences back to back.
  seqLengths(numSeqs) or seqDims(numSeqs, numDims)   (seqDims is read first when present)
  attribute imageHeight (ours, optional, 1-D files): every frame is one image column of
              that many pixels (``rnntrain-data images --layout columns``).

2-D sequences (images, numDims = 2): ``seqDims[i] = (height, width)`` and the image has
height × width rows of ``inputs`` in column-major pixel order: column 0 top to bottom,
then column 1, ... RNNLIB reads a sequence into a row-major buffer of shape
``flip(seqDims[i])`` = (width, height, inputPattSize) (RNNLIB src/NetcdfDataset.hpp,
``load_sequences``; strides in src/MultiArray.hpp), and its example builder
examples/arabic_offline_handwriting/arabic_offline.py writes ``seqDims = (height,
width)`` and the pixels of ``image.transpose(FLIP_TOP_BOTTOM).transpose(ROTATE_270)``,
which is the image transposed, so pixel (y, x) lands at row ``x * height + y``. We read
it the same way: a (width, height × inputPattSize) array of columns, the width being the
time axis of the recurrent layers.
  labels(numLabels, width), targetStrings(numSeqs, width)   0-terminated char rows
              (netCDF-4 vlen strings are accepted on read); a target is a whitespace-
              separated list of label names; the CTC blank is index numLabels.
  seqTags(numSeqs, width)   optional sequence names.

The NetCDF/HDF5 C libraries are not thread-safe: every call into netCDF4 in this process
goes through ``NC_LOCK``. The chunk reader keeps payload reads on its own thread, so the
lock is uncontended in training; it protects tools and tests that read from elsewhere.
"""
from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from rnntrain.errors import DataError, file_problem
from rnntrain.fsutil import PendingWrite

if TYPE_CHECKING:
    from rnntrain.data.chunkbuf import ChunkBuffers

NC_LOCK = threading.RLock()

FORMATS = ("NETCDF3_64BIT_OFFSET", "NETCDF3_CLASSIC", "NETCDF4", "NETCDF4_CLASSIC")


def _nc():
    import netCDF4  # imported lazily: keeps `--help` and planning fast
    return netCDF4


@dataclass
class NcHeader:
    """Everything about a file except the input frames (small; kept in memory).

    lengths: (N,) int64 frames per sequence (2-D: the image widths, the time axis);
    heights: (N,) image heights of a 2-D file, None for 1-D; offsets: (N+1,) first row
    of each sequence (a 2-D sequence has height × width rows); targets: N int32 arrays
    of label indices (empty when the file has no targetStrings and they were
    not required: has_targets False); tags: N names; column_height: a 1-D file's imageHeight attribute.
    """
    path: str
    input_size: int
    labels: list[str]
    lengths: np.ndarray
    targets: list[np.ndarray]
    tags: list[str]
    heights: np.ndarray | None = None
    column_height: int = 0
    image_frontend: str = ""     # the rnntrain_images attribute (JSON) of converted images
    has_targets: bool = True
    offsets: np.ndarray = field(init=False)

    def __post_init__(self):
        self.offsets = np.concatenate([[0], np.cumsum(self.rows, dtype=np.int64)])

    @property
    def rows(self) -> np.ndarray:
        """(N,) rows of ``inputs`` per sequence."""
        return self.lengths if self.heights is None else self.lengths * self.heights

    @property
    def num_seqs(self) -> int:
        return len(self.lengths)

    @property
    def total_frames(self) -> int:
        return int(self.offsets[-1])

    def tag(self, i: int) -> str:
        return self.tags[i] if self.tags[i] else f"#{i}"


def _open(path, mode="r"):
    path = str(path)
    if mode == "r":
        if why := file_problem(path, "data file"):
            raise DataError(path, why)
    try:
        return _nc().Dataset(path, mode)
    except OSError as e:  # netCDF4 says "[Errno -51] NetCDF: Unknown file format" etc.
        raise DataError(path, f"cannot open as NetCDF ({e.strerror or e}): not a NetCDF "
                              "file, or a truncated or damaged one") from None


# deflate, the strongest filter netCDF-4 writers use, packs at most ~1032 bytes into one
DEFLATE_MAX_RATIO = 1100


def _check_claim(var, path: str, file_size: int):
    """DataError when a variable declares more bytes than the file could hold, before
    anything is allocated: a header saying numSeqs = 10^10 must be a clean error, not a
    MemoryError or a 40 GiB allocation. Classic files are checked whole (check_complete);
    netCDF-4 data may be compressed, but never beyond deflate's limit, and chunks that
    were never written occupy no space at all (they read as fill values)."""
    n = 1
    for d in var.shape:
        n *= int(d)
    size = n * max(var.dtype.itemsize if hasattr(var.dtype, "itemsize") else 8, 1)
    if size > max(file_size, 1 << 20) * DEFLATE_MAX_RATIO:
        raise DataError(path, f"declares {size:,} bytes (shape {var.shape}) but the file has "
                              f"only {file_size:,}: a damaged header, or a variable that was "
                              "never written", var=var.name)


def fill_value(var):
    """The value netCDF returns for parts of ``var`` never written: its ``_FillValue``
    attribute or the library default for its type; None for strings or with NOFILL."""
    if "_FillValue" in var.ncattrs():
        return np.asarray(var.getncattr("_FillValue")).reshape(-1)[0]
    if getattr(var.dtype, "kind", "") not in "iuf" or "_NoFill" in var.ncattrs():
        return None
    return _nc().default_fillvals.get(var.dtype.str[1:])


def _unwritten_rows(raw: np.ndarray, fill) -> np.ndarray:
    """Indices of rows that hold nothing but the fill value."""
    if fill is None or raw.size == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero((raw == np.asarray(fill, raw.dtype)).all(axis=tuple(range(1, raw.ndim))))


def _strings(ds, name: str, path: str, required: bool) -> list[str] | None:
    """Read a 2-D 0-terminated char array (or a vlen string variable) as a list of str."""
    if name not in ds.variables:
        if required:
            raise DataError(path, "missing variable", var=name)
        return None
    var = ds.variables[name]
    var.set_auto_maskandscale(False)
    if var.dtype is str or getattr(var.dtype, "kind", "") in "OU":
        return [str(s) for s in var[:]]
    if var.ndim != 2 or var.dtype.kind not in "SU":
        raise DataError(path, f"expected a 2-D char array, got {var.dtype} with dimensions "
                              f"{var.dimensions}", var=name)
    var.set_auto_chartostring(False)
    raw = np.asarray(var[:])
    if raw.size == 0:  # a zero-length dimension (an empty alphabet, no sequences)
        return [] if raw.shape[0] == 0 else [""] * raw.shape[0]
    out = []
    for row in raw.view(np.uint8).reshape(raw.shape[0], -1) if raw.dtype.kind == "S" else raw:
        b = bytes(row)
        out.append(b.split(b"\0", 1)[0].decode("utf-8", "replace"))
    return out


def read_header(path, need_targets: bool = True) -> NcHeader:
    """Read and validate everything but the inputs. Raises DataError naming file/var/seq.

    need_targets=False: a file without ``targetStrings`` (data to transcribe) is accepted,
    with empty targets and ``has_targets`` False (and without ``labels``: an empty list).
    """
    path = str(path)
    with NC_LOCK, _open(path) as ds:
        check_complete(path)
        dims = ds.dimensions
        for d in ("numSeqs", "inputPattSize"):
            if d not in dims:
                raise DataError(path, f"missing dimension '{d}'")
        ndim = dims["numDims"].size if "numDims" in dims else 1
        if ndim not in (1, 2):
            raise DataError(path, f"numDims = {ndim}: only 1-D sequences and 2-D images "
                                  "(seqDims = height, width) are supported")
        n, f = dims["numSeqs"].size, dims["inputPattSize"].size
        file_size = os.path.getsize(path)
        for v in ds.variables.values():
            _check_claim(v, path, file_size)
        if f == 0:
            raise DataError(path, "inputPattSize = 0: a frame needs at least one feature")
        if "inputs" not in ds.variables:
            raise DataError(path, "missing variable", var="inputs")
        inp = ds.variables["inputs"]
        if inp.ndim != 2 or inp.shape[1] != f:
            raise DataError(path, f"expected shape (numTimesteps, inputPattSize={f}), got "
                                  f"{inp.shape}", var="inputs")
        if inp.dtype.kind not in "iuf":
            raise DataError(path, f"expected a numeric type, got {inp.dtype}", var="inputs")
        heights, column_height = None, 0
        image_frontend = str(ds.getncattr("rnntrain_images")) \
            if "rnntrain_images" in ds.ncattrs() else ""
        if "imageHeight" in ds.ncattrs():
            column_height = int(np.asarray(ds.getncattr("imageHeight")).reshape(-1)[0])
            if ndim != 1 or column_height < 1 or f % column_height:
                raise DataError(path, f"attribute imageHeight = {column_height} must divide "
                                      f"inputPattSize = {f} (and numDims must be 1)")
        if "seqDims" in ds.variables:
            lv = "seqDims"
            ds.variables[lv].set_auto_maskandscale(False)
            sd = np.asarray(ds.variables["seqDims"][:])
            if sd.ndim != 2 or sd.shape[1] != ndim:
                raise DataError(path, f"expected shape (numSeqs, numDims={ndim}), got "
                                      f"{sd.shape}", var=lv)
            if ndim == 2:  # (height, width): the width is the time axis
                if sd.dtype.kind in "iu" and len(sd) and (sd <= 0).any():
                    i = int(np.flatnonzero((sd <= 0).any(axis=1))[0])
                    raise DataError(path, f"image size {tuple(int(v) for v in sd[i])} "
                                          "(height, width must be >= 1)", var=lv, seq=i)
                heights = sd[:, 0].astype(np.int64)
            lengths = sd[:, -1]
            if ndim == 2 and "seqLengths" in ds.variables:  # RNNLIB's builders write both
                sl = np.asarray(ds.variables["seqLengths"][:]).reshape(-1).astype(np.int64)
                hw = heights * lengths.astype(np.int64)
                if len(sl) == len(hw) and (sl != hw).any():
                    i = int(np.flatnonzero(sl != hw)[0])
                    raise DataError(path, f"seqLengths {sl[i]} != height x width "
                                          f"{heights[i]} x {lengths[i]} from seqDims",
                                    var="seqLengths", seq=i)
        elif ndim == 2:
            raise DataError(path, "missing variable (a 2-D file needs seqDims = height, "
                                  "width per sequence)", var="seqDims")
        elif "seqLengths" in ds.variables:
            lv = "seqLengths"
            ds.variables[lv].set_auto_maskandscale(False)
            lengths = np.asarray(ds.variables["seqLengths"][:]).reshape(-1)
        else:
            raise DataError(path, "missing variable (neither seqLengths nor seqDims)",
                            var="seqLengths")
        if lengths.dtype.kind not in "iu":
            raise DataError(path, f"expected integers, got {lengths.dtype}", var=lv)
        fill = fill_value(ds.variables[lv])
        unwritten = np.flatnonzero(lengths == fill) if fill is not None else []
        if len(unwritten):
            i = int(unwritten[0])
            raise DataError(path, f"holds the fill value {fill} for {len(unwritten)} of {n} "
                                  "sequences: it was never written (an interrupted "
                                  "conversion?)", var=lv, seq=i)
        lengths = lengths.astype(np.int64)
        if len(lengths) != n:
            raise DataError(path, f"has {len(lengths)} entries but numSeqs = {n}", var=lv)
        labels = _strings(ds, "labels", path, required=need_targets)
        targ = _strings(ds, "targetStrings", path, required=need_targets)
        has_targets = targ is not None
        targ = targ if has_targets else [""] * n
        tags = _strings(ds, "seqTags", path, required=False) or [""] * n
        total = inp.shape[0]
    if labels is None:  # data to transcribe: no alphabet, no targets
        labels = []
    elif not labels:
        raise DataError(path, "the alphabet is empty (numLabels = 0)", var="labels")
    if len(set(labels)) != len(labels) or any(not lb or lb.split() != [lb] for lb in labels):
        dup = [lb for lb in labels if labels.count(lb) > 1 or not lb or lb.split() != [lb]]
        raise DataError(path, f"label names must be unique, non-empty and without "
                              f"whitespace; offending: {dup[:5]}", var="labels")
    for name, arr in (("targetStrings", targ), ("seqTags", tags)):
        if len(arr) != n:
            raise DataError(path, f"has {len(arr)} rows but numSeqs = {n}", var=name)
    bad = np.flatnonzero(lengths <= 0)
    if len(bad):
        i = int(bad[0])
        raise DataError(path, f"length {lengths[i]} (every sequence needs at least one "
                              f"frame; {len(bad)} such sequences)", var=lv, seq=i, tag=tags[i])
    rows = lengths if heights is None else lengths * heights
    if int(rows.sum()) != total:
        what = "lengths sum" if heights is None else "height x width sums"
        raise DataError(path, f"{what} to {int(rows.sum())} but inputs has {total} "
                              "rows (numTimesteps)", var=lv)
    index = {lb: k for k, lb in enumerate(labels)}
    targets = []
    for i, s in enumerate(targ):
        try:
            targets.append(np.array([index[t] for t in s.split()], dtype=np.int32))
        except KeyError as e:
            raise DataError(path, f"target token '{e.args[0]}' is not in the alphabet "
                                  f"({len(labels)} labels: {' '.join(labels[:20])}"
                                  f"{' ...' if len(labels) > 20 else ''})",
                            var="targetStrings", seq=i, tag=tags[i]) from None
    return NcHeader(path, f, labels, lengths, targets, tags, heights, column_height,
                    image_frontend, has_targets)


def read_attrs(path) -> dict:
    """The file's global attributes ({} when it has none)."""
    with NC_LOCK, _open(path) as ds:
        return {k: ds.getncattr(k) for k in ds.ncattrs()}


READ_BLOCK = 4 * 2**20  # bytes: read_rows reads this much at a time into its result


def read_rows(path, start: int, stop: int, buffers: ChunkBuffers | None = None) -> np.ndarray:
    """Rows [start, stop) of ``inputs`` as float32, shape (stop-start, F): in a mapping of
    ``buffers`` (``rnntrain.data.chunkbuf``), else in a new array. Read ``READ_BLOCK`` bytes
    at a time, so the only other memory it takes is one block (whatever the row count)."""
    with NC_LOCK, _open(path) as ds:
        var = ds.variables["inputs"]
        var.set_auto_maskandscale(False)
        n, width = stop - start, int(var.shape[1])
        # integer frames of one value (e.g. all-white image columns) are ordinary data:
        # only an explicit _FillValue counts there; a float frame of 9.97e36 never is
        fill = fill_value(var) if var.dtype.kind == "f" or "_FillValue" in var.ncattrs() \
            else None
        out = buffers.take((n, width)) if buffers is not None \
            else np.empty((n, width), np.float32)
        step = max(1, READ_BLOCK // max(1, width * var.dtype.itemsize))
        bad_first, bad_count = None, 0
        for a in range(0, n, step):
            b = min(n, a + step)
            try:
                raw = np.asarray(var[start + a:start + b, :])
            except (OSError, RuntimeError, IndexError) as e:
                raise DataError(path, f"cannot read rows {start}:{stop} ({e})",
                                var="inputs") from None
            if raw.shape[0] != b - a:
                raise DataError(path, f"expected {n} rows at {start}, got "
                                      f"{a + raw.shape[0]} (truncated file?)", var="inputs")
            bad = _unwritten_rows(raw, fill)
            if len(bad) and bad_first is None:
                bad_first = a + int(bad[0])
            bad_count += len(bad)
            out[a:b] = raw
    if bad_count:
        raise DataError(path, f"row {start + bad_first} (and {bad_count - 1} more of rows "
                              f"{start}:{stop}) holds only the fill value {fill}: the "
                              "variable was never written there (an interrupted "
                              "conversion?)", var="inputs")
    return out


def first_nonfinite_row(rows: np.ndarray) -> int | None:
    """Index of the first row of ``rows`` (R, F) holding a NaN or Inf, or None."""
    step = max(1, READ_BLOCK // max(1, rows[:1].nbytes))  # bounded temporaries
    for a in range(0, len(rows), step):
        ok = np.isfinite(rows[a:a + step])
        if not ok.all():  # the rare case: find the row
            return a + int(np.flatnonzero(~ok.all(axis=1))[0])
    return None


def check_finite(path, rows: np.ndarray, offsets: np.ndarray, first: int,
                 tag_of: Callable[[int], str]):
    """Raise DataError naming the first sequence with NaN/Inf frames, if any.

    rows: (R, F) holding n contiguous sequences; offsets: (n+1,) their starts in ``rows``;
    sequence j is the file's sequence ``first + j`` with tag ``tag_of(j)``.
    """
    bad = first_nonfinite_row(rows)
    if bad is None:
        return
    j = int(np.searchsorted(offsets, bad, side="right") - 1)
    raise DataError(path, f"NaN or Inf in frame {bad - int(offsets[j])}", var="inputs",
                    seq=first + j, tag=tag_of(j))


def read_file(path) -> tuple[NcHeader, list[np.ndarray]]:
    """The whole file in memory: header and one (T_i, F) float32 array per sequence."""
    h = read_header(path)
    rows = read_rows(path, 0, h.total_frames)
    check_finite(path, rows, h.offsets, 0, h.tags.__getitem__)
    return h, [rows[h.offsets[i]:h.offsets[i + 1]] for i in range(h.num_seqs)]


def _char_array(strings: Sequence[str]) -> np.ndarray:
    enc = [s.encode("utf-8") for s in strings]
    width = max([len(b) for b in enc] + [0]) + 1  # room for the terminating 0
    out = np.zeros((len(enc), width), dtype="S1")
    for i, b in enumerate(enc):
        if b:
            out[i, :len(b)] = np.frombuffer(b, dtype="S1")
    return out


class NcWriter:
    """Write an RNNLIB-format file; inputs are streamed in sequence order.

    Targets and tags are known up front (small); frames arrive with ``append`` so that
    converters never hold more than one sequence (or one chunk) of frames. The file is
    written under a temporary name and renamed by ``close()`` (never half-written).
    ``heights`` (N,): write a 2-D file (numDims = 2, seqDims = height, width = lengths);
    each image is then appended as its height × width rows in column-major order.
    ``attrs``: global attributes (e.g. imageHeight, the converter's parameters).
    ``strings``: further per-sequence text variables, {name: (N,) strings} (e.g. the
    converters' ``fullTargetStrings``), written as (numSeqs, max<Name>Length) chars.
    """

    def __init__(self, path, labels: Sequence[str], input_size: int, lengths: Sequence[int],
                 targets: Sequence[str], tags: Sequence[str] | None = None,
                 fmt: str = "NETCDF3_64BIT_OFFSET", dtype=np.float32,
                 heights: Sequence[int] | None = None, attrs: dict | None = None,
                 strings: dict[str, Sequence[str]] | None = None):
        if fmt not in FORMATS:
            raise ValueError(f"unknown NetCDF format {fmt!r}; choose one of {FORMATS}")
        lengths = np.asarray(lengths, dtype=np.int64)
        n = len(lengths)
        assert len(targets) == n and (tags is None or len(tags) == n)
        rows = lengths
        if heights is not None:
            heights = np.asarray(heights, dtype=np.int64)
            assert heights.shape == lengths.shape
            rows = lengths * heights
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # the netCDF library writes by name: a temp file, committed in close()
        self.pending = PendingWrite(self.path)
        self.tmp = self.pending.tmp
        self.total, self.row, self.seq = int(rows.sum()), 0, 0
        self.lengths = lengths
        with NC_LOCK:
            ds = self.ds = _nc().Dataset(str(self.tmp), "w", format=fmt)
            ds.createDimension("numSeqs", n)
            ds.createDimension("numTimesteps", self.total)
            ds.createDimension("inputPattSize", input_size)
            ds.createDimension("numDims", 1 if heights is None else 2)
            for k, v in (attrs or {}).items():
                ds.setncattr(k, v)
            ds.createDimension("numLabels", len(labels))
            lab, tgt = _char_array(labels), _char_array(targets)
            ds.createDimension("maxLabelLength", lab.shape[1])
            ds.createDimension("maxTargStringLength", tgt.shape[1])
            if tags is not None:
                tg = _char_array(tags)
                ds.createDimension("maxSeqTagLength", tg.shape[1])
                ds.createVariable("seqTags", "S1", ("numSeqs", "maxSeqTagLength"))[:] = tg
            for name, values in (strings or {}).items():
                assert len(values) == n
                arr = _char_array(values)
                dim = f"max{name[0].upper()}{name[1:]}Length"
                ds.createDimension(dim, arr.shape[1])
                ds.createVariable(name, "S1", ("numSeqs", dim))[:] = arr
            ds.createVariable("labels", "S1", ("numLabels", "maxLabelLength"))[:] = lab
            ds.createVariable("targetStrings", "S1", ("numSeqs", "maxTargStringLength"))[:] = tgt
            ds.createVariable("seqLengths", "i4", ("numSeqs",))[:] = rows
            ds.createVariable("seqDims", "i4", ("numSeqs", "numDims"))[:] = \
                lengths[:, None] if heights is None else np.stack([heights, lengths], axis=1)
            self.inputs = ds.createVariable("inputs", dtype, ("numTimesteps", "inputPattSize"))

    def append(self, frames: np.ndarray):
        """frames: (T, F) for the next sequence(s) in order; T may span several sequences."""
        frames = np.asarray(frames)
        with NC_LOCK:
            self.inputs[self.row:self.row + len(frames), :] = frames
        self.row += len(frames)
        assert self.row <= self.total

    def close(self):
        try:
            with NC_LOCK:
                self.ds.close()
        except Exception:    # e.g. the disk filled up while flushing
            self.abort()
            raise
        if self.row != self.total:
            self.pending.abort()
            raise AssertionError(f"wrote {self.row} of {self.total} frames")
        self.pending.commit()  # fsync, rename, fsync the folder (fsutil)

    def abort(self):
        with NC_LOCK:
            if self.ds.isopen():
                try:
                    self.ds.close()
                except Exception:  # broken (e.g. disk full): the temp file is removed anyway
                    _leak(self.ds)
        self.pending.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _leak(ds):
    """Keep a Dataset whose close() failed alive for good: netCDF4 would call nc_close on
    it again when it is garbage-collected, which crashes the process (seen on a full
    disk). The handle is small; the process exits normally instead of segfaulting."""
    import ctypes
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(ds))


def write_file(path, seqs: Sequence[np.ndarray], targets: Sequence[str], labels: Sequence[str],
               tags: Sequence[str] | None = None, fmt: str = "NETCDF3_64BIT_OFFSET"):
    """Write in-memory sequences (each (T_i, F)) with targets as label-name strings."""
    assert seqs, "no sequences"
    f = seqs[0].shape[1]
    with NcWriter(path, labels, f, [len(s) for s in seqs], targets, tags, fmt) as w:
        for s in seqs:
            w.append(s)


def image_rows(img: np.ndarray) -> np.ndarray:
    """An image (H, W) or (H, W, F) → its (W·H, F) rows in RNNLIB's 2-D pixel order
    (column-major: column 0 top to bottom, then column 1, ...; see the module docstring)."""
    img = img[:, :, None] if img.ndim == 2 else img
    return np.ascontiguousarray(img.transpose(1, 0, 2)).reshape(-1, img.shape[2])


def columns(rows: np.ndarray, height: int, pad_height: int = 0) -> np.ndarray:
    """A 2-D sequence's (W·H, F) rows → (W, P·F) column frames, the pixels of a column top
    to bottom, zero rows appended below to ``pad_height`` = P (>= H; 0: P = H)."""
    f = rows.shape[1]
    cols = rows.reshape(-1, height, f)
    if pad_height > height:
        cols = np.concatenate([cols, np.zeros((len(cols), pad_height - height, f), cols.dtype)],
                              axis=1)
    return cols.reshape(len(cols), -1)


def write_images(path, images: Sequence[np.ndarray], targets: Sequence[str],
                 labels: Sequence[str], tags: Sequence[str] | None = None,
                 fmt: str = "NETCDF3_64BIT_OFFSET", attrs: dict | None = None):
    """Write in-memory images, each (H_i, W_i) or (H_i, W_i, F), as a 2-D RNNLIB file."""
    assert images, "no images"
    f = 1 if images[0].ndim == 2 else images[0].shape[2]
    with NcWriter(path, labels, f, [im.shape[1] for im in images], targets, tags, fmt,
                  heights=[im.shape[0] for im in images], attrs=attrs) as w:
        for im in images:
            w.append(image_rows(im))


_NC_TYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8}


def classic_min_size(path) -> int | None:
    """Bytes a classic-format (CDF-1/2/5) file needs for all its variables, from its header;
    None for netCDF-4/HDF5 files (HDF5 reports truncation itself).

    netCDF-C returns fill values (zeros) for reads past the end of a truncated classic
    file instead of failing, so a half-copied file would train on silence: read_header
    compares this with the file size.
    """
    limit = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(4)
        if head[:3] != b"CDF" or head[3] not in (1, 2, 5):
            return None
        v5 = head[3] == 5
        def big(n: int) -> bytes:  # the header is small: parse it from the stream
            assert 0 <= n <= limit, "a header field larger than the file"
            return fh.read(n)

        def num(n8: bool = v5) -> int:
            return struct.unpack(">Q" if n8 else ">I", big(8 if n8 else 4))[0]

        def name() -> str:
            n = num()
            s = big(n)
            big(-n % 4)
            return s.decode("utf-8", "replace")

        def skip_atts():
            tag, n = num(False), num()
            assert tag in (0, 0x0C), "attribute list"
            for _ in range(n):
                name()
                t, k = num(False), num()
                big(-(-k * _NC_TYPE_SIZE[t] // 4) * 4)

        numrecs = num()
        tag, n = num(False), num()
        dims = []
        for _ in range(n):
            name()
            dims.append(num())
        skip_atts()
        tag, n = num(False), num()
        need, rec = 0, []
        for _ in range(n):
            name()
            ids = [num() for _ in range(num())]
            skip_atts()
            t = num(False)
            num()                                    # vsize (unreliable above 4 GiB)
            begin = num(head[3] != 1)
            size = _NC_TYPE_SIZE[t]
            for d in ids:
                size *= dims[d] if dims[d] else 1    # the record dimension has length 0
            if ids and dims[ids[0]] == 0:
                rec.append((begin, size))
            else:
                need = max(need, begin + size)
        if rec and numrecs and numrecs != 0xFFFFFFFF:
            recsize = sum(s for _, s in rec)
            need = max(need, max(b + (numrecs - 1) * recsize + s for b, s in rec))
        return need


def check_complete(path):
    """DataError when a classic-format file is shorter than its header says (truncated)."""
    try:
        need = classic_min_size(path)
    except (OSError, AssertionError, KeyError, IndexError, struct.error):
        return  # unusual header: netCDF-C's own checks apply
    have = os.path.getsize(path)
    if need is not None and have < need:
        raise DataError(path, f"truncated file: {have:,} bytes, its header describes "
                              f"{need:,} (an interrupted copy or download?)")


FULL_TARGETS = "fullTargetStrings"   # converters: each line's whole transcript (label names)


def full_targets(path, labels: Sequence[str]) -> tuple[dict[int, np.ndarray], int, int] | None:
    """The ``fullTargetStrings`` of a validation/test file converted with a training set's
    alphabet (``rnntrain-data images --labels-from``): {sequence: label indices in
    ``labels``, the model's alphabet} for the lines whose stored targets lack some of their
    text (a label the FILE's alphabet lacks: the model may know it, a fine-tuned model's
    merged alphabet often does), each name the model lacks too given its own index from
    ``len(labels) + 1`` on (never a model output: the blank is ``len(labels)``), plus the
    counts (lines, labels) outside the model's alphabet; None when the file has no such
    variable (or is not a single NetCDF file)."""
    p = str(path)
    if not p.endswith(".nc") or file_problem(p, "data file"):
        return None
    with NC_LOCK, _open(p) as ds:
        if FULL_TARGETS not in ds.variables:
            return None
        rows = ds[FULL_TARGETS][:]
        full = [b"".join(r.compressed() if hasattr(r, "compressed") else r).decode("utf-8")
                for r in np.ma.getdata(rows)]
        own = set(_strings(ds, "labels", p, required=False) or ())
    index = {name: i for i, name in enumerate(labels)}
    unknown: dict[str, int] = {}
    out, lines, count = {}, 0, 0
    for s, text in enumerate(full):
        names = text.split()
        if all(n in own for n in names):   # the stored target is the whole text
            continue
        ids = []
        for n in names:
            if n not in index:
                count += 1
                ids.append(unknown.setdefault(n, len(labels) + 1 + len(unknown)))
            else:
                ids.append(index[n])
        out[s] = np.asarray(ids, np.int64)
        lines += any(n not in index for n in names)
    return out, lines, count


def out_of_alphabet_lines(path) -> int:
    """How many lines of a converted file hold labels its alphabet lacks (the attribute
    ``outOfAlphabetLines``; 0 for any other file)."""
    p = str(path)
    if not p.endswith(".nc") or file_problem(p, "data file"):
        return 0
    with NC_LOCK, _open(p) as ds:
        return int(ds.getncattr("outOfAlphabetLines")) if "outOfAlphabetLines" in \
            ds.ncattrs() else 0
