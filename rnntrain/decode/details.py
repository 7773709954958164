"""``rnntrain eval --details FILE``: per-sequence alignments and the most frequent
confusions, in the layout of icefall's ``errs-*.txt`` files (labels; with ``--space``, a
second report of words follows).

    %LER 12.50 % [5 / 40, 1 ins, 2 del, 2 sub]
    %SER 30.00 % [3 / 10]
    Errors: 1 insertions, 2 deletions, 2 substitutions, over 40 reference labels (36 correct)
    Search below for sections starting with PER-UTT DETAILS:, SUBSTITUTIONS:, DELETIONS:, INSERTIONS:

    PER-UTT DETAILS: corr or (ref->hyp)
    utt1:	ref=a b c
    utt1:	hyp=a x
    utt1:	a (b->x) (c->*)

    SUBSTITUTIONS: count ref -> hyp
    2   b -> x
    DELETIONS: count ref
    1   c
    INSERTIONS: count hyp
    ...

Alignments are ``score.edit_alignment``'s (a minimal edit, substitutions preferred: the
counts are ``edit_ops``'), ``*`` stands for nothing (a deletion's hypothesis side, an
insertion's reference side). Each section is sorted by count, most frequent first (ties
by name). Labels are the model's label names; names with spaces are not split.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from rnntrain.decode.score import edit_alignment


def details_text(items: Iterable[tuple[str, Sequence[int], Sequence[int]]],
                 labels: Sequence[str], title: str = "", space: int | None = None) -> str:
    """(tag, reference labels, hypothesis labels) per sequence → the report's text.
    ``space``: the word separator's label: a second report, of words (a word is the
    names of its labels joined), follows the labels' one."""
    items = [(tag, [labels[k] for k in ref], [labels[k] for k in hyp])
             for tag, ref, hyp in items]
    text = _report(items, "LER", "labels", title)
    if space is not None:
        sep = labels[space]

        def split(names: list[str]) -> list[str]:
            out, cur = [], []
            for n in names + [sep]:
                if n != sep:
                    cur.append(n)
                elif cur:
                    out.append("".join(cur))
                    cur = []
            return out
        words = [(tag, split(r), split(h)) for tag, r, h in items]
        text += "\n" + _report(words, "WER", "words", (title + ", " if title else "") +
                                f"words (separated by {sep})")
    return text


def _report(items, rate: str, unit: str, title: str) -> str:
    subs, dels, ins = Counter(), Counter(), Counter()
    per_utt, ref_total, seqs, seq_err = [], 0, 0, 0
    for tag, ref, hyp in items:
        marks = []
        err = False
        for r, h in edit_alignment(ref, hyp):
            if r is not None and h is not None and r == h:
                marks.append(r)
                continue
            err = True
            rn = r if r is not None else "*"
            hn = h if h is not None else "*"
            marks.append(f"({rn}->{hn})")
            if r is None:
                ins[hn] += 1
            elif h is None:
                dels[rn] += 1
            else:
                subs[(rn, hn)] += 1
        ref_total += len(ref)
        seqs += 1
        seq_err += err
        per_utt += [f"{tag}:\tref={' '.join(ref)}", f"{tag}:\thyp={' '.join(hyp)}",
                    f"{tag}:\t{' '.join(marks)}"]
    S, D, I = sum(subs.values()), sum(dels.values()), sum(ins.values())
    E = S + D + I
    out = []
    if title:
        out.append(f"# {title}")
    out += [f"%{rate} {100 * E / max(ref_total, 1):.2f} % [{E} / {ref_total}, {I} ins, "
            f"{D} del, {S} sub]",
            f"%SER {100 * seq_err / max(seqs, 1):.2f} % [{seq_err} / {seqs}]",
            f"Errors: {I} insertions, {D} deletions, {S} substitutions, over {ref_total} "
            f"reference {unit} ({ref_total - S - D} correct)",
            "Search below for sections starting with PER-UTT DETAILS:, SUBSTITUTIONS:, "
            "DELETIONS:, INSERTIONS:", "", "PER-UTT DETAILS: corr or (ref->hyp)", *per_utt,
            "", "SUBSTITUTIONS: count ref -> hyp"]
    out += [f"{n}   {r} -> {h}" for (r, h), n in sorted(subs.items(),
                                                         key=lambda kv: (-kv[1], kv[0]))]
    out.append("DELETIONS: count ref")
    out += [f"{n}   {r}" for r, n in sorted(dels.items(), key=lambda kv: (-kv[1], kv[0]))]
    out.append("INSERTIONS: count hyp")
    out += [f"{n}   {h}" for h, n in sorted(ins.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(out) + "\n"
