"""Kaldi feature matrices (``feats.scp`` and the archives it points into) → the source
``audio.convert`` reads, with optional cepstral mean (and variance) normalisation.

Archives are read with kaldiio (binary and text archives, float and double matrices,
compressed matrices of every kind ``copy-feats --compress`` writes):

- ``feats.scp``: ``<utterance-id> <archive>:<offset>[<rows>,<cols>]`` (Kaldi's
  rxspecifier; a file without an offset holds one matrix). Archive paths are taken as
  written, or relative to the data folder when only that exists (as wav.scp paths).
  A piped command (``cmd |``) runs a shell command: refused unless ``allow_pipes``.
- or a bare archive (``--feats FILE.ark``): indexed once (key → offset), then read as
  feats.scp would point into it.

CMVN (``--cmvn``), applied to each utterance before the corpus-wide normalisation that
every converter applies (so the statistics saved for validation sets describe CMVN'd
frames):

- ``none`` (default): the features as they are;
- ``utterance``: the mean of each utterance's own frames is subtracted;
- ``speaker``: the mean over every frame of the speaker's utterances (``utt2spk``; the
  utterances converted, i.e. those with a transcript) is subtracted;
- ``scp``: the statistics Kaldi stored in ``cmvn.scp`` (``compute-cmvn-stats``: keyed by
  speaker when the data folder has utt2spk, else by utterance; a (2, F+1) matrix of sums,
  count and sums of squares), applied as Kaldi's ``apply-cmvn`` does.

``norm_vars`` (``--cmvn-vars``) also divides by the standard deviation of the same frames
(Kaldi's ``apply-cmvn --norm-vars=true``); a feature that is constant over the frames
keeps unit scale. Shapes: a matrix (T, F); statistics (F,).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rnntrain.data import ncdata
from rnntrain.errors import UserError, check_regular_file

from .audio import Entry
from .kaldi import (DataDir, _resolve, _table, _unique, is_pipe, pipe_refused, read_data_dir,
                    tokens)

CMVN_MODES = ("none", "utterance", "speaker", "scp")
VAR_FLOOR = 1e-12  # below this a feature is constant: unit scale (as the corpus statistics)

# <file>[:<offset>][<slice>]: the offset is digits; a slice is Kaldi's [a:b] or [a:b,c:d]
_SPEC = re.compile(r"^(?P<file>.+?)(?::(?P<offset>\d+))?(?P<slice>\[[\d:, ]*\])?$")


@dataclass(frozen=True)
class Matrix:
    """Where one feature matrix is: what ``kaldiio.load_mat`` reads."""
    spec: str                # "FILE:OFFSET[SLICE]", a file, or a command ending in '|'
    file: Path | None        # the archive, checked to be a regular file (None: a command)
    where: str               # names it in errors: "feats.scp line N (utterance 'u')"


def _kaldiio_error(e: Exception) -> str:
    """kaldiio reports a damaged archive by ValueError, struct.error, AssertionError or
    UnicodeDecodeError, often with an empty message: name the kind."""
    first = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}{': ' + first if first else ''}"


def load_matrix(m: Matrix) -> np.ndarray:
    """The (T, F) float64 matrix ``m`` points at; UserError naming the archive."""
    import kaldiio
    if m.file is not None:
        check_regular_file(m.file, "feature archive")  # a FIFO would block, a device never end
    try:
        x = kaldiio.load_mat(m.spec)
    except Exception as e:  # any failure of the reader means the archive is not what it says
        raise UserError(f"{m.spec}: cannot read a Kaldi matrix ({_kaldiio_error(e)})"
                        ) from None
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype.kind not in "fiu":
        raise UserError(f"{m.spec}: a {x.ndim}-D {x.dtype} array, not a (frames, features) "
                        f"matrix")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise UserError(f"{m.spec}: an empty {x.shape[0]}x{x.shape[1]} matrix")
    x = x.astype(np.float64)
    if (bad := ncdata.first_nonfinite_row(x)) is not None:
        raise UserError(f"{m.spec}: NaN or Inf in frame {bad}")
    return x


def read_scp(path: Path, d: Path, allow_pipes: bool, what: str = "matrix",
             key_name: str = "utterance") -> dict[str, Matrix]:
    """A Kaldi script file (feats.scp, cmvn.scp) → key → Matrix, with its lines named."""
    out = {}
    for key, (n, f) in _unique(path, _table(path, 2, f"'<id> <{what}>'")).items():
        spec = " ".join(f[1:])
        where = f"{path} line {n} ({key_name} {key!r})"
        if is_pipe(spec):
            if not allow_pipes:
                raise pipe_refused(f"{path} line {n}", key, spec, "archives (copy-feats ... "
                                   "ark,scp:FILE.ark,FILE.scp)")
            out[key] = Matrix(spec, None, where)
            continue
        if len(f) > 2:
            raise UserError(f"{path} line {n}: expected '<id> <{what}>', got {len(f) - 1} "
                            f"fields after the id")
        g = _SPEC.match(spec)
        file = _resolve(d, g["file"])
        if not file.is_absolute() and not os.path.lexists(file):
            raise UserError(f"{where}: {file} not found from the current folder nor from "
                            f"{d} (Kaldi's paths are relative to the recipe folder: run "
                            f"from there)")
        out[key] = Matrix(f"{file}{':' + g['offset'] if g['offset'] else ''}"
                          f"{g['slice'] or ''}", file, where)
    return out


def index_ark(path: Path) -> dict[str, Matrix]:
    """A bare archive (binary or text) → key → Matrix at the key's offset, in one pass."""
    from kaldiio.matio import read_kaldi, read_token
    check_regular_file(path, "feature archive")
    out: dict[str, Matrix] = {}
    with open(path, "rb") as fd:
        while True:
            n = len(out) + 1
            try:
                key = read_token(fd)
                if key is None:
                    return out
                offset = fd.tell()
                read_kaldi(fd)
            except Exception as e:  # as load_matrix: a damaged archive
                raise UserError(f"{path}: record {n}: cannot read a Kaldi matrix "
                                f"({_kaldiio_error(e)})") from None
            if key in out:
                raise UserError(f"{path}: record {n}: key {key!r} already at record "
                                f"{list(out).index(key) + 1}")
            out[key] = Matrix(f"{path}:{offset}", path,
                              f"{path} record {n} (utterance {key!r})")


def cmvn_from_stats(stats: np.ndarray, norm_vars: bool, where: str
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Kaldi CMVN statistics (2, F+1): [sums, count; sums of squares, 0] → (mean, std or
    None), as apply-cmvn computes them."""
    if stats.ndim != 2 or stats.shape[0] != 2 or stats.shape[1] < 2:
        raise UserError(f"{where}: CMVN statistics must be a 2 x (F+1) matrix, got "
                        f"{'x'.join(map(str, stats.shape))}")
    count = stats[0, -1]
    if not count >= 1:
        raise UserError(f"{where}: CMVN statistics count {count} (no frames)")
    mean = stats[0, :-1] / count
    if not norm_vars:
        return mean, None
    var = stats[1, :-1] / count - mean * mean
    return mean, np.where(var > VAR_FLOOR, np.sqrt(np.maximum(var, VAR_FLOOR)), 1.0)


def frame_stats(x: np.ndarray) -> np.ndarray:
    """(T, F) → Kaldi CMVN statistics (2, F+1) of its frames, in float64."""
    s = np.zeros((2, x.shape[1] + 1))
    s[0, :-1], s[0, -1], s[1, :-1] = x.sum(axis=0), len(x), (x * x).sum(axis=0)
    return s


class KaldiFeatureSource:
    """Kaldi feature matrices → (T, F) frames after CMVN; the ``source`` of
    ``audio.convert`` (its ``describe`` goes into the saved statistics and the .nc front
    end, so a validation set converted with ``--stats`` must use the same CMVN)."""

    def __init__(self, matrices: dict[str, Matrix], size: int, cmvn: str = "none",
                 norm_vars: bool = False, shifts: dict | None = None,
                 group: dict[str, str] | None = None):
        self.matrices = matrices  # utterance id → Matrix
        self.size = size          # features per frame (every matrix is checked)
        self.cmvn, self.norm_vars = cmvn, norm_vars
        self.shifts = shifts or {}  # CMVN key → (mean (F,), std (F,) or None)
        self.group = group or {}    # utterance id → CMVN key (speaker or utterance)

    def raw(self, utt: str) -> np.ndarray:
        x = load_matrix(self.matrices[utt])
        if x.shape[1] != self.size:
            raise UserError(f"{self.matrices[utt].spec}: {x.shape[1]} features per frame, the "
                            f"first matrix has {self.size}")
        return x

    def entry_features(self, e: Entry) -> np.ndarray:
        x = self.raw(e.tag)
        if self.cmvn == "utterance":
            mean, std = cmvn_from_stats(frame_stats(x), self.norm_vars, e.where)
        elif self.cmvn != "none":
            mean, std = self.shifts[self.group[e.tag]]
        else:
            return x.astype(np.float32)
        x = x - mean
        return (x if std is None else x / std).astype(np.float32)

    def describe(self) -> dict:
        return {"source": "kaldi", "size": self.size, "cmvn": self.cmvn,
                "norm_vars": self.norm_vars}


def kaldi_feature_entries(data_dir, units: str = "words", feats=None, cmvn: str = "none",
                          norm_vars: bool = False, allow_pipes: bool = False
                          ) -> tuple[list[Entry], str, KaldiFeatureSource]:
    """A Kaldi data folder's ``text`` (and ``utt2spk``) with its feature matrices
    (``feats.scp``, or ``feats``: another .scp or a bare archive) → (entries in ``text``
    order, a one-line summary, the source to convert them with)."""
    if cmvn not in CMVN_MODES:
        raise UserError(f"--cmvn {cmvn!r}: one of {', '.join(CMVN_MODES)}")
    dd: DataDir = read_data_dir(data_dir, ("text",) if feats else ("feats.scp", "text"))
    d = dd.path
    fp = Path(feats) if feats else d / "feats.scp"
    matrices = (read_scp(fp, d, allow_pipes, "feature matrix") if fp.suffix == ".scp"
                else index_ark(fp))
    entries, keep = [], {}
    for utt, (n, f) in dd.text.items():
        if utt not in matrices:
            raise UserError(f"{d / 'text'} line {n}: utterance {utt!r} is not in {fp}")
        m = keep[utt] = matrices[utt]
        entries.append(Entry(n, m.file or fp, tokens(f[1:], units), tag=utt, where=m.where))
    if not entries:
        raise UserError(f"{d / 'text'}: no utterances")
    first = entries[0]
    try:
        size = load_matrix(keep[first.tag]).shape[1]
    except UserError as err:
        raise UserError(f"{first.where}: {err}") from None
    src = KaldiFeatureSource(keep, size, cmvn, norm_vars)
    if cmvn in ("speaker", "scp"):
        src.group = dd.spk if dd.spk is not None else {u: u for u in keep}
        if cmvn == "speaker" and dd.spk is None:
            raise UserError(f"{d}: --cmvn speaker needs utt2spk (or use --cmvn utterance)")
        src.shifts = (_scp_shifts(d, src, allow_pipes) if cmvn == "scp"
                      else _speaker_shifts(entries, src))
    untranscribed = len(set(matrices) - set(dd.text))
    summary = (f"{len(entries)} utterances"
               + (f", {len(set(dd.spk[e.tag] for e in entries))} speakers" if dd.spk else "")
               + f"; {size} Kaldi features per frame from {fp}"
               + ("" if cmvn == "none" else f", CMVN per {cmvn}" if cmvn != "scp"
                  else f", CMVN from {d / 'cmvn.scp'}")
               + (" (means and variances)" if cmvn != "none" and norm_vars else "")
               + (f"; {untranscribed} without a transcript in text left out"
                  if untranscribed else ""))
    return entries, summary, src


def _speaker_shifts(entries: list[Entry], src: KaldiFeatureSource) -> dict:
    """One pass over the utterances: each speaker's statistics → (mean, std or None)."""
    acc: dict[str, np.ndarray] = {}
    for e in entries:
        try:
            x = src.raw(e.tag)
        except UserError as err:
            raise UserError(f"{e.where}: {err}") from None
        k = src.group[e.tag]
        acc[k] = acc[k] + frame_stats(x) if k in acc else frame_stats(x)
    return {k: cmvn_from_stats(s, src.norm_vars, f"speaker {k!r}") for k, s in acc.items()}


def _scp_shifts(d: Path, src: KaldiFeatureSource, allow_pipes: bool) -> dict:
    """cmvn.scp's statistics for every speaker (or utterance) converted."""
    p = d / "cmvn.scp"
    if not p.exists():
        raise UserError(f"{d}: --cmvn scp needs cmvn.scp (compute-cmvn-stats), or use "
                        f"--cmvn speaker to compute the same statistics from the features")
    table = read_scp(p, d, allow_pipes, "CMVN statistics",
                     "speaker" if src.group and any(k != u for u, k in src.group.items())
                     else "utterance")
    out = {}
    for utt, k in src.group.items():
        if utt not in src.matrices or k in out:
            continue
        if k not in table:
            raise UserError(f"{p}: no statistics for {'speaker' if k != utt else 'utterance'} "
                            f"{k!r} (of utterance {utt!r})")
        m = table[k]
        try:
            stats = load_matrix(m)
        except UserError as err:
            raise UserError(f"{m.where}: {err}") from None
        if stats.shape[1] != src.size + 1:
            raise UserError(f"{m.where}: CMVN statistics for {stats.shape[1] - 1} features, "
                            f"the features have {src.size}")
        out[k] = cmvn_from_stats(stats, src.norm_vars, m.where)
    return out
