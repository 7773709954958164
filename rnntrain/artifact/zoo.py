"""The model zoo: base models a user names instead of giving a path.

A zoo model is two files in a zoo folder, as kraken's and Calamari's model repositories
keep them: ``NAME.pt``, an rnntrain checkpoint that holds the card and the inference
weights (no optimizer: it fine-tunes, it does not resume), and ``NAME.json``, its model
card (``CARD_FIELDS``: what it was trained on and under which licenses, its alphabet and
input geometry, its scores, how and where it was trained). ``rnntrain models`` lists them
and prints a card; a name works wherever a model path does (``transcribe``, ``eval``,
``decode``, ``export``, ``train.init_from``, ``crossfold``, ``finetune``): see
``rnntrain.artifact.paths``.

Folders searched, first match wins: each folder of ``$RNNTRAIN_MODELS`` (``:``-separated:
a lab's own base models), then the zoo that ships inside the package
(``rnntrain/artifact/zoo/``). Nothing is downloaded.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from rnntrain.errors import UserError

SHIPPED = Path(__file__).resolve().parent / "zoo"
ENV = "RNNTRAIN_MODELS"
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

# every card holds these (tests/test_zoo.py fails on a card that lacks one); a dotted name
# is a key inside the field above it
CARD_FIELDS = (
    "name", "title", "summary",
    "file", "file_bytes", "sha256", "weights_dtype",
    "alphabet",                              # the characters it reads, in label order
    "input", "input.height", "input.layout", "input.trim", "input.invert",
    "architecture", "architecture.parameters",
    "data",                                  # [{corpus, lines, split, license, source}]
    "licenses",
    "scores",                                # {set name: {cer, lines, characters, data}}
    "training", "training.command", "training.date", "training.cpu", "training.epochs",
    "training.cpu_seconds", "training.commit",
)


def folders() -> list[Path]:
    """The zoo folders, in search order."""
    extra = [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    return [*extra, SHIPPED]


def names() -> list[str]:
    """Every model name the zoo folders hold (a name shadowed by an earlier folder once)."""
    seen: dict[str, Path] = {}
    for folder in folders():
        if folder.is_dir():
            for card in sorted(folder.glob("*.json")):
                if NAME.match(card.stem) and (folder / f"{card.stem}.pt").is_file():
                    seen.setdefault(card.stem, folder)
    return sorted(seen)


def find(name: str) -> Path | None:
    """The checkpoint of zoo model ``name``, or None when no zoo folder has it."""
    if not NAME.match(name):
        return None
    for folder in folders():
        pt = folder / f"{name}.pt"
        if pt.is_file() and (folder / f"{name}.json").is_file():
            return pt
    return None


def card(name: str) -> dict:
    """Model ``name``'s card (checked: every field of ``CARD_FIELDS`` present)."""
    pt = find(name)
    if pt is None:
        raise UserError(f"{name}: no such model in the zoo ({describe_names()})")
    return read_card(pt.with_suffix(".json"))


def read_card(path: Path) -> dict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable model card ({e})") from None
    missing = missing_fields(d)
    if missing:
        raise UserError(f"{path}: the model card lacks {', '.join(missing)}")
    return d


def missing_fields(d) -> list[str]:
    """The ``CARD_FIELDS`` that card ``d`` lacks (empty values count as missing)."""
    out = []
    for key in CARD_FIELDS:
        v = d
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if v is None or v == "" or v == [] or v == {}:
            out.append(key)
    return out


def describe_names() -> str:
    have = names()
    return f"the zoo has {', '.join(have)}: rnntrain models" if have else \
        "the zoo is empty"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(name: str) -> Path:
    """The checkpoint of ``name`` after checking it is the file its card describes (size
    and SHA-256): a damaged or swapped file is named, not loaded."""
    pt = find(name)
    if pt is None:
        raise UserError(f"{name}: no such model in the zoo ({describe_names()})")
    c = read_card(pt.with_suffix(".json"))
    if pt.stat().st_size != c["file_bytes"] or sha256(pt) != c["sha256"]:
        raise UserError(f"{pt}: not the file its card {pt.with_suffix('.json').name} "
                        f"describes (size or SHA-256 differ): damaged or replaced")
    return pt


def card_text(c: dict) -> str:
    """A card for people: what ``rnntrain models NAME`` prints."""
    lines = [f"{c['name']}: {c['title']}", "", c["summary"], ""]
    inp = c["input"]
    lines.append(f"input: line images scaled to {inp['height']} px high, layout "
                 f"{inp['layout']}, trim {inp['trim']}, invert {inp['invert']}")
    arch = c["architecture"]
    lines.append("network: " + ", ".join(f"{k} {v}" for k, v in arch.items()))
    lines.append(f"file: {c['file']} ({c['file_bytes']:,} bytes, {c['weights_dtype']} "
                 f"weights)")
    lines.append(f"alphabet ({len(c['alphabet'])}): {''.join(c['alphabet'])}")
    lines += ["", "trained on:"]
    for d in c["data"]:
        lines.append(f"  {d.get('corpus')}: {d.get('lines')} lines ({d.get('split', '')}; "
                     f"{d.get('license')}) {d.get('source', '')}".rstrip())
    lines.append(f"licenses: {', '.join(c['licenses'])}")
    if c.get("excluded"):
        lines.append(f"kept out: {c['excluded']}")
    lines += ["", "scores (character error rate, best path):"]
    for k, s in c["scores"].items():
        lines.append(f"  {k}: {100 * s['cer']:.2f} % on {s['lines']} lines "
                     f"({s.get('data', '')})")
    t = c["training"]
    lines += ["", f"trained {t['date']} on {t['cpu']}: {t['epochs']} epochs, "
                  f"{t['cpu_seconds']:,.0f} CPU seconds, commit {t['commit']}",
              f"command: {t['command']}"]
    return "\n".join(lines)
