"""RNNLIB NetCDF layout: round trips, files written by other tools, and bad input."""
from __future__ import annotations

import netCDF4
import numpy as np
import pytest

from rnntrain.data import ncdata
from rnntrain.data.dataset import Dataset
from rnntrain.errors import DataError


def _seqs(rng, n=5, f=3):
    return [rng.normal(size=(int(rng.integers(1, 9)), f)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("fmt", ["NETCDF3_64BIT_OFFSET", "NETCDF4", "NETCDF3_CLASSIC"])
def test_round_trip_is_exact(tmp_path, fmt):
    rng = np.random.default_rng(0)
    seqs = _seqs(rng)
    labels = ["a", "bb", "c"]
    targets = ["a bb", "c", "", "bb bb a", "c a"]
    tags = ["s0", "sequence_one", "x", "", "last"]
    path = tmp_path / "rt.nc"
    ncdata.write_file(path, seqs, targets, labels, tags, fmt=fmt)
    h, frames = ncdata.read_file(path)
    assert h.labels == labels and h.tags == tags and h.input_size == 3
    assert [list(t) for t in h.targets] == [[0, 1], [2], [], [1, 1, 0], [2, 0]]
    for a, b in zip(seqs, frames):
        np.testing.assert_array_equal(a, b)
    assert not list(tmp_path.glob(".*tmp*"))  # the temp file was renamed away


def test_written_layout_is_rnnlib(tmp_path):
    """Exactly RNNLIB's names, shapes and 0-terminated char rows."""
    path = tmp_path / "l.nc"
    ncdata.write_file(path, [np.zeros((4, 2), np.float32), np.ones((2, 2), np.float32)],
                      ["x y", "y"], ["x", "y"], ["t1", "t2"])
    with netCDF4.Dataset(path) as ds:
        assert ds.file_format == "NETCDF3_64BIT_OFFSET"
        d = {k: v.size for k, v in ds.dimensions.items()}
        assert d["numSeqs"] == 2 and d["numTimesteps"] == 6 and d["inputPattSize"] == 2
        assert d["numLabels"] == 2 and d["numDims"] == 1
        v = ds.variables
        assert v["inputs"].dimensions == ("numTimesteps", "inputPattSize")
        assert v["inputs"].dtype == np.float32
        assert v["seqLengths"].dimensions == ("numSeqs",)
        assert v["seqDims"].dimensions == ("numSeqs", "numDims")
        assert v["labels"].dimensions[0] == "numLabels"
        assert v["targetStrings"].dimensions[0] == "numSeqs"
        assert v["seqTags"].dimensions[0] == "numSeqs"
        v["targetStrings"].set_auto_chartostring(False)
        row = bytes(np.asarray(v["targetStrings"][0]).view(np.uint8))
        assert row.startswith(b"x y\0")
        assert v["targetStrings"].shape[1] >= len("x y") + 1
        assert list(v["seqLengths"][:]) == [4, 2]


def _foreign(path, *, vlen=False, fmt="NETCDF4", lengths=(3, 2), tdim="totalFrames",
             targets=("a b", "b"), labels=("a", "b"), seqdims=True, dtype="i2", tags=True,
             extra=None):
    """A file as another tool writes it: other dimension names, types, vlen strings."""
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        n = len(lengths)
        ds.createDimension("numSeqs", n)
        ds.createDimension(tdim, sum(lengths))
        ds.createDimension("inputPattSize", 2)
        ds.createDimension("numLabels", len(labels))
        inp = ds.createVariable("inputs", dtype, (tdim, "inputPattSize"))
        inp[:] = np.arange(sum(lengths) * 2).reshape(-1, 2)
        if seqdims:
            ds.createDimension("numDims", 1)
            ds.createVariable("seqDims", "i4", ("numSeqs", "numDims"))[:] = np.array(lengths)[:, None]
        else:
            ds.createVariable("seqLengths", "i4", ("numSeqs",))[:] = np.array(lengths)
        if vlen:
            for name, vals, dim in (("labels", labels, "numLabels"), ("targetStrings", targets,
                                                                      "numSeqs")):
                var = ds.createVariable(name, str, (dim,))
                for i, s in enumerate(vals):
                    var[i] = s
        else:
            for name, vals, dim in (("labels", labels, "numLabels"), ("targetStrings", targets,
                                                                      "numSeqs")):
                w = max(len(s) for s in vals) + 5  # wider than needed: still 0-terminated
                ds.createDimension(f"w_{name}", w)
                arr = np.zeros((len(vals), w), "S1")
                for i, s in enumerate(vals):
                    arr[i, :len(s)] = np.frombuffer(s.encode(), "S1")
                ds.createVariable(name, "S1", (dim, f"w_{name}"))[:] = arr
        if tags:
            ds.createDimension("tagw", 8)
            arr = np.zeros((n, 8), "S1")
            for i in range(n):
                arr[i, :2] = np.frombuffer(f"t{i}".encode(), "S1")
            ds.createVariable("seqTags", "S1", ("numSeqs", "tagw"))[:] = arr
        if extra:
            extra(ds)


@pytest.mark.parametrize("kw", [dict(), dict(vlen=True), dict(fmt="NETCDF3_CLASSIC"),
                                dict(seqdims=False, tags=False), dict(dtype="f8")])
def test_files_from_other_tools(tmp_path, kw):
    path = tmp_path / "foreign.nc"
    _foreign(path, **kw)
    h, frames = ncdata.read_file(path)
    assert h.labels == ["a", "b"] and [list(t) for t in h.targets] == [[0, 1], [1]]
    assert [len(f) for f in frames] == [3, 2]
    np.testing.assert_array_equal(np.concatenate(frames), np.arange(10).reshape(5, 2))
    assert h.tags == (["t0", "t1"] if kw.get("tags", True) else ["", ""])


@pytest.mark.parametrize("kw,needle", [
    (dict(targets=("a z", "b")), "sequence 0 ('t0'): target token 'z' is not in the alphabet"),
    (dict(lengths=(3, 0)), "sequence 1 ('t1'): length 0"),
    (dict(labels=()), "alphabet is empty"),
])
def test_bad_files_name_file_variable_sequence(tmp_path, kw, needle):
    path = tmp_path / "bad.nc"
    if kw.get("labels") == ():
        _foreign(path, labels=("a",), targets=("", ""), vlen=True)
        with netCDF4.Dataset(path, "a") as ds:  # rewrite with zero labels
            pass
        _foreign_empty_alphabet(path)
    else:
        _foreign(path, **kw)
    with pytest.raises(DataError) as e:
        ncdata.read_header(path)
    assert str(path) in str(e.value) and needle in str(e.value)


def _foreign_empty_alphabet(path):
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("numSeqs", 1)
        ds.createDimension("numTimesteps", 2)
        ds.createDimension("inputPattSize", 2)
        ds.createDimension("numLabels", 0)
        ds.createVariable("inputs", "f4", ("numTimesteps", "inputPattSize"))[:] = np.zeros((2, 2))
        ds.createVariable("seqLengths", "i4", ("numSeqs",))[:] = [2]
        ds.createVariable("labels", str, ("numLabels",))
        ds.createVariable("targetStrings", str, ("numSeqs",))[0] = ""


def test_lengths_must_sum_to_frames(tmp_path):
    path = tmp_path / "sum.nc"
    _foreign(path, extra=lambda ds: ds.variables["seqDims"].__setitem__(slice(None),
                                                                        np.array([[3], [1]])))
    with pytest.raises(DataError, match=r"seqDims.*lengths sum to 4 but inputs has 5 rows"):
        ncdata.read_header(path)


def test_missing_variable_and_3d_data(tmp_path):
    path = tmp_path / "miss.nc"
    _foreign(path, extra=lambda ds: ds.renameVariable("targetStrings", "targets"))
    with pytest.raises(DataError, match=r"variable 'targetStrings': missing variable"):
        ncdata.read_header(path)
    path2 = tmp_path / "img.nc"
    with netCDF4.Dataset(path2, "w") as ds:
        for d, n in (("numSeqs", 1), ("numDims", 3), ("inputPattSize", 1)):
            ds.createDimension(d, n)
    with pytest.raises(DataError, match="numDims = 3: only 1-D sequences and 2-D images"):
        ncdata.read_header(path2)


def test_not_netcdf_and_missing_file(tmp_path):
    p = tmp_path / "junk.nc"
    p.write_bytes(b"this is not a netcdf file at all" * 10)
    with pytest.raises(DataError, match=r"junk.nc: cannot open as NetCDF"):
        ncdata.read_header(p)
    with pytest.raises(DataError, match="file not found"):
        ncdata.read_header(tmp_path / "nope.nc")


def test_nan_frames_are_reported_with_the_sequence(tmp_path):
    seqs = [np.zeros((3, 2), np.float32), np.zeros((4, 2), np.float32)]
    seqs[1][2, 1] = np.nan
    path = tmp_path / "nan.nc"
    ncdata.write_file(path, seqs, ["a", "a"], ["a"], ["ok", "broken"])
    ds = Dataset.open(str(path))
    with pytest.raises(DataError, match=r"variable 'inputs', sequence 1 \('broken'\): NaN or Inf in frame 2"):
        ds.load_chunk(0)


def test_virtual_chunks_cover_file_in_order(tmp_path):
    rng = np.random.default_rng(5)
    seqs = _seqs(rng, n=40)
    path = tmp_path / "v.nc"
    ncdata.write_file(path, seqs, ["a"] * 40, ["a"])
    ds = Dataset.open(str(path), chunk_frames=25)
    assert len(ds.chunks) > 3
    got = {}
    for k in range(len(ds.chunks)):
        got.update(ds.load_chunk(k))
    assert sorted(got) == list(range(40))
    for i, s in enumerate(seqs):
        np.testing.assert_array_equal(got[i], s)
