"""What a hypothesis is made of: its CTC alignment, each label's frames, its confidence.

Every hypothesis (best path, beam search, each n-best entry) is aligned to the network's
output by the **Viterbi CTC forced alignment**: the single most probable frame path
(labels and blanks, T frames) that collapses to the hypothesis. On that path label j
occupies a run of frames ``[start_j, end_j)`` (end exclusive; blank frames between labels
belong to no label). For best-path decoding the argmax path is that alignment already
(the most probable path of all collapses to its own hypothesis), so no search runs.

**Confidence** of label j (a probability in (0, 1]):

    conf_j = max over t in [start_j, end_j) of  softmax(log p_t / T)[l_j]

the largest frame posterior of the label over the frames the alignment gives it (kraken's
and Calamari's per-character figure, on the forced alignment rather than the greedy
runs), after temperature scaling by T (``temperature``, 1 = the network's own posteriors;
a calibrated model stores the T fitted on its validation set: ``calibrate.py``).
Temperature scaling does not change any frame's argmax, nor the alignment (every path's
score scales by 1/T plus a per-frame constant), so hypotheses and spans stay the same.

Shapes: log_probs (T, C) log-softmax outputs of one utterance, blank = its class index;
a hypothesis is a list of S label indices.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Alignment:
    """One hypothesis on the frames: per-label spans, peaks and confidences."""
    starts: list[int]       # first model output frame of each label (S,)
    ends: list[int]         # one past its last frame (S,): frames [start, end) are its own
    peaks: list[int]        # the frame of the span where the label is most probable (S,)
    confidences: list[float]  # conf_j as in the module docstring (S,)


def path_positions(path: np.ndarray, blank: int) -> np.ndarray:
    """A frame path (T,) of class indices → the label position of each frame (T,) int64:
    j for the frames of the hypothesis' j-th label, -1 for blank frames."""
    path = np.asarray(path)
    new = np.ones(len(path), bool)
    new[1:] = path[1:] != path[:-1]
    new &= path != blank
    pos = np.cumsum(new) - 1
    return np.where(path != blank, pos, -1).astype(np.int64)


def viterbi_positions(log_probs: np.ndarray, hyp: list[int], blank: int) -> np.ndarray:
    """The Viterbi CTC alignment of ``hyp`` with log_probs (T, C) → label position per
    frame (T,) int64 (-1: blank). Ties go to the earlier state (stay, then advance)."""
    lp = np.asarray(log_probs, np.float64)
    T, S = len(lp), len(hyp)
    if S == 0:
        return np.full(T, -1, np.int64)
    ext = np.full(2 * S + 1, blank)
    ext[1::2] = hyp
    n = len(ext)
    # a label state may be entered from two states back unless it repeats the label there
    skip = np.zeros(n, bool)
    skip[3::2] = np.asarray(hyp[1:]) != np.asarray(hyp[:-1])
    delta = np.full(n, -np.inf)
    delta[:2] = lp[0, ext[:2]]
    back = np.zeros((T, n), np.int8)
    emit = lp[:, ext]                                        # (T, n)
    cols = np.arange(n)
    for t in range(1, T):
        one = np.concatenate([[-np.inf], delta[:-1]])
        two = np.where(skip, np.concatenate([[-np.inf, -np.inf], delta[:-2]]), -np.inf)
        cand = np.stack([delta, one, two])
        back[t] = np.argmax(cand, axis=0)
        delta = cand[back[t], cols] + emit[t]
    s = n - 1 if delta[n - 1] >= delta[n - 2] else n - 2
    assert np.isfinite(delta[s]), "hypothesis needs more frames than the utterance has"
    pos = np.empty(T, np.int64)
    for t in range(T - 1, -1, -1):
        pos[t] = s // 2 if s % 2 == 1 else -1
        s -= int(back[t, s])
    return pos


def temper(log_probs: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """log softmax(log_probs / T) over the last axis, float64 (T = 1: unchanged)."""
    lp = np.asarray(log_probs, np.float64)
    if temperature == 1.0:
        return lp
    z = lp / temperature
    m = z.max(axis=-1, keepdims=True)
    return z - (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))


def align(log_probs: np.ndarray, hyp: list[int], blank: int, temperature: float = 1.0,
          positions: np.ndarray | None = None) -> Alignment:
    """Spans, peaks and confidences of ``hyp`` (see the module docstring). ``positions``:
    a label position per frame already known (best path: ``path_positions`` of the argmax
    path), else the Viterbi alignment is computed."""
    lp = np.asarray(log_probs)
    if positions is None:
        positions = viterbi_positions(lp, hyp, blank)
    S = len(hyp)
    if S == 0:
        return Alignment([], [], [], [])
    frames = np.flatnonzero(positions >= 0)
    pos = positions[frames]
    assert len(frames) and pos[-1] == S - 1 and np.all(np.diff(pos) >= 0), \
        "the alignment does not cover the hypothesis"
    first = np.searchsorted(pos, np.arange(S), side="left")
    last = np.searchsorted(pos, np.arange(S), side="right")
    starts = frames[first]
    ends = frames[last - 1] + 1
    assert np.all(ends - starts == last - first), "a label's frames are not one run"
    own = lp[frames, np.asarray(hyp)[pos]]                  # log p_t(l_j) on its frames
    # the peak: first frame of the span with the largest log-probability of its label
    peaks, conf = [], []
    tl = temper(lp[frames], temperature)[np.arange(len(frames)), np.asarray(hyp)[pos]]
    for j in range(S):
        a, b = first[j], last[j]
        peaks.append(int(frames[a + int(np.argmax(own[a:b]))]))
        conf.append(float(np.exp(tl[a:b].max())))
    return Alignment(starts.tolist(), ends.tolist(), peaks, conf)


def ctc_log_prob(log_probs: np.ndarray, hyp: list[int], blank: int) -> float:
    """log P_ctc(hyp | x): the CTC forward algorithm over every alignment of ``hyp``."""
    lp = np.asarray(log_probs, np.float64)
    T, S = len(lp), len(hyp)
    ext = np.full(2 * S + 1, blank)
    ext[1::2] = hyp
    n = len(ext)
    skip = np.zeros(n, bool)
    if S > 1:
        skip[3::2] = np.asarray(hyp[1:]) != np.asarray(hyp[:-1])
    alpha = np.full(n, -np.inf)
    alpha[:min(2, n)] = lp[0, ext[:2]]
    one, two = np.full(n, -np.inf), np.full(n, -np.inf)
    for t in range(1, T):
        one[1:] = alpha[:-1]
        two[2:] = alpha[:-2]
        two[~skip] = -np.inf
        alpha = np.logaddexp(np.logaddexp(alpha, one), two) + lp[t, ext]
    return float(np.logaddexp(alpha[-1], alpha[-2]) if n > 1 else alpha[-1])
