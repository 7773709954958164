"""Scoring hypotheses against references: edit operations and RNNLIB's error figures."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def edit_ops(ref: list, hyp: list) -> tuple[int, int, int]:
    """Minimum edit between ref and hyp as (substitutions, deletions, insertions).

    Among minimal alignments, prefers substitutions (RNNLIB's convention is the same total).
    """
    n, m = len(ref), len(hyp)
    # cost, then (sub, del, ins) carried along the DP for one optimal path
    prev = [(j, 0, 0, j) for j in range(m + 1)]  # (cost, S, D, I)
    for i in range(1, n + 1):
        cur = [(i, 0, i, 0)]
        for j in range(1, m + 1):
            c, s, d, ins = prev[j - 1]
            sub = (c + (ref[i - 1] != hyp[j - 1]), s + (ref[i - 1] != hyp[j - 1]), d, ins)
            c, s, d, ins = prev[j]
            dele = (c + 1, s, d + 1, ins)
            c, s, d, ins = cur[j - 1]
            insr = (c + 1, s, d, ins + 1)
            cur.append(min(sub, dele, insr, key=lambda x: x[0]))
        prev = cur
    _, s, d, i = prev[m]
    return s, d, i


@dataclass
class ErrorCounts:
    """Accumulated label errors over sequences; ``ler`` = (S + D + I) / reference labels."""
    sub: int = 0
    dels: int = 0
    ins: int = 0
    ref_labels: int = 0
    seqs: int = 0
    seq_errors: int = 0
    loss_sum: float = 0.0
    frames: int = 0
    skipped: int = 0

    def add(self, ref: list, hyp: list):
        s, d, i = edit_ops(ref, hyp)
        self.sub, self.dels, self.ins = self.sub + s, self.dels + d, self.ins + i
        self.ref_labels += len(ref)
        self.seqs += 1
        self.seq_errors += int(s + d + i > 0)

    def as_array(self) -> np.ndarray:
        return np.array([self.sub, self.dels, self.ins, self.ref_labels, self.seqs,
                         self.seq_errors, self.loss_sum, self.frames, self.skipped], np.float64)

    @classmethod
    def from_array(cls, a) -> "ErrorCounts":
        a = [float(x) for x in a]
        return cls(*[int(x) for x in a[:6]], a[6], int(a[7]), int(a[8]))

    def summary(self) -> dict:
        ref = max(self.ref_labels, 1)
        return {
            "ler": (self.sub + self.dels + self.ins) / ref,
            "sub": self.sub / ref, "del": self.dels / ref, "ins": self.ins / ref,
            "seq_error": self.seq_errors / max(self.seqs, 1),
            "loss": self.loss_sum / max(self.seqs, 1),
            "seqs": self.seqs, "skipped": self.skipped, "ref_labels": self.ref_labels,
        }
