"""Back-off n-gram language models in ARPA format (SRILM, KenLM, ``rnntrain-data ngram``).

``ArpaLM.load(path)`` reads an ARPA file (plain or .gz) of any order. Two views of it:

- ``logprob(word, history)``: the textbook back-off definition on Python dicts,
  P(w | h) = P*(h w) if the n-gram h w is listed, else bow(h) · P(w | h minus its first
  word). Natural logs. Used by the tests and for scoring whole sentences.
- ``tables``: the same model as flat numpy arrays (an n-gram trie in id order, with sorted
  lookup keys) for the compiled beam search (``decode.beam``), where a state is the id of
  the longest history suffix that the model lists.
"""
from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rnntrain.errors import DataError, check_regular_file

LN10 = math.log(10.0)
# log P of a token the model does not know and that has no <unk> entry: ln(10^-10)
UNK_FLOOR = -10.0 * LN10
BOS, EOS, UNK = "<s>", "</s>", "<unk>"


@dataclass
class LMTables:
    """Flat arrays for the compiled search. Id 0 is the empty history (root).

    ``key[i] = parent_id * V + token`` for n-gram i (parent = the n-gram minus its last
    token); ``sorted_keys``/``sorted_ids`` find an n-gram by key with a binary search.
    prob/bow are natural logs; suffix[i] = id of the n-gram minus its first token (or its
    longest listed suffix); order[i] = its length.
    """
    sorted_keys: np.ndarray   # (M,) int64
    sorted_ids: np.ndarray    # (M,) int64
    prob: np.ndarray          # (M,) float64
    bow: np.ndarray           # (M,) float64
    suffix: np.ndarray        # (M,) int64
    order: np.ndarray         # (M,) int64
    vocab_size: int
    max_order: int
    bos_state: int            # id of the <s> unigram (0 if absent)
    eos: int                  # token id of </s> (-1 if absent)
    unk: int                  # token id of <unk> (-1 if absent)


class ArpaLM:
    """An ARPA back-off model: ``ngrams[n][tuple of n words] = (ln P, ln bow)``."""

    def __init__(self, ngrams: dict[int, dict[tuple, tuple[float, float]]], path: str = ""):
        self.ngrams, self.path = ngrams, path
        self.order = max(ngrams) if ngrams else 0
        self.vocab = [w[0] for w in ngrams.get(1, {})]
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self._tables: LMTables | None = None

    @classmethod
    def load(cls, path) -> "ArpaLM":
        path = str(path)
        opener = gzip.open if path.endswith(".gz") else open
        if not os.path.exists(path):
            raise DataError(path, "language model file not found")
        # a FIFO would block the read, /dev/zero never end
        check_regular_file(path, "language model")
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            raise DataError(path, "language model file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(path, f"cannot read the language model ({e})") from None
        return cls(_parse(lines, path), path)

    # -- the reference definition ----------------------------------------------------
    def logprob(self, word: str, history: tuple = ()) -> float:
        """ln P(word | history) by the back-off recursion (history: older words first)."""
        history = tuple(history)[-(self.order - 1):] if self.order > 1 else ()
        if word not in self.index and UNK in self.index:
            word = UNK  # as KenLM: an unknown word is <unk>, with <unk>'s n-grams
        while True:
            e = self.ngrams.get(len(history) + 1, {}).get(history + (word,))
            if e is not None:
                return e[0]
            if not history:
                unk = self.ngrams.get(1, {}).get((UNK,))
                return unk[0] if unk is not None else UNK_FLOOR
            h = self.ngrams.get(len(history), {}).get(history)
            back = h[1] if h is not None else 0.0
            return back + self.logprob(word, history[1:])

    def sentence_logprob(self, words: list[str], eos: bool = True) -> float:
        """ln P(<s> words [</s>]), each word given all the history the order allows."""
        hist: tuple = (BOS,)
        total = 0.0
        for w in list(words) + ([EOS] if eos else []):
            total += self.logprob(w, hist)
            hist = hist + (w if w in self.index or UNK not in self.index else UNK,)
        return total

    # -- the compiled view --------------------------------------------------------------
    @property
    def tables(self) -> LMTables:
        if self._tables is None:
            self._tables = self._build_tables()
        return self._tables

    def token(self, word: str) -> int:
        """Token id of a word (-1 if the model does not list it)."""
        return self.index.get(word, -1)

    def _build_tables(self) -> LMTables:
        V = len(self.vocab)
        ids: dict[tuple, int] = {(): 0}
        keys, prob, bow, order = [-1], [0.0], [0.0], [0]
        for n in range(1, self.order + 1):
            for gram, (p, b) in self.ngrams.get(n, {}).items():
                parent = ids.get(gram[:-1])
                if parent is None:
                    raise DataError(self.path, f"the {n}-gram '{' '.join(gram)}' is listed but "
                                    f"its prefix '{' '.join(gram[:-1])}' is not")
                ids[gram] = len(keys)
                keys.append(parent * V + self.index[gram[-1]])
                prob.append(p)
                bow.append(b)
                order.append(n)
        suffix = [0] * len(keys)
        for gram, i in ids.items():
            s = gram[1:]
            while s not in ids:  # a model pruned without its suffixes: the longest listed
                s = s[1:]
            suffix[i] = ids[s]
        keys_a = np.array(keys, np.int64)
        perm = np.argsort(keys_a[1:], kind="stable") + 1
        return LMTables(keys_a[perm], perm.astype(np.int64), np.array(prob), np.array(bow),
                        np.array(suffix, np.int64), np.array(order, np.int64), V,
                        self.order, ids.get((BOS,), 0), self.token(EOS), self.token(UNK))


def _parse(lines: list[str], path: str) -> dict[int, dict[tuple, tuple[float, float]]]:
    counts: dict[int, int] = {}
    ngrams: dict[int, dict[tuple, tuple[float, float]]] = {}
    section = None
    seen_data = seen_end = False
    for ln, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line == "\\data\\":
            seen_data, section = True, "data"
            continue
        if line == "\\end\\":
            seen_end = True
            break
        if line.startswith("\\") and line.endswith("-grams:"):
            try:
                section = int(line[1:-len("-grams:")])
            except ValueError:
                raise DataError(path, f"line {ln}: bad section header '{line}'") from None
            ngrams[section] = {}
            continue
        if section == "data":
            if line.startswith("ngram "):
                try:
                    n, c = line[6:].split("=")
                    counts[int(n)] = int(c)
                except ValueError:
                    raise DataError(path, f"line {ln}: bad count line '{line}'") from None
            continue
        if not isinstance(section, int):
            continue  # text before \data\ is a comment in ARPA
        parts = line.split()
        n = section
        if len(parts) not in (n + 1, n + 2):
            raise DataError(path, f"line {ln}: a {n}-gram line needs log10 P, {n} words and "
                            f"an optional back-off weight; got '{line}'")
        try:
            p = float(parts[0])
            b = float(parts[n + 1]) if len(parts) == n + 2 else 0.0
        except ValueError:
            raise DataError(path, f"line {ln}: not a number in '{line}'") from None
        if not (math.isfinite(p) and math.isfinite(b)):
            # NaN or Inf would silently change every hypothesis's score
            what, word = ("log10 P", parts[0]) if not math.isfinite(p) else \
                ("the back-off weight", parts[n + 1])
            raise DataError(path, f"line {ln}: {what} is {word} in '{line}'; ARPA needs "
                            "finite numbers (log10 of a zero probability is written -99)")
        if p > 1e-6:
            raise DataError(path, f"line {ln}: log10 P = {parts[0]} > 0, a probability "
                            f"above 1 in '{line}'")
        # -99 is ARPA's log10(0) (e.g. P(<s>)): keep it finite and very small
        ngrams[n][tuple(parts[1:n + 1])] = (p * LN10, b * LN10)
    if not seen_data or not ngrams.get(1):
        raise DataError(path, "not an ARPA language model (no \\data\\ section or no 1-grams)")
    if not seen_end:
        raise DataError(path, "no \\end\\ line: the ARPA file is incomplete (truncated, or "
                              "still being written)")
    for n, c in counts.items():
        if len(ngrams.get(n, {})) != c:
            raise DataError(path, f"the header says {c} {n}-grams, the file lists "
                            f"{len(ngrams.get(n, {}))}")
    return ngrams
