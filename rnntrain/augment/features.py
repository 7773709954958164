"""Feature-sequence augmentation (speech): speed perturbation and SpecAugment's time warp
as one resampling along time (linear interpolation, vectorised), then frequency masks,
time masks and additive noise. Every draw comes from the generator passed in.

Frames: (T, F) float32 → (T', F); T' = round(T / speed factor). Resampling the features
changes the tempo, not the pitch (Kaldi's speed perturbation resamples the waveform, which
also shifts the spectrum; on log-mel features the tempo change is what remains cheap).
Masked values are set to 0, the mean of normalised features (ESPnet's
``replace_with_zero``).
"""
from __future__ import annotations

import numpy as np

from rnntrain.augment.params import AugmentParams


def warp_positions(t: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """SpecAugment's time warp (ESPnet's): the first c frames, c in [W, T - W), are
    resized to w frames, w in [c - W, c + W], and the other T - c to T - w. → (T,) source
    positions of the output frames (frame centres aligned, as a resize does; the caller
    clips to the sequence)."""
    u = np.arange(t, dtype=np.float64)
    if window < 1 or t <= 2 * window + 1:
        return u
    c = int(rng.integers(window, t - window))
    w = int(rng.integers(c - window, c + window + 1))
    w = min(max(w, 1), t - 1)
    left = (u + 0.5) * (c / w) - 0.5
    right = c + (u - w + 0.5) * ((t - c) / (t - w)) - 0.5
    return np.where(u < w, left, right)


def augment_features(x: np.ndarray, p: AugmentParams, rng: np.random.Generator) -> np.ndarray:
    """x (T, F) float32 → (T', F) float32."""
    t, f = x.shape
    factor = 1.0 + float(rng.uniform(-1.0, 1.0)) * p.speed
    t_out = max(1, int(round(t / factor)))
    pos = warp_positions(t_out, p.time_warp, rng)
    # output frame i covers source time (i + 0.5) * T / T' (frame centres line up)
    src = np.clip((pos + 0.5) * (t / t_out) - 0.5, 0.0, t - 1)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, t - 1)
    w = (src - i0).astype(np.float32)[:, None]
    out = x[i0] * (1.0 - w) + x[i1] * w
    for _ in range(p.freq_masks):
        width = int(rng.integers(0, int(p.freq_mask_width * f) + 1))
        start = int(rng.integers(0, f - width + 1))
        out[:, start:start + width] = 0.0
    for _ in range(p.time_masks):
        width = int(rng.integers(0, int(p.time_mask_width * t_out) + 1))
        start = int(rng.integers(0, t_out - width + 1))
        out[start:start + width] = 0.0
    if p.noise:
        out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(p.noise)
    return out.astype(np.float32, copy=False)
