"""Fuzzing the two things users hand us: NetCDF files and config files.

Random NetCDF headers (dimensions, variables, types, values; written with netCDF4) and
random TOML must either load or raise a clean UserError: never another exception, a crash
or a hang (each example runs under an alarm). Bounded: fixed example counts, ~30 s total.
"""
from __future__ import annotations

import json
import math
import signal
from contextlib import contextmanager

import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from rnntrain.config import load_config, parse_override
from rnntrain.dataset import Dataset
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


DIM_NAMES = ["numSeqs", "numTimesteps", "inputPattSize", "numLabels", "numDims",
             "maxLabelLength", "maxTargStringLength", "maxSeqTagLength", "other"]
VAR_NAMES = ["inputs", "seqLengths", "seqDims", "labels", "targetStrings", "seqTags", "x"]
TYPES = ["i1", "i2", "i4", "f4", "f8", "S1"]
FORMATS = ["NETCDF3_64BIT_OFFSET", "NETCDF3_CLASSIC", "NETCDF4"]


@st.composite
def nc_headers(draw):
    dims = draw(st.dictionaries(st.sampled_from(DIM_NAMES), st.integers(0, 6), min_size=1))
    names = list(dims)
    variables = draw(st.lists(st.tuples(
        st.sampled_from(VAR_NAMES), st.sampled_from(TYPES),
        st.lists(st.sampled_from(names), min_size=0, max_size=2),
        st.integers(0, 2**31 - 1)), max_size=7, unique_by=lambda v: v[0]))
    return draw(st.sampled_from(FORMATS)), dims, variables


def _values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == "S1":
        alphabet = np.frombuffer(b"ab c\0\0L0 1", dtype="S1")
        return rng.choice(alphabet, size=shape)
    kind = rng.integers(3)
    if dtype.startswith("f"):
        vals = rng.normal(scale=10.0 ** rng.integers(0, 40), size=shape)
        if kind == 0 and vals.size:
            vals.flat[rng.integers(vals.size)] = rng.choice([np.nan, np.inf, -np.inf])
        return vals.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -3) if kind else info.min,
                        min(info.max, 20) if kind else info.max, size=shape,
                        endpoint=True).astype(dtype)


@FUZZ
@given(header=nc_headers())
def test_fuzz_netcdf_headers(tmp_path_factory, header):
    fmt, dims, variables = header
    path = tmp_path_factory.mktemp("fz") / "f.nc"
    try:
        write_header(path, fmt, dims, variables)
    except (RuntimeError, ValueError, TypeError, OSError):
        reject()  # netCDF4 itself refuses this layout (e.g. an unlimited dimension not first)
    with alarm(20):
        try:
            data = Dataset.open(str(path), chunk_frames=7)
            for k in range(len(data.chunks)):
                data.load_chunk(k)
            data.feasible(2)
        except UserError:
            pass


def write_header(path, fmt, dims, variables):
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
                v[:] = _values(dtype, shape, seed)


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
