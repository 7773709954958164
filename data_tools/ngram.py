"""``rnntrain-data ngram``: a smoothed back-off n-gram model from text, written as ARPA.

Each line of the text is a sentence, padded as ``<s> w1 .. wn </s>``; tokens are the
whitespace-separated words, or with ``chars`` every character (a space becomes
``space_token``), which gives a label-level model when the characters are the labels.

Smoothing (both interpolated, as SRILM's ``-interpolate`` and KenLM's lmplz, written in
back-off form so that P(w | h) = bow(h) · P(w | h') for every w not seen after h):

- ``kn``: modified Kneser-Ney (Chen & Goodman). The highest order uses counts, lower
  orders the number of distinct left contexts (raw counts for n-grams starting with
  <s>). Three discounts per order from the counts-of-counts n1..n4 of those counts:
  Y = n1 / (n1 + 2 n2), D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3.
  P(w | h) = (a(hw) - D(a(hw))) / a(h·) + γ(h) P(w | h'), γ(h) = (D1 N1(h·) + D2 N2(h·)
  + D3+ N3+(h·)) / a(h·). A tiny text may not give valid discounts: then the order fails
  unless ``discount_fallback`` (0.5, 1, 1.5, as lmplz's --discount_fallback).
- ``wb``: Witten-Bell. P(w | h) = (c(hw) + T(h) P(w | h')) / (c(h·) + T(h)), T(h) = the
  number of distinct words seen after h; γ(h) = T(h) / (c(h·) + T(h)).

Unigrams are interpolated with the uniform distribution over the vocabulary (the words
seen, </s> and <unk>): P(w) = u(w) + γ(ε) / |V|, so <unk> gets γ(ε) / |V|. <s> is never
predicted: log10 P(<s>) = -99 (ARPA's zero).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Literal

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
FALLBACK = (0.5, 1.0, 1.5)


def sentences(path, chars: bool = False, space_token: str = "<space>") -> list[list[str]]:
    from rnntrain.fsutil import read_text
    text = read_text(path, "text file")
    out = []
    for line in text.splitlines():
        if chars:
            toks = [space_token if ch == " " else ch for ch in " ".join(line.split())]
        else:
            toks = line.split()
        if toks:
            out.append(toks)
    if not out:
        raise UserError(f"{path}: no text (every line is empty)")
    return out


def count_ngrams(sents: Iterable[list[str]], order: int) -> list[dict[tuple, int]]:
    """→ counts[k][k-gram] for k = 1..order (index 0 unused); n-grams never end in <s>."""
    counts: list[dict[tuple, int]] = [dict() for _ in range(order + 1)]
    for s in sents:
        toks = [BOS] + list(s) + [EOS]
        for i in range(1, len(toks)):
            for k in range(1, min(order, i + 1) + 1):
                g = tuple(toks[i - k + 1: i + 1])
                counts[k][g] = counts[k].get(g, 0) + 1
    return counts


def kn_discounts(adjusted: dict[tuple, int], order: int, fallback: bool
                 ) -> tuple[float, float, float]:
    n = [0] * 5
    for a in adjusted.values():
        if a <= 4:
            n[a] += 1
    n1, n2, n3, n4 = n[1:]
    try:
        y = n1 / (n1 + 2 * n2)
        d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
        if all(0 < di <= i + 1 for i, di in enumerate(d)):
            return d
    except ZeroDivisionError:
        pass
    if fallback:
        return FALLBACK
    raise UserError(f"modified Kneser-Ney: the text is too small to estimate the {order}-gram "
                    f"discounts (counts-of-counts n1..n4 = {n1}, {n2}, {n3}, {n4}); add "
                    "--discount-fallback (fixed 0.5, 1, 1.5) or use --smoothing wb")


def build(sents: list[list[str]], order: int, smoothing: Literal["kn", "wb"] = "kn",
          discount_fallback: bool = False) -> dict[int, dict[tuple, tuple[float, float]]]:
    """→ ngrams[k][k-gram] = (log10 P, log10 bow) for an ARPA file."""
    if order < 1:
        raise UserError(f"--order {order}: must be at least 1")
    counts = count_ngrams(sents, order)
    # the statistic each order is smoothed with: counts at the top (and for Witten-Bell
    # everywhere), distinct left contexts below (raw counts where the n-gram starts at <s>)
    a: list[dict[tuple, int]] = [dict() for _ in range(order + 1)]
    a[order] = dict(counts[order])
    for k in range(order - 1, 0, -1):
        if smoothing == "wb":
            a[k] = dict(counts[k])
            continue
        left: dict[tuple, int] = defaultdict(int)
        for g in counts[k + 1]:
            left[g[1:]] += 1
        a[k] = {g: (c if g[0] == BOS else left.get(g, c)) for g, c in counts[k].items()}
    vocab = sorted({g[0] for g in counts[1]} | {EOS, UNK})
    prob: list[dict[tuple, float]] = [dict() for _ in range(order + 1)]
    gamma: list[dict[tuple, float]] = [dict() for _ in range(order + 1)]
    for k in range(1, order + 1):
        by_ctx: dict[tuple, list[tuple[tuple, int]]] = defaultdict(list)
        for g, c in a[k].items():
            by_ctx[g[:-1]].append((g, c))
        disc = kn_discounts(a[k], k, discount_fallback) if smoothing == "kn" else None
        for h, items in by_ctx.items():
            total = sum(c for _, c in items)
            if disc is not None:
                nd = [sum(1 for _, c in items if min(c, 3) == i) for i in (1, 2, 3)]
                g_h = sum(d * m for d, m in zip(disc, nd)) / total
                u = {g: (c - disc[min(c, 3) - 1]) / total for g, c in items}
            else:
                types = len(items)
                g_h = types / (total + types)
                u = {g: c / (total + types) for g, c in items}
            gamma[k - 1][h] = g_h
            for g, ug in u.items():
                # the suffix of a counted n-gram is counted one order down (same position)
                lower = (1.0 / len(vocab)) if k == 1 else prob[k - 1][g[1:]]
                prob[k][g] = ug + g_h * lower
    # <unk> and other vocabulary never seen as unigram events: the uniform share only
    for w in vocab:
        if (w,) not in prob[1]:
            prob[1][(w,)] = gamma[0].get((), 1.0) / len(vocab)
    out: dict[int, dict[tuple, tuple[float, float]]] = {}
    for k in range(1, order + 1):
        out[k] = {}
        grams = sorted(prob[k])
        if k == 1:
            grams = [(BOS,)] + [g for g in grams if g != (BOS,)]
        for g in grams:
            lp = -99.0 if g == (BOS,) else math.log10(prob[k][g])
            bw = gamma[k].get(g) if k < order else None  # γ of g as a context
            out[k][g] = (lp, math.log10(bw) if bw else 0.0)
    return out


def write_arpa(ngrams: dict[int, dict[tuple, tuple[float, float]]], path) -> None:
    order = max(ngrams)
    lines = ["\\data\\"] + [f"ngram {k}={len(ngrams[k])}" for k in range(1, order + 1)] + [""]
    for k in range(1, order + 1):
        lines.append(f"\\{k}-grams:")
        for g, (lp, bw) in ngrams[k].items():
            has_bow = k < order and bw != 0.0
            lines.append(f"{lp:.7g}\t{' '.join(g)}" + (f"\t{bw:.7g}" if has_bow else ""))
        lines.append("")
    lines.append("\\end\\")
    atomic_write(path, "\n".join(lines) + "\n")  # the whole model or nothing
