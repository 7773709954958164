"""sha256 of a checkpoint's model weights: the "the refactor changes no result" check.

    python scripts/weights_digest.py RUN_DIR/checkpoints/last.pt

Hashes every entry of the checkpoint's ``model`` state dict in its stored order (the key,
then the raw bytes of the tensor), so two digests are equal exactly when the weights are
bit for bit equal. A checkpoint of a run that keeps a weight average (``train.average``,
the default config's EMA) also gets the digest of the averaged weights, on a second line.
docs/step.md lists the training commands, the digests before and after the StepRunner
refactor and the machine they were taken on.
"""
from __future__ import annotations

import hashlib
import sys

import torch


def _digest(sd: dict) -> str:
    h = hashlib.sha256()
    for k, v in sd.items():
        h.update(k.encode())
        h.update(v.contiguous().numpy().tobytes())
    return h.hexdigest()


def digests(path: str) -> tuple[str, str | None]:
    """sha256 of the checkpoint's trained weights (its ``model`` part), and of its weight
    average's tensors (its ``average`` part; None without one)."""
    ck = torch.load(path, map_location="cpu", weights_only=True)
    avg = ck.get("average")
    return _digest(ck["model"]), _digest(avg["avg"]) if avg else None


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/weights_digest.py CHECKPOINT.pt [...]")
    for p in sys.argv[1:]:
        model, average = digests(p)
        print(model, p)
        if average is not None:
            print(average, p, "(average)")
