"""Reading recordings: WAV, FLAC, OGG (anything libsndfile reads) → mono float64 at a rate.

One function for the converters (``rnntrain-data audio``) and for inference
(``rnntrain transcribe``), so a model sees the same samples in both: soundfile (libsndfile)
decodes, several channels are averaged to mono, another sample rate is resampled with
``scipy.signal.resample_poly`` (a polyphase filter with the exact rational ratio).

Shapes: signal (S,) float64 in [-1, 1].
"""
from __future__ import annotations

import math
import os

import numpy as np

from rnntrain.errors import UserError


def read_audio(path) -> tuple[int, np.ndarray]:
    """→ (sample rate, mono float64 signal). Raises UserError naming the file."""
    import soundfile as sf  # imported here: `rnntrain --help` does not load libsndfile
    path = str(path)
    if not os.path.isfile(path):
        raise UserError(f"{path}: file not found")
    kind = os.path.splitext(path)[1].lstrip(".").upper() or "audio"
    try:
        x, rate = sf.read(path, dtype="float64", always_2d=True)
    except (RuntimeError, OSError, ValueError, EOFError, TypeError) as e:
        # sf.LibsndfileError is a RuntimeError: "Format not recognised", truncated data...
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise UserError(f"{path}: cannot read as {kind} ({why})") from None
    if x.shape[0] == 0:
        raise UserError(f"{path}: {kind} file has no samples")
    short = wav_shortfall(path)
    if short:
        # libsndfile reads what is there: a cut-off recording would be transcribed (or
        # converted) as if it were complete
        raise UserError(f"{path}: truncated WAV file: its data chunk declares {short[0]} "
                        f"bytes, the file holds {short[1]}")
    # several channels → mono, as the converters have always done (the model is mono)
    x = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    if not np.isfinite(x).all():
        raise UserError(f"{path}: {kind} file contains NaN or Inf samples")
    return int(rate), x


def wav_shortfall(path) -> tuple[int, int] | None:
    """(declared, present) bytes of a RIFF WAV data chunk cut short, else None.

    Sizes 0 and 0xFFFFFFFF mean "unknown" (written by a stream that could not seek back)
    and are not a shortfall; other formats (RF64, FLAC, ...) are left to libsndfile."""
    import struct
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if fh.read(4) != b"RIFF":
                return None
            fh.read(4)
            if fh.read(4) != b"WAVE":
                return None
            pos = 12
            while pos + 8 <= size:
                fh.seek(pos)
                cid, n = struct.unpack("<4sI", fh.read(8))
                if cid == b"data":
                    have = size - pos - 8
                    return (n, have) if n not in (0, 0xFFFFFFFF) and n > have else None
                pos += 8 + n + (n & 1)   # chunks are word-aligned
    except (OSError, struct.error):
        return None
    return None


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """(S,) at ``rate`` → (≈ S * target / rate,) at ``target``; unchanged when equal."""
    if rate == target:
        return x
    from scipy.signal import resample_poly
    g = math.gcd(rate, target)
    return resample_poly(x, target // g, rate // g)


def load_signal(path, rate: int) -> np.ndarray:
    """Read ``path`` and bring it to ``rate`` Hz: (S,) float64."""
    r, x = read_audio(path)
    return resample(x, r, rate)


def read_npy(path) -> np.ndarray:
    """A feature array file → (T, F) numeric array (a 1-D file is one feature per frame)."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: file not found")
    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise UserError(f"{path}: cannot read as a .npy array ({e})") from None
    if x.ndim == 1:
        x = x[:, None]   # one feature per frame, as the converter reads it
    if x.ndim != 2 or x.dtype.kind not in "iuf" or len(x) == 0:
        raise UserError(f"{path}: expected a non-empty (frames, features) numeric array, got "
                        f"shape {x.shape} {x.dtype}")
    return x
