"""A synthetic CTC task: label strings rendered as noisy frames of varying duration.

Each label has a random prototype vector; a label occupies 3-8 frames whose features
move from the prototype towards the next label's (co-articulation, so context helps),
plus Gaussian noise; silence gaps (noise only) of 0-3 frames separate labels, at least one
between two equal labels (CTC needs it to tell them apart). The number of labels per
sequence is log-normal, giving a speech-like spread of lengths (long tail).
"""
from __future__ import annotations

import numpy as np

from rnntrain.data.ncdata import NcWriter


def make_sequences(num_seqs: int, num_labels: int, input_size: int, seed: int,
                   mean_labels: float = 6.0, spread: float = 0.6, noise: float = 0.5,
                   prototypes_seed: int = 1234):
    """Yield (frames (T, F) float32, target label indices) for each sequence.

    ``prototypes_seed`` fixes the label → feature mapping, so train and validation sets
    made with different ``seed`` describe the same task.
    """
    protos = np.random.default_rng(prototypes_seed).normal(size=(num_labels, input_size))
    protos *= 2.0 / np.linalg.norm(protos, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    for _ in range(num_seqs):
        n = int(np.clip(round(rng.lognormal(np.log(mean_labels), spread)), 1, 40))
        labels = rng.integers(num_labels, size=n)
        parts = [np.zeros((int(rng.integers(0, 4)), input_size))]
        for j, lab in enumerate(labels):
            dur = int(rng.integers(3, 9))
            nxt = protos[labels[j + 1]] if j + 1 < n else np.zeros(input_size)
            w = np.linspace(0.0, 0.4, dur)[:, None]
            parts.append((1 - w) * protos[lab] + w * nxt)
            gap = int(rng.integers(0, 4))
            if j + 1 < n and labels[j + 1] == lab:
                gap = max(gap, 1)
            parts.append(np.zeros((gap, input_size)))
        x = np.concatenate(parts)
        x += rng.normal(scale=noise, size=x.shape)
        yield x.astype(np.float32), labels


def label_names(num_labels: int) -> list[str]:
    return [f"L{i:02d}" for i in range(num_labels)]


def write_synth(out: str, num_seqs: int = 2000, num_labels: int = 20, input_size: int = 20,
                seed: int = 1, fmt: str = "NETCDF3_64BIT_OFFSET", **kw):
    """Write a synthetic dataset in RNNLIB layout (two passes: lengths, then frames)."""
    names = label_names(num_labels)
    seqs = list(make_sequences(num_seqs, num_labels, input_size, seed, **kw))
    with NcWriter(out, names, input_size, [len(x) for x, _ in seqs],
                  [" ".join(names[i] for i in t) for _, t in seqs],
                  [f"synth_{seed}_{i:06d}" for i in range(num_seqs)], fmt) as w:
        for x, _ in seqs:
            w.append(x)
