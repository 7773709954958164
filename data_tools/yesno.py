"""LIST.tsv files for the YesNo corpus (Kaldi waves_yesno, OpenSLR SLR1).

Each recording holds 8 words; the file name is the transcript: ``1_0_1_1_1_0_1_0.wav`` means
"yes no yes yes yes no yes no". A seeded shuffle splits the 60 recordings into --test
held-out recordings (default 15) and the rest (45), of which --val (default 5) are kept
apart for validation during training: OUT/train.tsv, OUT/val.tsv, OUT/test.tsv.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError

NAME = re.compile(r"^[01](_[01])*\.wav$")
WORDS = {"0": "no", "1": "yes"}


def transcript(name: str) -> str:
    return " ".join(WORDS[c] for c in Path(name).stem.split("_"))


def make_lists(recordings, out, seed: int = 1, test: int = 15, val: int = 5) -> dict[str, Path]:
    root = Path(recordings)
    if not root.is_dir():
        raise UserError(f"{root}: recordings folder not found")
    files = sorted(p for p in root.iterdir() if NAME.match(p.name))
    if len(files) <= test + val:
        raise UserError(f"{root}: {len(files)} YesNo recordings (like 0_1_1_0_0_1_0_1.wav); "
                        f"need more than --test {test} + --val {val}")
    order = np.random.default_rng([seed, 0x7E5]).permutation(len(files))
    parts = {"test": order[:test], "val": order[test:test + val], "train": order[test + val:]}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, idx in parts.items():
        lines = [f"{files[i].resolve()}\t{transcript(files[i].name)}\n" for i in sorted(idx)]
        written[split] = out / f"{split}.tsv"
        written[split].write_text("".join(lines))
    return written
