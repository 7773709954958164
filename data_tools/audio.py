"""Audio (WAV, FLAC, OGG, ...) or arrays (.npy) listed in a LIST.tsv → normalised RNNLIB NetCDF.

LIST.tsv: one utterance per line, ``path<TAB>transcript``; the transcript is a space-
separated list of label names (it may be empty); relative paths are relative to the list's
folder; blank lines and lines starting with ``#`` are skipped. ``seqTags`` are file names.

Normalisation: per-feature mean and standard deviation are computed on the list being
converted (the training list) and saved as JSON next to the output (or ``--save-stats``),
together with the feature settings and the alphabet; ``--stats FILE`` applies saved
statistics instead, so validation and test sets are normalised exactly like training and
share its alphabet and feature settings. The feature settings and statistics are also
written into the output as the global attribute ``rnntrain_frontend`` (``rnntrain.frontend``),
which training copies into its checkpoints so that a model can transcribe raw recordings.

Streaming: two passes over the list (lengths and statistics, then frames), one utterance in
memory at a time; the output is written under a temporary name and renamed at the end.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError, check_regular_file
from rnntrain.data import ncdata
from rnntrain.data.ncdata import NcWriter
from rnntrain.frontend import ATTR as FRONTEND_ATTR, FrontEnd, normalise
from rnntrain.frontend import features as feat
from rnntrain.frontend.audio import read_npy, resample
from rnntrain.fsutil import atomic_write, read_text

STATS_VERSION = 1


@dataclass
class Entry:
    line: int          # 1-based line number in the list
    path: Path
    transcript: list[str]
    tag: str | None = None     # seqTags entry (default: the file name)
    where: str | None = None   # names the entry in errors (default: "LIST line N")
    start: float = 0.0         # seconds: a segment of the file (Kaldi segments)
    end: float | None = None   # seconds; None = to the end of the file
    load: object = None        # () -> (rate, mono signal): audio not in a file (Lhotse)
    rate: int | None = None    # the sample rate, when known without reading (Lhotse)


def read_list(list_path) -> list[Entry]:
    lp = Path(list_path)
    text = read_text(lp, "list file")
    out = [Entry(n, path, text.split()) for n, path, text in list_lines(lp, text)]
    if not out:
        raise UserError(f"{lp}: no utterances listed")
    return out


def list_lines(lp: Path, text: str) -> list[tuple[int, Path, str]]:
    """The entries of a LIST.tsv's text: (line number, path resolved against the list's
    folder, transcript as written); blank lines and ``#`` comments skipped."""
    out = []
    for n, raw in enumerate(text.lstrip("\ufeff").splitlines(), 1):   # (a UTF-8 BOM)
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if "\t" not in raw:
            raise UserError(f"{lp} line {n}: expected 'path<TAB>transcript', got {raw[:80]!r}")
        path, transcript = raw.split("\t", 1)
        p = Path(path.strip())
        out.append((n, p if p.is_absolute() else lp.parent / p, transcript))
    return out


def parse_labels(text: str) -> list[str]:
    """``--labels``: names separated by commas or whitespace, in index order."""
    names = text.replace(",", " ").split()
    if not names or len(set(names)) != len(names):
        raise UserError(f"--labels {text!r}: give distinct label names separated by commas")
    return names


def _where(list_path, e: Entry) -> str:
    return e.where or f"{list_path} line {e.line}: {e.path}"


def _at(list_path, e: Entry) -> str:
    """The prefix of an error about entry ``e`` (the error itself names the file)."""
    return e.where or f"{list_path} line {e.line}"


# ---------------------------------------------------------------- sources


def read_audio(path, start: float = 0.0, end: float | None = None) -> tuple[int, np.ndarray]:
    """Any audio file soundfile (libsndfile) reads — WAV, FLAC, OGG/Vorbis, Opus, ... —
    optionally only [start, end) seconds of it → (rate, mono float64 signal in [-1, 1]).
    Whole WAV files go through scipy (no extra dependency); raises UserError naming the
    file."""
    # a FIFO or a device named in a list (or a Kaldi wav.scp) is refused, never opened
    check_regular_file(path)
    if str(path).lower().endswith(".wav") and not start and end is None:
        return read_wav(path)
    try:
        import soundfile as sf
    except ImportError:
        raise UserError(f"{path}: reading this file needs the soundfile package (pip install "
                        f"soundfile); WAV files are read without it") from None
    try:
        info = sf.info(path)
    except (RuntimeError, TypeError, ValueError) as e:  # sf.LibsndfileError is a RuntimeError
        raise UserError(f"{path}: cannot read as audio ({e})") from None
    a = int(round(start * info.samplerate))
    b = info.frames if end is None else int(round(end * info.samplerate))
    if not 0 <= a < b <= info.frames + int(0.01 * info.samplerate):  # 10 ms of slack
        span = f"{start:.3f}-{'end' if end is None else f'{end:.3f}'} s"
        raise UserError(f"{path}: segment {span} lies outside the file "
                        f"({info.frames / info.samplerate:.3f} s)")
    try:
        x, rate = sf.read(path, start=a, stop=min(b, info.frames), dtype="float64",
                          always_2d=True)
    except (RuntimeError, TypeError, ValueError) as e:
        raise UserError(f"{path}: cannot read as audio ({e})") from None
    return _mono_checked(path, int(rate), x)


def read_wav(path) -> tuple[int, np.ndarray]:
    """→ (rate, mono float64 signal in [-1, 1]). Raises UserError naming the file."""
    import struct
    from scipy.io import wavfile
    check_regular_file(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # odd chunks (LIST/INFO) are skipped anyway
            rate, x = wavfile.read(path)
    except (ValueError, OSError, EOFError, struct.error) as e:
        # struct.error: scipy unpacks a truncated header ("unpack requires a buffer of 16
        # bytes") without checking its length first
        why = f"truncated header ({e})" if isinstance(e, struct.error) else str(e)
        raise UserError(f"{path}: cannot read as WAV ({why})") from None
    return _mono_checked(path, int(rate), x)


def _mono_checked(path, rate: int, x: np.ndarray) -> tuple[int, np.ndarray]:
    if x.dtype == np.uint8:
        x = (x.astype(np.float64) - 128.0) / 128.0
    elif x.dtype.kind == "i":
        x = x.astype(np.float64) / float(2 ** (8 * x.dtype.itemsize - 1))
    elif x.dtype.kind == "f":
        x = x.astype(np.float64)
    else:
        raise UserError(f"{path}: unsupported WAV sample type {x.dtype}")
    if x.ndim == 2:
        x = x.mean(axis=1)  # stereo (or more) → mono
    if x.size == 0:
        raise UserError(f"{path}: audio file has no samples")
    if not np.isfinite(x).all():
        raise UserError(f"{path}: audio file contains NaN or Inf samples")
    return int(rate), x


class AudioSource:
    """Audio files (or Lhotse cuts) → features (FeatureConfig); other sample rates are
    resampled."""

    def __init__(self, cfg: feat.FeatureConfig):
        self.cfg, self.fb = cfg, feat.mel_filterbank(cfg)
        self.size = cfg.size

    def resample(self, rate: int, x: np.ndarray) -> np.ndarray:
        return resample(x, rate, self.cfg.rate)  # the function inference uses too

    def signal(self, path) -> np.ndarray:
        return self.resample(*read_audio(path))

    def features(self, path) -> np.ndarray:
        return feat.compute(self.signal(path), self.cfg, self.fb)

    def entry_features(self, e: Entry) -> np.ndarray:
        if e.load is not None:
            rate, x = e.load()
        else:
            rate, x = read_audio(str(e.path), e.start, e.end)
        return feat.compute(self.resample(rate, x), self.cfg, self.fb)

    def describe(self) -> dict:
        return {"source": "audio", **self.cfg.to_dict()}


class ArraySource:
    """``.npy`` files, each a (T, F) numeric array of frames, used as they are."""

    def __init__(self, size: int | None = None):
        self.size = size

    def features(self, path) -> np.ndarray:
        x = read_npy(path)
        if self.size is None:
            self.size = x.shape[1]
        if x.shape[1] != self.size:
            raise UserError(f"{path}: has {x.shape[1]} features per frame, the first file "
                            f"had {self.size}")
        x = x.astype(np.float32)
        if (bad := ncdata.first_nonfinite_row(x)) is not None:
            raise UserError(f"{path}: NaN or Inf in frame {bad}")
        return x

    def entry_features(self, e: Entry) -> np.ndarray:
        return self.features(str(e.path))

    def describe(self) -> dict:
        return {"source": "arrays", "size": self.size}


# ---------------------------------------------------------------- statistics


class RunningStats:
    """Per-feature mean/variance over frames, in float64 with a shift (no cancellation)."""

    def __init__(self):
        self.n, self.shift, self.s1, self.s2 = 0, None, None, None

    def add(self, x: np.ndarray):
        x = np.asarray(x, dtype=np.float64)
        if self.shift is None:
            self.shift = x.mean(axis=0)
            self.s1 = np.zeros_like(self.shift)
            self.s2 = np.zeros_like(self.shift)
        d = x - self.shift
        self.n += len(x)
        self.s1 += d.sum(axis=0)
        self.s2 += (d * d).sum(axis=0)

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        m = self.s1 / self.n
        var = np.maximum(self.s2 / self.n - m * m, 0.0)
        # a constant feature (e.g. a silent band) keeps unit scale rather than dividing by 0
        std = np.where(var > 1e-12, np.sqrt(var), 1.0)
        return self.shift + m, std


@dataclass
class Stats:
    mean: np.ndarray      # (F,)
    std: np.ndarray       # (F,)
    frames: int
    labels: list[str]
    source: dict          # feature settings (or "arrays") the statistics belong to

    def apply(self, x: np.ndarray) -> np.ndarray:
        return normalise(x, self.mean, self.std)  # the function inference applies too

    def frontend(self) -> FrontEnd:
        """The record written into the .nc file (and from there into checkpoints)."""
        src = dict(self.source)
        kind = src.pop("source", "arrays")
        fc = feat.FeatureConfig(**src) if kind == "audio" else None
        return FrontEnd(kind, len(self.mean), self.mean, self.std, fc)

    def save(self, path):
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, json.dumps({
            "version": STATS_VERSION, "source": self.source, "labels": self.labels,
            "frames": self.frames, "mean": self.mean.tolist(), "std": self.std.tolist()},
            indent=1))

    @classmethod
    def load(cls, path) -> "Stats":
        p = Path(path)
        text = read_text(p, "statistics file")
        try:
            d = json.loads(text)
            s = cls(np.asarray(d["mean"], dtype=np.float64), np.asarray(d["std"], dtype=np.float64),
                    int(d["frames"]), list(d["labels"]), dict(d["source"]))
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{p}: not a statistics file written by rnntrain-data ({e})") from None
        if s.mean.shape != s.std.shape or s.mean.ndim != 1 or not (s.std > 0).all():
            raise UserError(f"{p}: malformed mean/std vectors")
        return s


# ---------------------------------------------------------------- conversion


def convert(list_path, out, source, stats_path=None, save_stats=None, labels=None,
            fmt="NETCDF3_64BIT_OFFSET", progress=True, entries: list[Entry] | None = None) -> Stats:
    """Convert the listed utterances into ``out`` (RNNLIB NetCDF); returns the statistics.

    source: AudioSource or ArraySource. stats_path: apply these saved statistics (and their
    alphabet); otherwise compute them on this list and save to save_stats (default
    ``<out>.stats.json``). ``entries``: already parsed (Kaldi data dir, Lhotse cuts);
    ``list_path`` then only names the input in messages.
    """
    from tqdm import tqdm
    entries = read_list(list_path) if entries is None else entries
    if not entries:
        raise UserError(f"{list_path}: no utterances listed")
    given = Stats.load(stats_path) if stats_path else None
    if given is not None:
        if given.source != source.describe() and given.source.get("source") in ("audio",
                                                                                 "kaldi"):
            raise UserError(f"{stats_path}: statistics were computed with features "
                            f"{given.source}, not {source.describe()}")
        if labels is not None and labels != given.labels:
            raise UserError(f"--labels differs from the alphabet saved in {stats_path}")
        labels = given.labels
    if labels is None:
        labels = sorted({t for e in entries for t in e.transcript})
        if not labels:
            raise UserError(f"{list_path}: every transcript is empty; give --labels")
    index = set(labels)
    for e in entries:
        bad = [t for t in e.transcript if t not in index]
        if bad:
            raise UserError(f"{_where(list_path, e)}: transcript token {bad[0]!r} is not in "
                            f"the alphabet ({' '.join(labels[:20])})")

    # pass 1: lengths (and statistics when none are given)
    running = RunningStats()
    lengths = []
    bar = dict(unit="utt", disable=not progress or None, leave=False)
    for e in tqdm(entries, desc="pass 1/2 (lengths, statistics)", **bar):
        try:
            x = source.entry_features(e)
        except UserError as err:
            raise UserError(f"{_at(list_path, e)}: {err}") from None
        lengths.append(len(x))
        if given is None:
            running.add(x)
    if given is None:
        mean, std = running.mean_std()
        stats = Stats(mean, std, running.n, list(labels), source.describe())
        stats.save(save_stats or f"{out}.stats.json")
    else:
        stats = given
        if len(stats.mean) != source.size:
            raise UserError(f"{stats_path}: statistics are for {len(stats.mean)} features, "
                            f"the data has {source.size}")

    # pass 2: normalised frames, one utterance at a time
    tags = [e.tag or e.path.name for e in entries]
    # the front end travels with the data (a global attribute RNNLIB ignores): training
    # copies it into the checkpoint, so the model can transcribe raw recordings later
    with NcWriter(out, labels, source.size, lengths, [" ".join(e.transcript) for e in entries],
                  tags, fmt, attrs={FRONTEND_ATTR: stats.frontend().to_json()}) as w:
        for e, n in zip(tqdm(entries, desc="pass 2/2 (write)", **bar), lengths):
            try:
                x = source.entry_features(e)
            except UserError as err:
                raise UserError(f"{_at(list_path, e)}: {err}") from None
            if len(x) != n:
                raise UserError(f"{_where(list_path, e)}: changed while converting")
            w.append(stats.apply(x))
    return stats


def feature_config(kind: str | None, rate: int | None, mels: int | None, stats_path=None,
                   list_path=None, first: Entry | None = None) -> feat.FeatureConfig:
    """Feature settings from flags, the saved statistics, or (rate) the first listed file."""
    if stats_path:
        src = dict(Stats.load(stats_path).source)
        if src.pop("source", None) != "audio":
            raise UserError(f"{stats_path}: statistics are not for audio features")
        cfg = feat.FeatureConfig(**src)
        for flag, v, have in (("--features", kind, cfg.kind), ("--rate", rate, cfg.rate),
                              ("--mels", mels, cfg.n_mels)):
            if v is not None and v != have:
                raise UserError(f"{flag} {v} differs from {have} saved in {stats_path}")
        return cfg
    if rate is None:  # the first utterance's rate; its errors name it like any other's
        first = first or read_list(list_path)[0]
        try:
            if first.rate is not None:
                rate = first.rate
            elif first.load is not None:
                rate = first.load()[0]
            else:
                rate = read_audio(str(first.path), first.start, first.end)[0]
        except UserError as err:
            raise UserError(f"{_at(list_path, first)}: {err}") from None
    try:
        return feat.FeatureConfig(kind=kind or "fbank", rate=rate, n_mels=mels or 40)
    except ValueError as e:
        raise UserError(str(e)) from None
