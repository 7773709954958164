"""sha256 of a checkpoint's model weights: the "the refactor changes no result" check.

    python scripts/weights_digest.py RUN_DIR/checkpoints/last.pt

Hashes every entry of the checkpoint's ``model`` state dict in its stored order (the key,
then the raw bytes of the tensor), so two digests are equal exactly when the weights are
bit for bit equal. docs/step.md lists the training commands, the digests before and after
the StepRunner refactor and the machine they were taken on.
"""
from __future__ import annotations

import hashlib
import sys

import torch


def weights_digest(path: str) -> str:
    ck = torch.load(path, map_location="cpu", weights_only=True)
    h = hashlib.sha256()
    for k, v in ck["model"].items():
        h.update(k.encode())
        h.update(v.contiguous().numpy().tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/weights_digest.py CHECKPOINT.pt [...]")
    for p in sys.argv[1:]:
        print(weights_digest(p), p)
