"""Calibrating per-label confidences: one temperature, fitted on a validation set.

A confidence is calibrated when, among the labels given confidence c, a fraction c is
correct. The network's own posteriors are usually over-confident; temperature scaling
(Guo et al. 2017) divides the log-probabilities by one number T before the softmax and
picks the T that minimises the negative log-likelihood of per-label correctness on held-
out data. Hypotheses and alignments do not change with T (``align.py``).

``LabelSamples`` holds what a fit needs from each hypothesis label of a validation set:
the log-probability rows of its aligned frames, its class, and whether it is correct (it
matches the reference in a minimal edit alignment: ``score.hyp_correct``). Confidences at
any T are recomputed from those rows exactly as ``align.align`` computes them.

Expected calibration error (ECE): the labels are put in ``ECE_BINS`` equal-width bins of
confidence; ECE = sum over bins of (labels in the bin / all labels) × |accuracy of the
bin - mean confidence of the bin|.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rnntrain.decode.align import align, viterbi_positions
from rnntrain.decode.score import hyp_correct

ECE_BINS = 15
T_RANGE = (0.05, 20.0)     # temperatures searched (log-spaced, then refined)
MAX_LABELS = 200_000       # labels kept for a fit (the first ones; bounds memory)


def ece(conf: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error of confidences (N,) against correctness (N,) bool."""
    conf = np.asarray(conf, np.float64)
    correct = np.asarray(correct, np.float64)
    if not len(conf):
        return 0.0
    b = np.minimum((conf * bins).astype(np.int64), bins - 1)
    n = np.bincount(b, minlength=bins)
    gap = np.abs(np.bincount(b, correct, bins) - np.bincount(b, conf, bins))
    return float(gap.sum() / n.sum())


def nll(conf: np.ndarray, correct: np.ndarray) -> float:
    """Mean negative log-likelihood of correctness (N,) under confidences (N,)."""
    c = np.clip(np.asarray(conf, np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(correct, bool)
    return float(-np.where(y, np.log(c), np.log1p(-c)).mean()) if len(c) else 0.0


@dataclass
class LabelSamples:
    """Hypothesis labels of a validation set, as a temperature fit needs them."""
    rows: list = field(default_factory=list)     # (R_i, C) float32 log-probs of aligned frames
    seg: list = field(default_factory=list)      # (R_i,) label index (within all labels) per row
    cls: list = field(default_factory=list)      # (S_i,) class of each label
    correct: list = field(default_factory=list)  # (S_i,) bool
    count: int = 0                               # labels so far

    def add(self, log_probs: np.ndarray, hyp: list[int], ref, blank: int,
            positions: np.ndarray | None = None):
        """One utterance: log_probs (T, C), its hypothesis and reference label lists."""
        if not hyp or self.count >= MAX_LABELS:
            return
        pos = viterbi_positions(log_probs, hyp, blank) if positions is None else positions
        frames = np.flatnonzero(pos >= 0)
        self.rows.append(np.asarray(log_probs, np.float32)[frames])
        self.seg.append(pos[frames] + self.count)
        self.cls.append(np.asarray(hyp, np.int64))
        self.correct.append(hyp_correct(list(ref), list(hyp)))
        self.count += len(hyp)

    def arrays(self):
        """(rows (R, C), first row of each label (S,), row class (R,), correct (S,))."""
        rows = np.concatenate(self.rows) if self.rows else np.zeros((0, 1), np.float32)
        seg = np.concatenate(self.seg) if self.seg else np.zeros(0, np.int64)
        cls = np.concatenate(self.cls) if self.cls else np.zeros(0, np.int64)
        correct = np.concatenate(self.correct) if self.correct else np.zeros(0, bool)
        starts = np.searchsorted(seg, np.arange(len(cls)))
        return rows, starts, cls[seg], correct

    def confidences(self, temperature: float, arrays=None) -> np.ndarray:
        """(S,) confidences at ``temperature``, as ``align.align`` gives them."""
        rows, starts, row_cls, _ = arrays if arrays is not None else self.arrays()
        if not len(starts):
            return np.zeros(0)
        z = rows.astype(np.float64) / temperature
        m = z.max(1)
        own = z[np.arange(len(z)), row_cls] - m - np.log(np.exp(z - m[:, None]).sum(1))
        return np.exp(np.maximum.reduceat(own, starts))


@dataclass
class Calibration:
    """The fitted temperature and what it did (stored in the checkpoint)."""
    temperature: float      # T: confidences are softmax(log p / T) (1 = uncalibrated)
    ece_before: float       # ECE at T = 1 on the fitting set
    ece_after: float        # ECE at the fitted T on the same set
    nll_before: float       # mean NLL of per-label correctness at T = 1
    nll_after: float        # ... at the fitted T
    labels: int             # hypothesis labels the fit used
    accuracy: float         # fraction of them that are correct
    data: str = ""          # the data it was fitted on
    decoder: str = "best path"  # the hypotheses' decoder

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def describe(self) -> str:
        return (f"temperature {self.temperature:.3f}: expected calibration error "
                f"{self.ece_before:.4f} -> {self.ece_after:.4f}, NLL {self.nll_before:.4f}"
                f" -> {self.nll_after:.4f} ({self.labels} labels, {self.accuracy:.1%} "
                f"correct{', ' + self.data if self.data else ''})")


def fit_temperature(samples: LabelSamples, data: str = "",
                    decoder: str = "best path") -> Calibration:
    """The T in ``T_RANGE`` minimising the NLL of correctness: a log-spaced grid, then a
    golden-section search around its best point."""
    arrays = samples.arrays()
    correct = arrays[3]
    if not len(correct):  # no label was emitted: nothing to fit
        return Calibration(1.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, data, decoder)
    if correct.all() or not correct.any():
        # every label right (a few held-out lines of a fine-tuning) or every one wrong: the
        # NLL falls toward the range's end (T = 0.05 made every confidence 1.0), which says
        # nothing of the model; T = 1 keeps its own posteriors
        c = samples.confidences(1.0, arrays)
        e, n = ece(c, correct), nll(c, correct)
        return Calibration(1.0, e, e, n, n, int(len(correct)), float(correct.mean()), data,
                           decoder)

    def loss(log_t: float) -> float:
        return nll(samples.confidences(float(np.exp(log_t)), arrays), correct)

    lo, hi = np.log(T_RANGE[0]), np.log(T_RANGE[1])
    grid = np.linspace(lo, hi, 25)
    vals = [loss(g) for g in grid]
    k = int(np.argmin(vals))
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    g = (np.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(30):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    best = min([(vals[k], grid[k]), (fc, c), (fd, d)])[1]
    t = float(np.exp(best))
    before, after = samples.confidences(1.0, arrays), samples.confidences(t, arrays)
    return Calibration(t, ece(before, correct), ece(after, correct), nll(before, correct),
                       nll(after, correct), int(len(correct)),
                       float(correct.mean()) if len(correct) else 0.0, data, decoder)


def confidences(log_probs: np.ndarray, hyp: list[int], blank: int,
                temperature: float = 1.0) -> list[float]:
    """Per-label confidences of one hypothesis (``align.align``'s)."""
    return align(log_probs, hyp, blank, temperature).confidences
