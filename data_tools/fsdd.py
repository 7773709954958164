"""Connected-digit utterances built from the Free Spoken Digit Dataset (FSDD).

FSDD file names are ``{digit}_{speaker}_{take}.wav``; takes 0-4 are the official test split,
5-49 train. A string is N random digits (N uniform in --digits) spoken by one speaker, each
a random take of that digit from the split's takes, joined by 30-300 ms gaps of low-level
noise (also before and after), each digit scaled by a random gain and the whole string by
another. Train strings only ever use takes 5-49 and test strings takes 0-4, so no recording
is shared between them; ``--takes`` narrows the range further (e.g. a validation set from
takes 5-9 and a training set from takes 10-49).

Writes OUT/wav/<split>_<seed>_<i>.wav (16-bit, the recordings' rate), OUT/list.tsv
(``path<TAB>digits`` for ``rnntrain-data audio``) and OUT/sources.tsv (the recordings each
string was built from).
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError

SPLIT_TAKES = {"train": (5, 49), "test": (0, 4)}
NAME = re.compile(r"^(\d)_([A-Za-z]+)_(\d+)\.wav$")


def parse_range(text: str, what: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", text)
    if not m:
        raise UserError(f"{what} {text!r}: expected N or A-B")
    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
    if lo > hi:
        raise UserError(f"{what} {text!r}: empty range")
    return lo, hi


def index_recordings(root, takes: tuple[int, int]) -> dict[str, dict[str, list[Path]]]:
    """speaker → digit → recordings whose take is within ``takes`` (sorted, reproducible)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: recordings folder not found")
    out: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for p in sorted(root.iterdir()):
        m = NAME.match(p.name)
        if m and takes[0] <= int(m.group(3)) <= takes[1]:
            out[m.group(2)][m.group(1)].append(p)
    if not out:
        raise UserError(f"{root}: no FSDD recordings ({{digit}}_{{speaker}}_{{take}}.wav) with "
                        f"takes {takes[0]}-{takes[1]}")
    return out


def make_strings(recordings, split: str, count: int, digits: tuple[int, int], seed: int,
                 out, takes: tuple[int, int] | None = None, progress: bool = True) -> Path:
    """Write ``count`` strings; returns the path of list.tsv."""
    from scipy.io import wavfile
    from tqdm import tqdm

    from rnntrain.frontend.audio import read_audio
    lo, hi = SPLIT_TAKES[split]
    takes = takes or (lo, hi)
    if not (lo <= takes[0] and takes[1] <= hi):
        raise UserError(f"--takes {takes[0]}-{takes[1]} is outside the {split} split's takes "
                        f"{lo}-{hi}")
    if count <= 0 or digits[0] < 1:
        raise UserError("--count and --digits must be positive")
    index = index_recordings(recordings, takes)
    speakers = sorted(index)
    out = Path(out)
    (out / "wav").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 0xF5DD])
    cache: dict[Path, tuple[int, np.ndarray]] = {}
    lines, sources = [], []
    for i in tqdm(range(count), desc=f"fsdd {split} strings", unit="utt",
                  disable=not progress or None, leave=False):
        spk = speakers[rng.integers(len(speakers))]
        n = int(rng.integers(digits[0], digits[1] + 1))
        avail = sorted(index[spk])
        seq = [avail[rng.integers(len(avail))] for _ in range(n)]
        picks = [index[spk][d][rng.integers(len(index[spk][d]))] for d in seq]
        rate = None
        parts = []
        noise = 10 ** rng.uniform(-3.5, -2.5)  # background level, about -70 to -50 dBFS
        for p in picks:
            if p not in cache:  # float32: all 3,000 recordings fit in ~40 MB
                r, x = read_audio(str(p))
                cache[p] = r, x.astype(np.float32)
            r, x = cache[p]
            if rate is None:
                rate = r
            elif r != rate:
                raise UserError(f"{p}: sample rate {r} differs from {rate} (same speaker)")
            parts.append(_gap(rng, rate, noise))
            parts.append(x * rng.uniform(0.7, 1.3))
        parts.append(_gap(rng, rate, noise))
        sig = np.concatenate(parts) * rng.uniform(0.5, 1.5)
        pcm = np.clip(np.round(sig * 32767), -32768, 32767).astype(np.int16)
        name = f"{split}_{seed}_{i:05d}.wav"
        wavfile.write(out / "wav" / name, rate, pcm)
        lines.append(f"wav/{name}\t{' '.join(seq)}\n")
        sources.append(f"{name}\t{' '.join(p.name for p in picks)}\n")
    (out / "list.tsv").write_text("".join(lines))
    (out / "sources.tsv").write_text("".join(sources))
    return out / "list.tsv"


def _gap(rng, rate: int, level: float) -> np.ndarray:
    """30-300 ms of low-level Gaussian noise."""
    n = int(rate * rng.uniform(0.03, 0.3))
    return rng.normal(scale=level, size=n)
