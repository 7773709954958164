"""Scoring hypotheses against references: edit operations and RNNLIB's error figures.

Edit distances come from rapidfuzz (compiled, releases the GIL). Labels are ints; a word
is a tuple of labels, so word error rates use the same functions on word sequences.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cpdist


def edit_ops(ref: Sequence, hyp: Sequence) -> tuple[int, int, int]:
    """Minimum edit between ref and hyp as (substitutions, deletions, insertions).

    The total S + D + I is the Levenshtein distance (equal to ``edit_ops_reference``'s).
    Ties between minimal alignments are split by a fixed rule: the one with the most
    substitutions (fewest deletions + insertions) counts, so ``ref=ab, hyp=ba`` is 2
    substitutions, not 1 deletion + 1 insertion. (The Python DP's per-cell preference
    agrees on the total but can split a few tied cases differently.)
    """
    s, d, i = edit_ops_batch([ref], [hyp])
    return int(s[0]), int(d[0]), int(i[0])


def edit_ops_batch(refs: Sequence[Sequence], hyps: Sequence[Sequence]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N pairs → (S, D, I) int64 arrays (N,), one compiled call for the whole batch.

    One weighted Levenshtein distance gives all three: with insertion = deletion = M + 1
    and substitution = M (M > every len(ref) + len(hyp)), the cheapest alignment is a
    minimal one (fewest edits E) with the fewest deletions + insertions, and its cost is
    W = M·E + (D + I). Then I - D = len(hyp) - len(ref) fixes D and I.
    """
    n = np.fromiter(map(len, refs), np.int64, len(refs))
    m = np.fromiter(map(len, hyps), np.int64, len(hyps))
    if len(n) == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    M = int((n + m).max()) + 1
    w = cpdist(refs, hyps, scorer=Levenshtein.distance, dtype=np.int64,
               scorer_kwargs={"weights": (M + 1, M + 1, M)})
    e, di = np.divmod(np.asarray(w, np.int64), M)
    d = (di - (m - n)) // 2
    i = d + m - n
    return e - d - i, d, i


def label_errors(refs: Sequence[Sequence], hyps: Sequence[Sequence]) -> np.ndarray:
    """N pairs → Levenshtein distances (N,) int64 in one compiled call (GIL released)."""
    if not len(refs):
        return np.zeros(0, np.int64)
    return np.asarray(cpdist(refs, hyps, scorer=Levenshtein.distance, dtype=np.int64),
                      np.int64)


def padded_as_strings(labels: np.ndarray, lengths: np.ndarray) -> list[str]:
    """(N, L) labels, the first lengths[n] of row n valid → N str keys for rapidfuzz.

    Vectorised (no per-sequence Python): label k becomes code point k + 1 (0 pads: numpy's
    fixed-width unicode drops trailing NULs), the rows are viewed as '<U{L}' strings.
    Comparing the strings compares the label sequences; rapidfuzz is fastest on str.
    """
    labels = np.asarray(labels)
    N = labels.shape[0]
    L = max(int(labels.shape[1]) if labels.ndim == 2 else 0, 1)
    codes = np.zeros((N, L), np.uint32)
    if labels.size:
        valid = np.arange(labels.shape[1])[None, :] < np.asarray(lengths)[:, None]
        codes[:, : labels.shape[1]] = np.where(valid, labels + 1, 0)
    assert codes.max(initial=0) < 0xD800, "label index beyond the 16-bit plane's code points"
    return codes.view(f"<U{L}").ravel().tolist()


def ragged_as_strings(seqs: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
    """N label arrays of any lengths → (N str keys as in ``padded_as_strings``, lengths)."""
    lengths = np.fromiter(map(len, seqs), np.int64, len(seqs))
    L = int(lengths.max(initial=0))
    padded = np.zeros((len(seqs), max(L, 1)), np.int64)
    if L:
        flat = np.concatenate(seqs).astype(np.int64, copy=False)
        rows = np.repeat(np.arange(len(seqs)), lengths)
        cols = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded[rows, cols] = flat
    return padded_as_strings(padded, lengths), lengths


def split_words(labels: Sequence[int], space: int) -> list[tuple]:
    """Labels → words (tuples of labels) split at ``space``; empty words dropped."""
    words, cur = [], []
    for x in labels:
        if x == space:
            if cur:
                words.append(tuple(cur))
            cur = []
        else:
            cur.append(x)
    if cur:
        words.append(tuple(cur))
    return words


def edit_ops_reference(ref: list, hyp: list) -> tuple[int, int, int]:
    """The pure-Python dynamic program (the test oracle for ``edit_ops``'s totals).

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
    """Accumulated label errors over sequences; ``ler`` = (S + D + I) / reference labels.

    With a word separator (``space``), word errors too: ``wer`` = word edit distance /
    reference words, a word being the labels between separators.
    """
    sub: int = 0
    dels: int = 0
    ins: int = 0
    ref_labels: int = 0
    seqs: int = 0
    seq_errors: int = 0
    loss_sum: float = 0.0
    frames: int = 0
    skipped: int = 0
    word_errors: int = 0
    ref_words: int = 0

    def add(self, ref: list, hyp: list, space: int | None = None):
        self.add_batch([ref], [hyp], space)

    def add_batch(self, refs: Sequence[Sequence[int]], hyps: Sequence[Sequence[int]],
                  space: int | None = None):
        """N reference/hypothesis label sequences, scored in one compiled call."""
        s, d, i = edit_ops_batch(refs, hyps)
        self.sub += int(s.sum())
        self.dels += int(d.sum())
        self.ins += int(i.sum())
        self.ref_labels += sum(len(r) for r in refs)
        self.seqs += len(refs)
        self.seq_errors += int(((s + d + i) > 0).sum())
        if space is not None:
            rw = [split_words(r, space) for r in refs]
            hw = [split_words(h, space) for h in hyps]
            self.word_errors += int(label_errors(rw, hw).sum())
            self.ref_words += sum(len(w) for w in rw)

    def add_keys(self, refs: Sequence[str], hyps: Sequence[str], space: int | None = None):
        """Like ``add_batch``, for label sequences given as str keys (``padded_as_strings``,
        ``ragged_as_strings``: label k is code point k + 1): no per-label Python, and words
        are split by ``str.split`` at the separator's code point."""
        s, d, i = edit_ops_batch(refs, hyps)
        self.sub += int(s.sum())
        self.dels += int(d.sum())
        self.ins += int(i.sum())
        self.ref_labels += sum(map(len, refs))
        self.seqs += len(refs)
        self.seq_errors += int(((s + d + i) > 0).sum())
        if space is not None:
            sep = chr(space + 1)
            rw = [[w for w in r.split(sep) if w] for r in refs]
            hw = [[w for w in h.split(sep) if w] for h in hyps]
            self.word_errors += int(label_errors(rw, hw).sum())
            self.ref_words += sum(map(len, rw))

    def merge(self, other: "ErrorCounts"):
        """Add ``other``'s counts (and loss sum) to these."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_array(self) -> np.ndarray:
        return np.array([self.sub, self.dels, self.ins, self.ref_labels, self.seqs,
                         self.seq_errors, self.loss_sum, self.frames, self.skipped,
                         self.word_errors, self.ref_words], np.float64)

    @classmethod
    def from_array(cls, a) -> "ErrorCounts":
        a = [float(x) for x in a]
        return cls(*[int(x) for x in a[:6]], a[6], *[int(x) for x in a[7:11]])

    def summary(self) -> dict:
        ref = max(self.ref_labels, 1)
        out = {
            "ler": (self.sub + self.dels + self.ins) / ref,
            "sub": self.sub / ref, "del": self.dels / ref, "ins": self.ins / ref,
            "seq_error": self.seq_errors / max(self.seqs, 1),
            "loss": self.loss_sum / max(self.seqs, 1),
            "seqs": self.seqs, "skipped": self.skipped, "ref_labels": self.ref_labels,
        }
        if self.ref_words:
            out.update(wer=self.word_errors / self.ref_words, ref_words=self.ref_words)
        return out


def edit_alignment(ref: Sequence, hyp: Sequence) -> list[tuple]:
    """A minimal edit alignment of ref and hyp: a list of (ref item or None, hyp item or
    None) pairs in order; (a, a) correct, (a, b) a substitution, (a, None) a deletion,
    (None, b) an insertion. Among minimal alignments, the one with the most substitutions
    (fewest deletions + insertions), as ``edit_ops`` counts them; remaining ties go to the
    substitution, then the deletion, at the end of the strings."""
    n, m = len(ref), len(hyp)
    # cost[i, j] = (edits, deletions + insertions) for ref[:i] vs hyp[:j], as one integer
    M = n + m + 1
    cost = np.zeros((n + 1, m + 1), np.int64)
    cost[:, 0] = np.arange(n + 1) * (M + 1)
    cost[0, :] = np.arange(m + 1) * (M + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i, j] = min(cost[i - 1, j - 1] + (M if ref[i - 1] != hyp[j - 1] else 0),
                             cost[i - 1, j] + M + 1, cost[i, j - 1] + M + 1)
    out, i, j = [], n, m
    while i or j:
        if i and j and cost[i, j] == cost[i - 1, j - 1] + (M if ref[i - 1] != hyp[j - 1] else 0):
            out.append((ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        elif i and cost[i, j] == cost[i - 1, j] + M + 1:
            out.append((ref[i - 1], None))
            i -= 1
        else:
            out.append((None, hyp[j - 1]))
            j -= 1
    return out[::-1]


def hyp_correct(ref: Sequence, hyp: Sequence) -> np.ndarray:
    """(len(hyp),) bool: is each hypothesis label matched to an equal reference label in
    ``edit_alignment``? (What a per-label confidence predicts.)"""
    out = []
    for r, h in edit_alignment(ref, hyp):
        if h is not None:
            out.append(r is not None and r == h)
    return np.array(out, bool)
