"""A corpus of bad RNNLIB NetCDF inputs, written with netCDF4 directly (not our writer).

``write_nc`` writes the RNNLIB layout from plain arrays and lets a case drop or change any
part of it; ``BAD_FILES`` maps a case name to (builder, fragments the one-line error must
contain). Every builder writes a small file and returns its path.
"""
from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np

LABELS = ["a", "b", "c"]


def chars(strings, width=None) -> np.ndarray:
    enc = [s.encode() for s in strings]
    width = width or max([len(b) for b in enc] + [0]) + 1
    out = np.zeros((len(enc), width), dtype="S1")
    for i, b in enumerate(enc):
        out[i, :len(b)] = np.frombuffer(b, dtype="S1") if b else out[i, :0]
    return out


def good_parts(n=6, f=3, seed=0) -> dict:
    """Everything of a valid file, as plain arrays: sequences long enough for CTC."""
    rng = np.random.default_rng(seed)
    lengths = np.array([12 + 2 * i for i in range(n)], dtype=np.int32)
    return {"inputs": rng.normal(size=(int(lengths.sum()), f)).astype(np.float32),
            "lengths": lengths, "labels": list(LABELS),
            "targets": [" ".join(LABELS[(i + k) % 3] for k in range(2)) for i in range(n)],
            "tags": [f"utt{i}" for i in range(n)], "num_dims": 1}


def write_nc(path, parts: dict, drop_vars=(), drop_dims=(), fmt="NETCDF3_64BIT_OFFSET",
             lengths_var="seqLengths") -> Path:
    p = dict(parts)
    inputs, lengths = np.asarray(p["inputs"]), np.asarray(p["lengths"])
    n, f = len(lengths), inputs.shape[1]
    with netCDF4.Dataset(str(path), "w", format=fmt) as ds:
        dims = {"numSeqs": n, "numTimesteps": inputs.shape[0], "inputPattSize": f,
                "numLabels": len(p["labels"]), "numDims": p["num_dims"]}
        lab, tgt, tag = chars(p["labels"], 4), chars(p["targets"]), chars(p["tags"])
        dims.update(maxLabelLength=lab.shape[1], maxTargStringLength=tgt.shape[1],
                    maxSeqTagLength=tag.shape[1])
        for name, size in dims.items():
            # a size-0 dimension would be the unlimited one in netCDF-3: that is fine here
            ds.createDimension(name if name not in drop_dims else name + "_x",
                               size if size else None)
        def dim(d):
            return d if d not in drop_dims else d + "_x"

        def var(name, dtype, dd, value):
            if name not in drop_vars:
                v = ds.createVariable(name, dtype, tuple(dim(d) for d in dd))
                v[:] = value

        var("inputs", "f4", ("numTimesteps", "inputPattSize"), inputs)
        if lengths_var == "seqLengths":
            var("seqLengths", "i4", ("numSeqs",), lengths)
        else:
            var("seqDims", "i4", ("numSeqs", "numDims"),
                np.repeat(lengths[:, None], p["num_dims"], axis=1))
        var("labels", "S1", ("numLabels", "maxLabelLength"), lab)
        var("targetStrings", "S1", ("numSeqs", "maxTargStringLength"), tgt)
        var("seqTags", "S1", ("numSeqs", "maxSeqTagLength"), tag)
    return Path(path)


def _with(**changes):
    def build(path):
        parts = good_parts()
        for k, v in changes.items():
            parts[k] = v(parts) if callable(v) else v
        return write_nc(path, parts)
    return build


def _truncated(path):
    write_nc(path, good_parts())
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) * 2 // 3])
    return Path(path)


def _not_netcdf(path):
    Path(path).write_text("utt0 a b c\nutt1 b c\n")
    return Path(path)


def _set(arr_key, index, value):
    def f(parts):
        a = np.array(parts[arr_key], copy=True)
        a[index] = value
        return a
    return f


def _lengths_changed(parts):
    le = np.array(parts["lengths"], copy=True)
    le[0] += 2 * le[1]  # the sum stays equal, so the length check is what fires
    le[1] = -le[1]
    return le


def _zero_length(parts):
    le = np.array(parts["lengths"], copy=True)
    le[0] += le[3]
    le[3] = 0
    return le


def _targets_bad(parts):
    t = list(parts["targets"])
    t[4] = "a zz b"
    return t


def _dims(k):
    def build(path):
        parts = good_parts()
        parts["num_dims"] = k
        return write_nc(path, parts, lengths_var="seqDims")
    return build


BAD_FILES = {
    "truncated": (_truncated, ["truncated file"]),
    "not_netcdf": (_not_netcdf, ["cannot open as NetCDF"]),
    "missing_inputs": (lambda p: write_nc(p, good_parts(), drop_vars=("inputs",)),
                       ["variable 'inputs'", "missing variable"]),
    "missing_targets": (lambda p: write_nc(p, good_parts(), drop_vars=("targetStrings",)),
                        ["variable 'targetStrings'", "missing variable"]),
    "missing_lengths": (lambda p: write_nc(p, good_parts(), drop_vars=("seqLengths",)),
                        ["seqLengths", "missing variable"]),
    "missing_dimension": (lambda p: write_nc(p, good_parts(), drop_dims=("inputPattSize",)),
                          ["missing dimension 'inputPattSize'"]),
    "lengths_sum": (_with(lengths=_set("lengths", 2, 99)),
                    ["variable 'seqLengths'", "lengths sum to", "numTimesteps"]),
    "negative_length": (_with(lengths=_lengths_changed),
                        ["variable 'seqLengths'", "sequence 1 ('utt1')", "length -14"]),
    "zero_length": (_with(lengths=_zero_length),
                    ["variable 'seqLengths'", "sequence 3 ('utt3')", "length 0"]),
    "nan_inputs": (_with(inputs=_set("inputs", (12 + 14 + 3, 1), np.nan)),
                   ["variable 'inputs'", "sequence 2 ('utt2')", "NaN or Inf in frame 3"]),
    "inf_inputs": (_with(inputs=_set("inputs", (12 + 14 + 16 + 5, 0), np.inf)),
                   ["variable 'inputs'", "sequence 3 ('utt3')", "NaN or Inf in frame 5"]),
    "bad_token": (_with(targets=_targets_bad),
                  ["variable 'targetStrings'", "sequence 4 ('utt4')", "token 'zz'",
                   "not in the alphabet"]),
    "empty_alphabet": (_with(labels=[], targets=[""] * 6),
                       ["variable 'labels'", "alphabet is empty"]),
    # 2-D: seqDims (L, L) per sequence describes L*L pixels, inputs has only L rows each
    "two_dims_sizes": (_dims(2), ["variable 'seqDims'", "height x width sums to",
                                  "numTimesteps"]),
    "three_dims": (_dims(3), ["numDims = 3", "1-D sequences and 2-D images"]),
}
