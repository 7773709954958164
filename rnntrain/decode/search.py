"""Decoding CTC outputs: label sequences from per-frame log-probabilities.

Best path (greedy): argmax per frame, merge repeats, drop blanks. Prefix beam search:
the standard CTC prefix search over blank/non-blank ending probabilities.
"""
from __future__ import annotations

import numpy as np


def collapse(path: np.ndarray, blank: int) -> list[int]:
    """Frame labels (T,) → label sequence: merge repeats, then drop blanks."""
    path = np.asarray(path)
    keep = np.ones(len(path), bool)
    keep[1:] = path[1:] != path[:-1]
    return [int(p) for p in path[keep] if p != blank]


def best_path(log_probs: np.ndarray, length: int, blank: int) -> list[int]:
    """log_probs: (T, C) for one sequence → label indices."""
    return collapse(np.argmax(log_probs[:length], axis=1), blank)


def best_path_batch(path: np.ndarray, lengths: np.ndarray, blank: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Frame argmaxes (T, N) and lengths (N,) → labels (N, L) padded with -1, counts (N,).

    Vectorised over the batch: keep a frame if it differs from the previous one, is not
    blank and lies within the sequence's length.
    """
    path = np.asarray(path)
    T, N = path.shape
    keep = np.ones((T, N), bool)
    keep[1:] = path[1:] != path[:-1]
    keep &= path != blank
    keep &= np.arange(T)[:, None] < np.asarray(lengths)[None, :]
    counts = keep.sum(0)
    out = np.full((N, int(counts.max(initial=0))), -1, np.int64)
    pos = np.cumsum(keep, axis=0) - 1          # (T, N) slot of each kept frame
    t_idx, n_idx = np.nonzero(keep)
    out[n_idx, pos[t_idx, n_idx]] = path[t_idx, n_idx]
    return out, counts


def prefix_beam_search(log_probs: np.ndarray, length: int, blank: int, beam: int = 8) -> list[int]:
    """log_probs: (T, C) for one sequence → most probable label sequence (approximately)."""
    return prefix_beam_nbest(log_probs, length, blank, beam, 1)[0][0]


def prefix_beam_nbest(log_probs: np.ndarray, length: int, blank: int, beam: int = 8,
                      n: int = 1) -> list[tuple[list[int], float]]:
    """The final beam's ``n`` best (labels, log P) pairs, best first (ties: beam order);
    log P sums the prefix's blank- and non-blank-ending probabilities."""
    lp = np.asarray(log_probs[:length], dtype=np.float64)
    ninf = -np.inf
    beams = {(): (0.0, ninf)}  # prefix -> (log P ending in blank, log P ending in non-blank)
    for t in range(lp.shape[0]):
        row = lp[t]
        # only labels that could matter: the top ones at this frame
        cand = np.argsort(row)[::-1][:max(beam, 1) + 1]
        nxt: dict[tuple, list[float]] = {}

        def add(prefix, b, nb):
            cur = nxt.setdefault(prefix, [ninf, ninf])
            cur[0], cur[1] = np.logaddexp(cur[0], b), np.logaddexp(cur[1], nb)

        for prefix, (pb, pnb) in beams.items():
            ptot = np.logaddexp(pb, pnb)
            add(prefix, ptot + row[blank], ninf)
            last = prefix[-1] if prefix else None
            for c in cand.tolist():
                if c == blank:
                    continue
                if c == last:
                    add(prefix, ninf, pnb + row[c])           # repeat collapses
                    add(prefix + (c,), ninf, pb + row[c])     # needs a blank between
                else:
                    add(prefix + (c,), ninf, ptot + row[c])
        beams = dict(sorted(nxt.items(), key=lambda kv: -np.logaddexp(*kv[1]))[:beam])
        beams = {k: (v[0], v[1]) for k, v in beams.items()}
    ranked = sorted(beams.items(), key=lambda kv: -np.logaddexp(*kv[1]))[:n]
    return [(list(k), float(np.logaddexp(*v))) for k, v in ranked]


