"""Sharded datasets on disk: the manifest written by ``rnntrain-data shard``.

On disk (``DIR/``)::

    manifest.json          written last: a directory without it is not a dataset
    index.npz              per-sequence metadata in global id order (see INDEX_KEYS)
    shard-000/chunk-0000.nc ...   RNNLIB-layout files (RNNLIB itself can read each one)

``manifest.json`` holds the format version, the alphabet, inputPattSize, how shards are
ordered inside (``within``: "sorted" or "shuffle"), and per shard its chunks (file
relative to the manifest, numSeqs, numTimesteps, bytes, sha256). Global sequence ids are
consecutive over shards, then chunks, then rows. ``index.npz`` (its sha256 is in the
manifest) holds the lengths, targets and tags, so plans need no payload reads.

The epoch plans over shards are made in ``rnntrain.data.plan`` (strategy ``sharded``);
``rnntrain.data.dataset.from_manifest`` turns a manifest into a Dataset.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rnntrain.errors import DataError, UserError, check_regular_file, file_problem
from rnntrain.fsutil import verify_file

FORMAT = "rnntrain-manifest"
VERSION = 1
INDEX_KEYS = ("lengths", "target_offsets", "targets", "tags")


def require(obj: dict, key: str, where: str, kind=None):
    """obj[key], which must exist (and be a ``kind``): UserError naming ``where``."""
    if key not in obj:
        raise UserError(f"{where}: missing field '{key}'")
    val = obj[key]
    if kind is not None and not isinstance(val, kind):
        raise UserError(f"{where}: field '{key}' should be {kind.__name__}, got {val!r:.60}")
    return val


def read_manifest(path) -> dict:
    """Parse and check manifest.json (structure only; checksums are verified on load)."""
    path = Path(path)
    check_regular_file(path, "manifest")  # a FIFO would block the read
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: manifest not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable manifest ({e})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise UserError(f"{path}: not an rnntrain manifest (no \"format\": \"{FORMAT}\")")
    if require(man, "version", str(path), int) > VERSION:
        raise UserError(f"{path}: manifest version {man['version']} is newer than this "
                        f"rnntrain supports ({VERSION}); upgrade rnntrain")
    require(man, "labels", str(path), list)
    require(man, "inputPattSize", str(path), int)
    if require(man, "within", str(path), str) not in ("sorted", "shuffle"):
        raise UserError(f"{path}: field 'within' must be 'sorted' or 'shuffle'")
    shards = require(man, "shards", str(path), list)
    if not shards:
        raise UserError(f"{path}: no shards")
    for s, sh in enumerate(shards):
        for c in require(sh, "chunks", f"{path} shard {s}", list):
            for k, kind in (("file", str), ("numSeqs", int), ("numTimesteps", int),
                            ("bytes", int), ("sha256", str)):
                require(c, k, f"{path} shard {s}", kind)
    require(man, "index", str(path), dict)
    return man


def confined(root: Path, rel: str, where: str) -> Path:
    """``root/rel`` after checking that it stays inside ``root``: no absolute path, no
    ``..``, no symlink (of the file or a folder on the way) leading out of the dataset
    folder, and a regular file. Checked before anything is opened or hashed: a manifest
    from elsewhere must not make us read (or leak the checksum of) files outside its
    folder, nor block on a FIFO."""
    if not rel or "\0" in rel:
        raise UserError(f"{where}: empty or invalid file name {rel!r}")
    pure = Path(rel)
    if pure.is_absolute() or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise UserError(f"{where}: file {rel!r} is an absolute path; manifest paths must be "
                        f"relative to the dataset folder {root}")
    if ".." in pure.parts or ".." in rel.replace("\\", "/").split("/"):
        raise UserError(f"{where}: file {rel!r} leads out of the dataset folder {root} ('..')")
    base = root.resolve()
    try:
        real = (root / pure).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise UserError(f"{where}: file {rel!r} cannot be resolved ({e})") from None
    if real != base and base not in real.parents:
        raise UserError(f"{where}: file {rel!r} resolves to {real}, outside the dataset "
                        f"folder {root} (a symlink leading out)")
    return root / pure


def read_index(path: Path, sha: str, nbytes: int) -> dict[str, np.ndarray]:
    """The per-sequence arrays (INDEX_KEYS) of index.npz, checked against the manifest."""
    if why := file_problem(path, "sequence index"):
        raise DataError(path, why)
    verify_file(path, nbytes, sha, "sequence index")
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in INDEX_KEYS}
            if "heights" in z.files:  # 2-D datasets (images)
                out["heights"] = z["heights"]
    except (OSError, KeyError, ValueError, EOFError) as e:
        raise DataError(path, f"cannot read the sequence index ({e})") from None
    for k in ("lengths", "target_offsets", "targets"):
        if out[k].ndim != 1 or out[k].dtype.kind not in "iu":
            raise DataError(path, f"index array '{k}' must be 1-D integers, got "
                                  f"{out[k].dtype} {out[k].shape}")
    if out["tags"].ndim != 1:
        raise DataError(path, f"index array 'tags' must be 1-D, got {out['tags'].shape}")
    return out
