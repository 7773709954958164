"""Cross-validation folds: which sequences of the one training file a fold holds.

``data.folds = K`` (K >= 2) with ``data.fold = i`` trains on the sequences of every fold
but i and validates on fold i (``rnntrain crossfold`` runs i = 0 .. K-1). A fold is a
subset of sequence indices, applied as a mask over the dataset's metadata (the epoch plan
leaves the other sequences out), so no data is copied or rewritten.

The assignment is a pure function of (number of sequences, K, seed): a seeded permutation
of the indices dealt round-robin, so fold sizes differ by at most one and every fold's
run, resumed or not, on any rank count, sees the same split.
"""
from __future__ import annotations

import numpy as np


def fold_of(num_seqs: int, folds: int, seed: int) -> np.ndarray:
    """(N,) int64: the fold (0 .. folds-1) of each sequence index."""
    assert folds >= 2 and num_seqs >= 0, (folds, num_seqs)
    order = np.random.default_rng([seed, 0xF01D]).permutation(num_seqs)
    out = np.empty(num_seqs, np.int64)
    out[order] = np.arange(num_seqs) % folds
    return out


def fold_masks(num_seqs: int, folds: int, fold: int, seed: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """→ (train (N,) bool: every fold but ``fold``, held out (N,) bool: ``fold``)."""
    assert 0 <= fold < folds, (fold, folds)
    held = fold_of(num_seqs, folds, seed) == fold
    return ~held, held
