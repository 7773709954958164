"""Fuzzing what users hand us: NetCDF files, dataset manifests and config files.

Random NetCDF headers (dimensions, variables, types, values; written with netCDF4) and
random TOML must either load or raise a clean UserError: never another exception, a crash
or a hang (each example runs under an alarm). Bounded: fixed example counts, ~30 s total.
"""
from __future__ import annotations

import json
import math
import signal
from contextlib import contextmanager
from pathlib import Path

import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, reject, settings
from hypothesis import strategies as st

from rnntrain.config import load_config
from rnntrain.data.dataset import Dataset
from rnntrain.errors import UserError

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.filter_too_much])


class Hang(Exception):
    pass


@contextmanager
def alarm(seconds: int):
    """A hang becomes a test failure (SIGALRM raises in the main thread)."""
    def fire(*_):
        raise Hang(f"no result within {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


TYPES = ["i1", "i2", "i4", "f4", "f8", "S1"]
FORMATS = ["NETCDF3_64BIT_OFFSET", "NETCDF3_CLASSIC", "NETCDF4"]
TOKENS = ["a", "b", "c", "", "a b", "zz"]  # with names no alphabet may hold


@st.composite
def nc_headers(draw):
    """An RNNLIB layout with every part randomly kept, dropped, resized or retyped, so that
    examples reach the deep checks (lengths, alphabet, targets, frames), not only the first."""
    # mutation decisions come from a drawn seed: hypothesis would pick its favourite
    # boundary values (0 = "drop it") far more often than the rates written here
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def chance(p):
        return rng.random() < p
    n, f, nl = draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(st.integers(0, 4))
    lengths = draw(st.lists(st.integers(-1, 6) if chance(0.2) else st.integers(1, 6),
                            min_size=n, max_size=n))
    total = sum(lengths) if chance(0.8) else draw(st.integers(0, 20))
    labels = draw(st.lists(st.sampled_from(TOKENS if chance(0.1) else ["a", "b", "c", "d"]),
                           min_size=nl, max_size=nl, unique=chance(0.9)))
    pool = TOKENS if chance(0.1) or not labels else labels
    targets = [" ".join(draw(st.lists(st.sampled_from(pool), max_size=4))) for _ in range(n)]
    dims = {"numSeqs": n, "numTimesteps": max(total, 0), "inputPattSize": f,
            "numLabels": nl, "numDims": 1,
            "maxLabelLength": 4, "maxTargStringLength": 12, "maxSeqTagLength": 6}
    if chance(0.1):
        dims["numDims"] = int(rng.integers(0, 4))
    dims = {k: (int(rng.integers(0, 7)) if chance(0.05) else v)
            for k, v in dims.items() if not chance(0.03)}
    canon = {"inputs": ("f4", ("numTimesteps", "inputPattSize")),
             "seqLengths": ("i4", ("numSeqs",)), "seqDims": ("i4", ("numSeqs", "numDims")),
             "labels": ("S1", ("numLabels", "maxLabelLength")),
             "targetStrings": ("S1", ("numSeqs", "maxTargStringLength")),
             "seqTags": ("S1", ("numSeqs", "maxSeqTagLength"))}
    variables = []
    for name, (dtype, vdims) in canon.items():
        if chance(0.04) or (name == "seqDims" and chance(0.5)):
            continue  # dropped
        if chance(0.06):
            dtype = TYPES[rng.integers(len(TYPES))]
        if chance(0.06) or any(d not in dims for d in vdims):
            vdims = tuple(rng.choice(sorted(dims), size=rng.integers(0, 3))) if dims else ()
        variables.append((name, dtype, vdims, int(rng.integers(2**31))))
    content = {"seqLengths": lengths, "labels": labels, "targetStrings": targets,
               "seqTags": [f"t{i}" for i in range(n)]}
    return draw(st.sampled_from(FORMATS)), dims, variables, content


def _values(name, dtype, shape, seed, content):
    rng = np.random.default_rng(seed)
    if dtype == "S1" and name in content and len(shape) == 2:
        out = np.zeros(shape, dtype="S1")
        for i, s in enumerate(content[name][: shape[0]]):
            b = s.encode()[: shape[1]]
            out[i, :len(b)] = np.frombuffer(b, dtype="S1") if b else out[i, :0]
        return out
    if dtype == "S1":
        return rng.choice(np.frombuffer(b"ab c\0\0L0 1", dtype="S1"), size=shape)
    if dtype.startswith("i") and name in ("seqLengths", "seqDims") and len(shape):
        le = np.resize(np.asarray(content["seqLengths"] or [1], dtype=np.int64), shape[0])
        return np.resize(le[:, None] if len(shape) == 2 else le, shape).astype(dtype)
    kind = rng.integers(3)
    if dtype.startswith("f"):
        vals = rng.normal(scale=10.0 ** rng.integers(0, 40), size=shape)
        if kind == 0 and vals.size:
            vals.flat[rng.integers(vals.size)] = rng.choice([np.nan, np.inf, -np.inf])
        with np.errstate(over="ignore"):  # beyond float32: Inf, on purpose
            return vals.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -3) if kind else info.min,
                        min(info.max, 20) if kind else info.max, size=shape,
                        endpoint=True).astype(dtype)


@FUZZ
@given(header=nc_headers())
def test_fuzz_netcdf_headers(tmp_path_factory, header):
    fmt, dims, variables, content = header
    path = tmp_path_factory.mktemp("fz") / "f.nc"
    try:
        write_header(path, fmt, dims, variables, content)
    except (RuntimeError, ValueError, TypeError, OSError):
        reject()  # netCDF4 itself refuses this layout (e.g. an unlimited dimension not first)
    with alarm(20):
        try:
            data = Dataset.open(str(path), chunk_frames=7)
            for k in range(len(data.chunks)):
                data.load_chunk(k)
            data.feasible(2)
            event("loaded")
        except UserError as e:
            assert "truncated file" not in str(e), e  # these files are complete
            event(f"UserError: {str(e).split(': ', 1)[-1][:40]}")


def write_header(path, fmt, dims, variables, content):
    with netCDF4.Dataset(str(path), "w", format=fmt) as ds:
        unlimited_used = False
        for name, size in dims.items():
            if size == 0 and fmt.startswith("NETCDF3"):
                if unlimited_used:   # netCDF-3 allows one unlimited dimension
                    size = 1
                unlimited_used = unlimited_used or size == 0
            ds.createDimension(name, size or None)
        for name, dtype, vdims, seed in variables:
            v = ds.createVariable(name, dtype, tuple(vdims))
            shape = tuple(max(ds.dimensions[d].size, 0) for d in vdims)
            if all(shape):  # writing into an unlimited dimension would grow it: leave empty
                v[:] = _values(name, dtype, shape, seed, content)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else
                                            "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


SECTIONS = ["data", "model", "optim", "train", "checkpoint", "dist", "run", "other"]
KEYS = ["train", "val", "layers", "hidden", "lr", "name", "epochs", "threads", "device",
        "every_steps", "keep_last", "mode", "dir", "subsample", "dropout", "cell",
        "normalize", "schedule", "precision", "seed", "unknown"]
scalars = (st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
           | st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@FUZZ
@given(table=st.dictionaries(st.sampled_from(SECTIONS),
                             st.dictionaries(st.sampled_from(KEYS), values, max_size=5)
                             | scalars, max_size=5),
       overrides=st.lists(st.text(max_size=20) | st.builds(
           lambda s, k, v: f"{s}.{k}={v}", st.sampled_from(SECTIONS), st.sampled_from(KEYS),
           st.text(max_size=8)), max_size=3))
def test_fuzz_config_tables(tmp_path_factory, table, overrides):
    lines = []
    for sec, kv in table.items():
        if isinstance(kv, dict):
            lines.append(f"[{sec}]")
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in kv.items()]
        else:
            lines.insert(0, f"{sec} = {_toml_value(kv)}")  # a top-level scalar, not a table
    path = tmp_path_factory.mktemp("cf") / "c.toml"
    path.write_text("\n".join(lines) + "\n")
    with alarm(10):
        try:
            load_config(path, overrides)
        except UserError:
            pass


@FUZZ
@given(text=st.text(max_size=200))
def test_fuzz_config_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("ct") / "c.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    with alarm(10):
        try:
            load_config(path)
        except UserError:
            pass


# ---- manifests: paths and index fields

@pytest.fixture(scope="module")
def sharded_dataset(tmp_path_factory):
    """A small real sharded dataset, the original frames by tag, and outside the dataset
    folder a FIFO (opening it would block: a fuzz example that reads outside hangs, and
    the alarm turns that into a failure) plus a symlink to it from inside."""
    import os
    from data_tools.shard import shard
    from data_tools.synth import write_synth
    d = tmp_path_factory.mktemp("man")
    src = d / "src.nc"
    write_synth(str(src), num_seqs=24, num_labels=4, input_size=3, seed=3)
    man = Path(shard([str(src)], 2, str(d / "ds"), chunk_seqs=5))
    os.mkfifo(d / "outside.fifo")
    (man.parent / "out").symlink_to(d)
    ds = Dataset.open(str(man.parent))
    frames = {}
    for k in range(len(ds.chunks)):
        for s, x in ds.load_chunk(k).items():
            frames[ds.tags[s]] = x
    return man, json.loads(man.read_text()), frames


BAD_PATHS = ["/etc/passwd", "../outside.fifo", "out/outside.fifo", "shard-000/../../outside.fifo",
             "", "missing.nc", "shard-000", "a\0b", "out", "./shard-000/chunk-0000.nc"]
FIELDS = ["numSeqs", "numTimesteps", "bytes", "sha256", "file"]


@st.composite
def manifest_edits(draw):
    """A list of edits: (what, shard, chunk, field, value) — paths replaced, index fields
    changed, entries swapped, fields dropped or retyped."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["path", "index_path", "number", "swap", "drop", "type",
                                     "sha"]))
        edits.append((kind, draw(st.integers(0, 1)), draw(st.integers(0, 4)),
                      draw(st.sampled_from(FIELDS)), draw(st.sampled_from(BAD_PATHS)),
                      draw(st.integers(-3, 3)), draw(st.integers(0, 1)), draw(st.integers(0, 4))))
    return edits


def _apply_edits(man: dict, edits) -> dict:
    import copy
    m = copy.deepcopy(man)
    for kind, s, c, field, path, delta, s2, c2 in edits:
        chunks = m["shards"][s]["chunks"]
        entry = chunks[c % len(chunks)]
        if kind == "path":
            entry["file"] = path
        elif kind == "index_path":
            m["index"]["file"] = path
        elif kind == "number" and field in ("numSeqs", "numTimesteps", "bytes"):
            entry[field] = entry[field] + delta
        elif kind == "swap":
            other = m["shards"][s2]["chunks"][c2 % len(m["shards"][s2]["chunks"])]
            for k in ("file", "sha256", "bytes"):
                entry[k], other[k] = other[k], entry[k]
        elif kind == "drop":
            entry.pop(field, None)
        elif kind == "type":
            entry[field] = str(entry.get(field)) if field != "file" else 7
        elif kind == "sha":
            entry["sha256"] = "" if delta < 0 else "0" * 64
    return m


@FUZZ
@given(edits=manifest_edits())
def test_fuzz_manifests(sharded_dataset, edits):
    """An edited manifest either opens and serves every sequence with exactly its own
    frames (by tag, against the original), or gives a clean UserError; never an
    exception of another kind, a read outside the folder, or a hang."""
    man, orig, frames = sharded_dataset
    path = man.parent / "fuzz.json"
    path.write_text(json.dumps(_apply_edits(orig, edits)))
    with alarm(20):
        try:
            ds = Dataset.open(str(path))
            for k in range(len(ds.chunks)):
                for s, x in ds.load_chunk(k).items():
                    assert np.array_equal(x, frames[ds.tags[s]]), ds.tags[s]
            event("loaded")
        except UserError as e:
            event(f"UserError: {str(e).split(': ', 1)[-1][:40]}")
