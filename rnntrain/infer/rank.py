"""What to transcribe next: a user's untranscribed lines ordered by how much the models
disagree on them (``rnntrain rank-lines``).

Active learning for ground truth: a line every model reads alike teaches a fine-tuning
little; a line they read differently is one the next model gets wrong. With several
models (the members of a crossfold folder, or base models fine-tuned from different
starts) the score of a line is the models' **disagreement**: the mean, over every pair of
models, of the edit distance between their two readings divided by the longer reading's
length (0: all read the same text; 1: nothing in common). With one model it is its
**doubt**: 1 minus the mean confidence of the labels it read (calibrated where the model
carries a temperature: ``rnntrain calibrate``); a line it reads as nothing scores 1.
Ties (several models agreeing) are broken by the doubt of the first model.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from rnntrain.errors import UserError
from rnntrain.infer.api import Model
from rnntrain.infer.transcribe import Source, expand


@dataclass
class Ranked:
    path: Path
    score: float              # disagreement (several models) or doubt (one)
    doubt: float              # 1 - the first model's mean confidence
    readings: list[str]       # each model's best path, in the models' order


def disagreement(texts: list[str]) -> float:
    """Mean pairwise normalised edit distance of ``texts`` (module docstring)."""
    from rapidfuzz.distance import Levenshtein
    pairs = list(combinations(texts, 2))
    if not pairs:
        return 0.0
    return sum(Levenshtein.distance(a, b) / max(len(a), len(b), 1) for a, b in pairs) / \
        len(pairs)


def doubt(confidences: list[float]) -> float:
    return 1.0 - sum(confidences) / len(confidences) if confidences else 1.0


def untranscribed(inputs: list[str], include_transcribed: bool = False) -> list[Source]:
    """The image files INPUT names (folders: their images; list files: their rows), less
    those with a ``.gt.txt`` beside them unless ``include_transcribed``."""
    out = []
    for s in expand(inputs):
        if s.kind != "file":
            raise UserError(f"{s.path}: rank-lines reads line images (files, folders or "
                            "lists of them)")
        stem = s.path.name.split(".")[0]
        if not include_transcribed and (s.path.parent / f"{stem}.gt.txt").is_file():
            continue
        out.append(s)
    if not out:
        raise UserError(f"{' '.join(inputs)}: every line already has a .gt.txt (give "
                        "--all to rank them anyway)")
    return out


def rank(models: list[Model], sources: list[Source], threads: int = 1) -> list[Ranked]:
    """Every source scored by ``models`` → most informative first (the score, then the
    first model's doubt, then the path: a fixed order)."""
    def read(src: Source):
        ts = [m.transcribe(src.path) for m in models]
        return Ranked(src.path, 0.0, doubt(ts[0].confidences), [t.text for t in ts])

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="rank") as pool:
        out = list(pool.map(read, sources))
    for r in out:
        r.score = disagreement(r.readings) if len(models) > 1 else r.doubt
    return sorted(out, key=lambda r: (-r.score, -r.doubt, str(r.path)))
