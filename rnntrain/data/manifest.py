"""Sharded datasets: the manifest written by ``rnntrain-data shard`` and its epoch plans.

On disk (``DIR/``)::

    manifest.json          written last: a directory without it is not a dataset
    index.npz              per-sequence metadata in global id order (see INDEX_KEYS)
    shard-000/chunk-0000.nc ...   RNNLIB-layout files (RNNLIB itself can read each one)

``manifest.json`` holds the format version, the alphabet, inputPattSize, how shards are
ordered inside (``within``: "sorted" or "shuffle"), and per shard its chunks (file
relative to the manifest, numSeqs, numTimesteps, bytes, sha256). Global sequence ids are
consecutive over shards, then chunks, then rows. ``index.npz`` (its sha256 is in the
manifest) holds the lengths, targets and tags, so plans need no payload reads.

Plans (``plan_sharded``): rank r of W serves shards r, r+W, r+2W, … (S shards, S a
multiple of W). Shards were dealt round-robin from one length-sorted list, so shard r's
k-th sequence is about as long as every other shard's k-th. Batches are therefore defined
over *positions* (the same for all shards of a round) using the longest sequence over the
shards at each position, so every rank has the same number of steps by construction and,
at step k, a batch of the same length class. Batch order is shuffled per chunk, chunk
order per epoch, both with a seed shared by all ranks.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from rnntrain.data.dataset import Chunk, Dataset
from rnntrain.errors import DataError, UserError, check_regular_file, file_problem
from rnntrain.data.plan import Step, rng_for

FORMAT = "rnntrain-manifest"
VERSION = 1
INDEX_KEYS = ("lengths", "target_offsets", "targets", "tags")


def sha256_file(path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(block)
            if not b:
                return h.hexdigest()
            h.update(b)


def verify_chunk(chunk: Chunk):
    """Size and sha256 of a chunk file against the manifest; DataError naming the file."""
    verify_file(chunk.path, chunk.nbytes, chunk.sha256, "chunk file")


def verify_file(path, nbytes: int, sha256: str, what: str):
    if why := file_problem(path, what):
        raise DataError(path, why)
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataError(path, f"{what} unreadable ({e.strerror or e})") from None
    if nbytes and size != nbytes:
        raise DataError(path, f"{what} has {size} bytes, the manifest says {nbytes} "
                              "(truncated or replaced?)")
    if sha256 and sha256_file(path) != sha256:
        raise DataError(path, f"{what} checksum (sha256) differs from the manifest "
                              "(corrupted or modified since sharding)")


def _field(obj: dict, key: str, where: str, kind=None):
    if key not in obj:
        raise UserError(f"{where}: missing field '{key}'")
    val = obj[key]
    if kind is not None and not isinstance(val, kind):
        raise UserError(f"{where}: field '{key}' should be {kind.__name__}, got {val!r:.60}")
    return val


def read_manifest(path) -> dict:
    """Parse and check manifest.json (structure only; checksums are verified on load)."""
    path = Path(path)
    check_regular_file(path, "manifest")
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: manifest not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable manifest ({e})") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        raise UserError(f"{path}: not an rnntrain manifest (no \"format\": \"{FORMAT}\")")
    if _field(man, "version", str(path), int) > VERSION:
        raise UserError(f"{path}: manifest version {man['version']} is newer than this "
                        f"rnntrain supports ({VERSION}); upgrade rnntrain")
    _field(man, "labels", str(path), list)
    _field(man, "inputPattSize", str(path), int)
    if _field(man, "within", str(path), str) not in ("sorted", "shuffle"):
        raise UserError(f"{path}: field 'within' must be 'sorted' or 'shuffle'")
    shards = _field(man, "shards", str(path), list)
    if not shards:
        raise UserError(f"{path}: no shards")
    for s, sh in enumerate(shards):
        for c in _field(sh, "chunks", f"{path} shard {s}", list):
            for k, kind in (("file", str), ("numSeqs", int), ("numTimesteps", int),
                            ("bytes", int), ("sha256", str)):
                _field(c, k, f"{path} shard {s}", kind)
    _field(man, "index", str(path), dict)
    return man


def confined(root: Path, rel: str, where: str) -> Path:
    """``root/rel`` after checking that it stays inside ``root``: no absolute path, no
    ``..``, no symlink (of the file or a folder on the way) leading out of the dataset
    folder. Checked before anything is opened or hashed: a manifest from elsewhere must
    not make us read (or leak the checksum of) files outside its folder."""
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
    verify_file(path, nbytes, sha, "sequence index")
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: z[k] for k in INDEX_KEYS}
    except (OSError, KeyError, ValueError, EOFError) as e:
        raise DataError(path, f"cannot read the sequence index ({e})") from None
    for k in ("lengths", "target_offsets", "targets"):
        if out[k].ndim != 1 or out[k].dtype.kind not in "iu":
            raise DataError(path, f"index array '{k}' must be 1-D integers, got "
                                  f"{out[k].dtype} {out[k].shape}")
    if out["tags"].ndim != 1:
        raise DataError(path, f"index array 'tags' must be 1-D, got {out['tags'].shape}")
    return out


def open_manifest(path) -> Dataset:
    """A Dataset over the chunk files a manifest lists (metadata only; no chunk is read)."""
    path = Path(path)
    man = read_manifest(path)
    root = path.parent
    ix = man["index"]
    where = str(path)
    # every path confined before anything is opened or hashed
    index_path = confined(root, _field(ix, "file", where, str), f"{where} index")
    chunk_paths = [[confined(root, c["file"], f"{where} shard {s}")
                    for c in sh["chunks"]] for s, sh in enumerate(man["shards"])]
    idx = read_index(index_path, _field(ix, "sha256", where, str),
                     _field(ix, "bytes", where, int))
    lengths = idx["lengths"].astype(np.int64)
    toff = idx["target_offsets"].astype(np.int64)
    flat = idx["targets"].astype(np.int32)
    n = len(lengths)
    if len(toff) != n + 1 or len(idx["tags"]) != n or toff[-1] != len(flat) \
            or toff[0] != 0 or np.any(np.diff(toff) < 0):
        raise DataError(index_path, "index arrays have inconsistent sizes")
    if n and lengths.min() <= 0:
        i = int(np.argmin(lengths))
        raise DataError(index_path, f"length {lengths[i]} (every sequence needs a frame)",
                        var="lengths", seq=i)
    targets = [flat[toff[i]:toff[i + 1]] for i in range(n)]
    if len(flat) and (flat.min() < 0 or flat.max() >= len(man["labels"])):
        raise DataError(index_path, "target label index outside the alphabet")
    chunks, shards, first = [], [], 0
    for sh, paths in zip(man["shards"], chunk_paths):
        ids = []
        for c, cpath in zip(sh["chunks"], paths):
            if c["numSeqs"] < 0 or c["numTimesteps"] < 0 or c["bytes"] < 0:
                raise DataError(cpath, "negative numSeqs, numTimesteps or bytes in the "
                                       "manifest")
            seqs = np.arange(first, first + c["numSeqs"], dtype=np.int64)
            if seqs[-1:].size and seqs[-1] >= n or int(lengths[seqs].sum()) != c["numTimesteps"]:
                raise DataError(cpath, "numSeqs/numTimesteps in the manifest do "
                                       "not match the sequence index")
            ids.append(len(chunks))
            chunks.append(Chunk(str(cpath), seqs, 0, c["numTimesteps"], 0,
                                c["sha256"], c["bytes"], checked=True))
            first += c["numSeqs"]
        shards.append(ids)
    if first != n:
        raise DataError(path, f"chunks hold {first} sequences but the index has {n}")
    return Dataset(str(path), list(man["labels"]), man["inputPattSize"], lengths, targets,
                   [str(t) for t in idx["tags"]], chunks, shards, within=man["within"])


# ---------------------------------------------------------------- plans
def _positions(ds: Dataset, shard: list[int]) -> list[np.ndarray]:
    """Per chunk of a shard, its sequence ids in position order.

    Sorted shards: ascending length inside each chunk (what the tool writes; re-sorting
    makes a hand-edited manifest still plannable). Shuffled shards: file order.
    """
    out = []
    for k in shard:
        ids = ds.chunks[k].seqs
        if ds.within == "sorted":
            ids = ids[np.argsort(ds.lengths[ids], kind="stable")]
        out.append(ids)
    return out


def _blocks(per_shard: list[list[np.ndarray]]) -> list[list[tuple[int, int, list[int]]]]:
    """Cut positions at every chunk boundary of any shard of the round.

    Shards are aligned at their *end* (their longest sequences): the tool deals the
    incomplete round of a corpus that does not divide evenly at the short end, so a
    shorter shard lacks a short sequence at position 0, not a long one at the end.
    Returns blocks, each a list of segments (start, stop, chunk index per shard or -1
    where the shard has no sequence). A segment lies in one chunk per shard; a block ends
    where no shard's chunk goes on, so blocks can be visited in any order and each chunk
    is read once. With aligned chunks (what the tool writes) a block is one chunk.
    """
    sizes = [sum(len(c) for c in chunks) for chunks in per_shard]
    width = max(sizes)
    ends = [width - n + np.cumsum([len(c) for c in chunks], dtype=np.int64)
            for n, chunks in zip(sizes, per_shard)]
    cuts = sorted({0, *(width - n for n in sizes)}.union(*[e.tolist() for e in ends]))
    segs = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        owner = []
        for n, e in zip(sizes, ends):
            j = int(np.searchsorted(e, a, side="right"))
            owner.append(j if a >= width - n and j < len(e) else -1)
        segs.append((a, b, owner))
    blocks: list[list] = []
    for i, seg in enumerate(segs):
        prev = segs[i - 1][2] if i else None
        if prev is None or all(p != o or p < 0 for p, o in zip(prev, seg[2])):
            blocks.append([])
        blocks[-1].append(seg)
    return blocks


def plan_sharded(ds: Dataset, keep: np.ndarray, batch_frames: int, seed: int, epoch: int,
                 rank: int = 0, world: int = 1, shuffle: bool = True) -> list[Step]:
    """Rank ``rank``'s steps for one epoch over a sharded dataset (see the module doc).

    The global batch of a step is the union of the ranks' batches: n positions × W ranks
    sequences with n × W × (longest at those positions) ≤ ``batch_frames``, so W ranks
    with budget B train on the same batch sizes as one rank with B. Every rank computes
    the same structure from metadata alone and takes its own shard's sequences.
    """
    n_shards = len(ds.shards)
    if n_shards % world:
        divisors = [str(d) for d in range(1, n_shards + 1) if n_shards % d == 0]
        raise UserError(f"{ds.source}: {n_shards} shards cannot be dealt evenly to {world} "
                        f"ranks; re-shard with --shards a multiple of {world} (or run on "
                        f"{', '.join(divisors)} ranks)")
    rng = rng_for(seed, epoch, 0x5A4D)
    blocks = []   # per block: its segments as (per-rank chunk ids, per-rank position lists)
    for rnd in range(n_shards // world):
        group = [ds.shards[rnd * world + r] for r in range(world)]
        per_shard = [_positions(ds, sh) for sh in group]
        flat = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in per_shard]
        width = max(len(f) for f in flat)
        # end-aligned positions (see _blocks): -1 marks "no sequence here"
        flat = [np.concatenate([np.full(width - len(f), -1, np.int64), f]) for f in flat]
        for blk in _blocks(per_shard):
            blocks.append([([group[r][o[r]] if o[r] >= 0 else -1 for r in range(world)],
                            [f[a:b] for f in flat]) for a, b, o in blk])
    steps: list[Step] = []
    for u in (rng.permutation(len(blocks)) if shuffle else range(len(blocks))):
        for chunk_of, pos in blocks[u]:
            batches = _batches(ds, keep, pos, batch_frames, world)
            if shuffle:
                batches = [batches[i] for i in rng.permutation(len(batches))]
            mine = pos[rank]
            for bpos in batches:
                ids = mine[bpos]
                ids = ids[ids >= 0]
                ids = ids[keep[ids]]
                ids = ids[np.argsort(-ds.lengths[ids], kind="stable")]
                steps.append(Step(chunk_of[rank], tuple(int(s) for s in ids)))
    return _fill_empty(steps, ds.source, rank)


def _batches(ds: Dataset, keep: np.ndarray, pos: list[np.ndarray], batch_frames: int,
             world: int) -> list[np.ndarray]:
    """Batches (arrays of positions) of one segment, from the longest kept sequence over
    the ranks at each position; positions where no rank keeps anything are left out.

    pos: per rank, the segment's sequence ids by position (-1: none), all of one length.
    """
    longest = np.zeros(len(pos[0]), np.int64)
    for p in pos:
        ok = p >= 0
        longest[ok] = np.maximum(longest[ok], np.where(keep[p[ok]], ds.lengths[p[ok]], 0))
    live = np.flatnonzero(longest > 0)
    return _cut(live, longest, batch_frames, world)


def _fill_empty(steps: list[Step], source: str, rank: int) -> list[Step]:
    """Steps where this rank's shard has already ended (chunk -1, no sequences) stay on a
    chunk the rank visits anyway, so the reader neither moves nor reads anything extra."""
    real = [s.chunk for s in steps if s.chunk >= 0]
    if steps and not real:
        raise UserError(f"{source}: rank {rank}'s shards hold no sequences")
    prev = real[0] if real else -1
    out = []
    for s in steps:
        prev = s.chunk if s.chunk >= 0 else prev
        out.append(s if s.chunk >= 0 else Step(prev, s.seqs))
    return out


def _cut(live: np.ndarray, longest: np.ndarray, batch_frames: int,
         world: int) -> list[np.ndarray]:
    """Cut ascending positions into batches with n × world × max(longest) ≤ batch_frames."""
    batches, start, peak = [], 0, 0
    for i in range(len(live)):
        peak_i = max(peak, int(longest[live[i]]))
        if i > start and (i + 1 - start) * world * peak_i > batch_frames:
            batches.append(live[start:i])
            start, peak_i = i, int(longest[live[i]])
        peak = peak_i
    if len(live):
        batches.append(live[start:])
    return batches


def remainder_note(ds: Dataset, keep: np.ndarray, world: int) -> str | None:
    """One line describing sequences that cannot be dealt evenly over ``world`` ranks.

    Nothing is dropped: in the last steps of a segment the ranks whose shard is shorter
    train on fewer (possibly no) sequences. Reported once so that the user knows.
    """
    if len(ds.shards) <= 1 or len(ds.shards) % world:
        return None
    per_rank = np.zeros(world, np.int64)
    for s, sh in enumerate(ds.shards):
        for k in sh:
            per_rank[s % world] += int(keep[ds.chunks[k].seqs].sum())
    spread = int(per_rank.max() - per_rank.min())
    if spread == 0:
        return None
    return (f"{ds.source}: ranks hold {per_rank.min()}-{per_rank.max()} trainable sequences "
            f"each; the {spread} extra sequence(s) are trained in steps where other ranks "
            f"have fewer (none are dropped)")
