"""``rnntrain-data faker-text``: language-model training text from the generator that
``render-lines`` draws its lines from (Faker's en_US providers, the ``faker`` package, MIT
licence), with other seeds and in larger amounts, minus every line that occurs in the
evaluation sets' LIST.tsv files.

The lines are exactly what ``render-lines --seed S --max-chars M`` would render for the
same seed (same providers, same cut at a word boundary), so a language model built from
them knows the recipe's text distribution. Lines equal (after whitespace normalisation) to
a transcript of an ``--exclude`` list are dropped: the LM then never saw a test or
validation line verbatim, and the drop count is reported. More lines are drawn until
``count`` remain, so the output size does not depend on how many were dropped.
"""
from __future__ import annotations

import os

from rnntrain.errors import UserError


def excluded_lines(lists: list[str]) -> set[str]:
    """The transcripts of LIST.tsv files (``path<TAB>text``), whitespace-normalised."""
    from .images import read_list
    out: set[str] = set()
    for lp in lists:
        out.update(" ".join(it.text.split()) for it in read_list(lp))
    return out


def faker_text(count: int, seed: int, max_chars: int,
               exclude: set[str]) -> tuple[list[str], int]:
    """→ (the first ``count`` Faker lines of the seeded stream that are not in
    ``exclude``, how many lines before the last kept one were dropped)."""
    from .render import faker_lines
    if max_chars < 1:
        raise UserError(f"--max-chars {max_chars}: give a positive number of characters")
    drawn = count
    while True:
        # a longer draw with the same seed starts with the same lines (one seeded stream),
        # so topping up keeps the result reproducible whatever the drop count
        kept, dropped = [], 0
        for s in faker_lines(drawn, seed, max_chars):
            if s in exclude:
                dropped += 1
                continue
            kept.append(s)
            if len(kept) == count:
                return kept, dropped
        drawn += max(count // 10, dropped + 1)


def write_faker_text(out: str, count: int, seed: int, max_chars: int,
                     exclude_lists: list[str]) -> tuple[int, int, int]:
    """Write the lines to ``out`` (one per line) → (lines, dropped, excluded lines known)."""
    from rnntrain.fsutil import atomic_write
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise UserError(f"--out {out}: its folder does not exist")
    exclude = excluded_lines(exclude_lists)
    lines, dropped = faker_text(count, seed, max_chars, exclude)
    assert not exclude.intersection(lines)
    atomic_write(out, "".join(s + "\n" for s in lines))
    return len(lines), dropped, len(exclude)
