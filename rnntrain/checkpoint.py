"""Checkpoints: written atomically, loaded without running code.

A checkpoint is a dict of tensors and plain values saved with ``torch.save`` and loaded
with ``torch.load(weights_only=True)``: a file from a stranger cannot execute code.
Writing goes to a temporary file in the same folder, which is fsync'd and renamed over the
target, so a crash at any moment leaves either the old or the new file, never half a file.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .errors import UserError

FORMAT_VERSION = 1


def save_atomic(obj: dict, path: Path):
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load(path) -> dict:
    """Load and check a checkpoint; a clear UserError if it is not one of ours."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, or holds code objects
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200]})") from None
    if not isinstance(ck, dict) or "format" not in ck:
        raise UserError(f"{path}: not an rnntrain checkpoint")
    if ck["format"] != FORMAT_VERSION:
        raise UserError(f"{path}: checkpoint format {ck['format']}, this rnntrain reads "
                        f"format {FORMAT_VERSION}")
    return ck


_STEP = re.compile(r"step-(\d+)\.pt$")


def step_checkpoints(folder: Path) -> list[Path]:
    """``step-*.pt`` files, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.search(p.name))]
    return [p for _, p in sorted(found)]


def prune(folder: Path, keep_last: int):
    """Remove all but the newest ``keep_last`` step checkpoints (after a new one is complete)."""
    for p in step_checkpoints(folder)[:-keep_last]:
        p.unlink(missing_ok=True)
