"""Speech features with numpy/scipy: log-mel filterbank and MFCC (13 + Δ + ΔΔ).

Conventions (the usual Kaldi/HTK-style front end):
  pre-emphasis y[n] = x[n] - 0.97 x[n-1] (y[0] = x[0]) on the whole signal; frames of 25 ms
  every 10 ms, Hamming window, zero-padded to the next power of two (n_fft); power spectrum
  |X[k]|^2; triangular mel filters (HTK mel scale 2595 log10(1 + f/700)) equally spaced in
  mel between fmin and fmax (default 0 and the Nyquist frequency), each peaking at 1 at
  its centre; log of the filter energies (floored at 1e-10). MFCC: orthonormal DCT-II of
  the log-mel energies, coefficients 0-12, then Δ and ΔΔ by the regression formula over
  ±2 frames (edges repeat the first/last frame).

Shapes: signal (S,) float; frames (T, W); power (T, n_fft//2 + 1); features (T, F).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("fbank", "mfcc")


@dataclass(frozen=True)
class FeatureConfig:
    kind: str = "fbank"        # "fbank" (log-mel) or "mfcc" (13 + Δ + ΔΔ)
    rate: int = 8000           # sample rate the features are computed at (Hz)
    win_ms: float = 25.0
    hop_ms: float = 10.0
    n_mels: int = 40           # mel bands (MFCC takes its 13 coefficients from these)
    n_ceps: int = 13
    preemph: float = 0.97
    fmin: float = 0.0
    fmax: float = 0.0          # 0 = rate / 2

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown feature kind {self.kind!r}; choose one of {KINDS}")
        if self.rate <= 0 or self.n_mels <= 0 or not 0 < self.n_ceps <= self.n_mels:
            raise ValueError(f"invalid feature settings {self}")

    @property
    def win(self) -> int:
        return int(round(self.rate * self.win_ms / 1000))

    @property
    def hop(self) -> int:
        return int(round(self.rate * self.hop_ms / 1000))

    @property
    def n_fft(self) -> int:
        return 1 << (self.win - 1).bit_length()

    @property
    def size(self) -> int:
        """Feature vector size (inputPattSize)."""
        return self.n_mels if self.kind == "fbank" else 3 * self.n_ceps

    def to_dict(self) -> dict:
        return asdict(self)


def num_frames(num_samples: int, cfg: FeatureConfig) -> int:
    """Frames for a signal of this many samples (a short signal still gives one frame)."""
    return 1 + max(0, -(-(num_samples - cfg.win) // cfg.hop))


def hz_to_mel(f):
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def mel_to_hz(m):
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_edges(cfg: FeatureConfig) -> np.ndarray:
    """(n_mels + 2,) filter edge frequencies in Hz: filter j spans edges[j]..edges[j+2]."""
    fmax = cfg.fmax or cfg.rate / 2
    return mel_to_hz(np.linspace(hz_to_mel(cfg.fmin), hz_to_mel(fmax), cfg.n_mels + 2))


def mel_filterbank(cfg: FeatureConfig) -> np.ndarray:
    """(n_mels, n_fft//2 + 1) triangular weights on the FFT bin frequencies."""
    freqs = np.arange(cfg.n_fft // 2 + 1) * cfg.rate / cfg.n_fft
    e = mel_edges(cfg)
    lo, mid, hi = e[:-2, None], e[1:-1, None], e[2:, None]
    up = (freqs - lo) / (mid - lo)
    down = (hi - freqs) / (hi - mid)
    return np.maximum(0.0, np.minimum(up, down))


def frame_signal(x: np.ndarray, cfg: FeatureConfig) -> np.ndarray:
    """Pre-emphasised, Hamming-windowed frames (T, win); the tail is zero-padded."""
    x = np.asarray(x, dtype=np.float64)
    y = np.empty_like(x)
    if len(x):
        y[0] = x[0]
        y[1:] = x[1:] - cfg.preemph * x[:-1]
    t = num_frames(len(y), cfg)
    need = (t - 1) * cfg.hop + cfg.win
    y = np.pad(y, (0, max(0, need - len(y))))
    idx = np.arange(cfg.win)[None, :] + cfg.hop * np.arange(t)[:, None]
    return y[idx] * np.hamming(cfg.win)[None, :]


def power_spectrum(frames: np.ndarray, cfg: FeatureConfig) -> np.ndarray:
    """(T, win) → (T, n_fft//2 + 1) |rFFT|^2 of the zero-padded frames."""
    spec = np.fft.rfft(frames, n=cfg.n_fft, axis=1)
    return spec.real ** 2 + spec.imag ** 2


def log_mel(x: np.ndarray, cfg: FeatureConfig, fb: np.ndarray | None = None) -> np.ndarray:
    """Signal (S,) → (T, n_mels) log filterbank energies."""
    fb = mel_filterbank(cfg) if fb is None else fb
    return np.log(np.maximum(power_spectrum(frame_signal(x, cfg), cfg) @ fb.T, 1e-10))


def deltas(f: np.ndarray, n: int = 2) -> np.ndarray:
    """(T, F) → (T, F) regression deltas: sum_k k (f[t+k] - f[t-k]) / (2 sum_k k^2)."""
    t = len(f)
    p = np.pad(f, ((n, n), (0, 0)), mode="edge")
    num = sum(k * (p[n + k:n + k + t] - p[n - k:n - k + t]) for k in range(1, n + 1))
    return num / (2 * sum(k * k for k in range(1, n + 1)))


def compute(x: np.ndarray, cfg: FeatureConfig, fb: np.ndarray | None = None) -> np.ndarray:
    """Signal (S,) at cfg.rate → features (T, cfg.size) float32 (not normalised)."""
    lm = log_mel(x, cfg, fb)
    if cfg.kind == "fbank":
        return lm.astype(np.float32)
    # scipy only here: reading a dataset's front-end description (every training start)
    # must not pay its import (~0.3 s)
    from scipy.fft import dct
    c = dct(lm, type=2, norm="ortho", axis=1)[:, :cfg.n_ceps]
    d = deltas(c)
    return np.concatenate([c, d, deltas(d)], axis=1).astype(np.float32)
