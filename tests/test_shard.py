"""rnntrain-data shard: round trip, balance, determinism, errors, bounded memory."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from data_tools.shard import shard
from data_tools.synth import write_synth
from rnntrain.data import ncdata
from rnntrain.data.dataset import Dataset
from rnntrain.errors import DataError, UserError
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("shard_in")
    write_synth(str(d / "a.nc"), num_seqs=700, num_labels=6, input_size=5, seed=11)
    write_synth(str(d / "b.nc"), num_seqs=500, num_labels=6, input_size=5, seed=12)
    return d / "a.nc", d / "b.nc"


def load_all(ds: Dataset) -> dict[int, np.ndarray]:
    out = {}
    for k in range(len(ds.chunks)):
        out.update(ds.load_chunk(k))
    return out


@pytest.mark.parametrize("within", ["sorted", "shuffle"])
def test_round_trip_bit_exact(tmp_path, two_inputs, within):
    man = shard([str(p) for p in two_inputs], 4, str(tmp_path / "d"), chunk_frames=3000,
                seed=7, within=within)
    ds = Dataset.open(str(man))
    frames = load_all(ds)
    src = {}
    for p in two_inputs:
        h, seqs = ncdata.read_file(p)
        for i in range(h.num_seqs):
            src[h.tags[i]] = (seqs[i], [h.labels[k] for k in h.targets[i]])
    assert ds.num_seqs == len(src) == len(frames)
    assert sorted(ds.tags) == sorted(src)                    # every sequence exactly once
    for i, tag in enumerate(ds.tags):
        x, target = src[tag]
        assert np.array_equal(frames[i], x) and frames[i].dtype == x.dtype
        assert [ds.labels[k] for k in ds.targets[i]] == target
    # each chunk is a standalone RNNLIB-layout file agreeing with the manifest's index
    for c in ds.chunks:
        h = ncdata.read_header(c.path)
        assert h.tags == [ds.tags[i] for i in c.seqs]
        assert np.array_equal(h.lengths, ds.lengths[c.seqs])
    for sh in ds.shards:
        lens = np.concatenate([ds.lengths[ds.chunks[k].seqs] for k in sh])
        assert (np.all(np.diff(lens) >= 0)) == (within == "sorted")


def test_shards_balanced_and_length_classed(tmp_path, two_inputs):
    n_shards = 7                                  # 1200 = 7 x 171 + 3: an incomplete round
    man = shard([str(p) for p in two_inputs], n_shards, str(tmp_path / "d"), chunk_seqs=50)
    ds = Dataset.open(str(man))
    per_shard = [np.concatenate([ds.lengths[ds.chunks[k].seqs] for k in sh]) for sh in ds.shards]
    totals = np.array([p.sum() for p in per_shard])
    assert (totals.max() - totals.min()) / totals.max() <= 0.01
    # counted from the end, position k of every shard comes from the same round of the
    # globally sorted lengths; the incomplete round is the shortest one
    srt = np.sort(ds.lengths)[::-1]
    assert sorted(len(p) for p in per_shard) == [171] * 4 + [172] * 3
    for k in range(171):
        got = sorted(int(p[len(p) - 1 - k]) for p in per_shard)
        assert got == sorted(srt[n_shards * k:n_shards * (k + 1)].tolist())
    # chunks hold the same positions in every shard (the first one a sequence fewer
    # in the shards that missed the incomplete round)
    assert {tuple(len(ds.chunks[k].seqs) for k in sh) for sh in ds.shards} == \
        {(50, 50, 50, 22), (49, 50, 50, 22)}


def test_deterministic_per_seed(tmp_path, two_inputs):
    ins = [str(p) for p in two_inputs]
    m1 = json.loads(shard(ins, 3, str(tmp_path / "a"), chunk_seqs=100, seed=5).read_text())
    m2 = json.loads(shard(ins, 3, str(tmp_path / "b"), chunk_seqs=100, seed=5).read_text())
    m3 = json.loads(shard(ins, 3, str(tmp_path / "c"), chunk_seqs=100, seed=6).read_text())
    sums = [[c["sha256"] for s in m["shards"] for c in s["chunks"]] for m in (m1, m2, m3)]
    assert sums[0] == sums[1] and sums[0] != sums[2]


def test_alphabet_and_input_size_mismatch(tmp_path, two_inputs):
    other = tmp_path / "c.nc"
    write_synth(str(other), num_seqs=40, num_labels=8, input_size=5, seed=3)
    r = run_cli("data_tools", "shard", two_inputs[0], other, "--shards", "2", "--out",
                tmp_path / "x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "c.nc" in r.stderr and "alphabet differs" in r.stderr and "--merge-labels" in r.stderr
    assert not (tmp_path / "x" / "manifest.json").exists()
    # with --merge-labels: the union alphabet, targets keep their label names
    man = shard([str(two_inputs[0]), str(other)], 2, str(tmp_path / "m"), merge_labels=True)
    ds = Dataset.open(str(man))
    h = ncdata.read_header(other)
    assert ds.labels == ncdata.read_header(two_inputs[0]).labels + h.labels[6:]
    pos = {t: i for i, t in enumerate(ds.tags)}
    for i in range(h.num_seqs):
        got = [ds.labels[k] for k in ds.targets[pos[h.tags[i]]]]
        assert got == [h.labels[k] for k in h.targets[i]]
    wide = tmp_path / "w.nc"
    write_synth(str(wide), num_seqs=10, num_labels=6, input_size=7, seed=3)
    with pytest.raises(DataError, match="inputPattSize 7 differs"):
        shard([str(two_inputs[0]), str(wide)], 2, str(tmp_path / "y"), merge_labels=True)


def test_truncated_input_gives_error_and_no_manifest(tmp_path, two_inputs):
    bad = tmp_path / "cut.nc"
    bad.write_bytes(two_inputs[1].read_bytes()[: os.path.getsize(two_inputs[1]) * 2 // 3])
    r = run_cli("data_tools", "shard", two_inputs[0], bad, "--shards", "2", "--out",
                tmp_path / "o")
    assert r.returncode == 2 and "cut.nc" in r.stderr and "truncated" in r.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_existing_output_refused(tmp_path, two_inputs):
    shard([str(two_inputs[0])], 2, str(tmp_path / "d"))
    with pytest.raises(UserError, match="already holds a dataset"):
        shard([str(two_inputs[0])], 2, str(tmp_path / "d"))


def test_corrupted_and_truncated_chunks(tmp_path, two_inputs):
    man = shard([str(two_inputs[0])], 2, str(tmp_path / "d"), chunk_seqs=100)
    ds = Dataset.open(str(man))
    # flip one byte in the frames of one chunk: the sha256 catches it
    c1 = ds.chunks[1]
    raw = bytearray(open(c1.path, "rb").read())
    raw[-7] ^= 0x40
    open(c1.path, "wb").write(raw)
    with pytest.raises(DataError, match=r"chunk-0001\.nc.*checksum"):
        ds.load_chunk(1)
    # truncate another one: named with its size
    c2 = ds.chunks[2]
    os.truncate(c2.path, c2.nbytes // 2)
    with pytest.raises(DataError, match=r"chunk-0002\.nc.*truncated"):
        ds.load_chunk(2)
    ds.load_chunk(0)  # intact chunks still load
    r = run_cli("data_tools", "inspect", man)
    assert r.returncode == 2 and "FAILED" in r.stdout and "chunk-0001.nc" in r.stdout
    assert f"{len(ds.chunks) - 2} of {len(ds.chunks)} chunk files OK" in r.stdout
    # the sequence index is checked when the dataset is opened
    ix = tmp_path / "d" / "index.npz"
    raw = bytearray(ix.read_bytes())
    raw[100] ^= 1
    ix.write_bytes(raw)
    with pytest.raises(DataError, match=r"index\.npz.*sequence index checksum"):
        Dataset.open(str(man))


def test_inspect_manifest_warns_unsorted(tmp_path, two_inputs):
    man = shard([str(two_inputs[0])], 2, str(tmp_path / "d"), chunk_seqs=1000)
    r = run_cli("data_tools", "inspect", man)
    assert r.returncode == 0, r.stderr
    assert "shard   0" in r.stdout and "shard   1" in r.stdout and "warning" not in r.stdout
    # claim "sorted" over shuffled shards: inspect warns
    man2 = shard([str(two_inputs[0])], 2, str(tmp_path / "e"), within="shuffle")
    m = json.loads(man2.read_text())
    m["within"] = "sorted"
    man2.write_text(json.dumps(m))
    from data_tools.inspect_nc import inspect
    assert "warning: shard 0 should be sorted by length but is not" in inspect(str(man2))


RSS_SCRIPT = """
import resource, sys
from data_tools.shard import shard
from rnntrain.data.dataset import Dataset
if sys.argv[1] == "shard":
    shard([sys.argv[2]], 4, sys.argv[3], chunk_frames=int(sys.argv[4]))
else:  # baseline: the same imports and the metadata of the whole corpus
    from rnntrain.data import ncdata
    ncdata.read_header(sys.argv[2])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_streaming_memory_bounded(tmp_path):
    """Peak RSS of sharding a corpus 40x the chunk size stays near the baseline."""
    import subprocess
    src = tmp_path / "big.nc"
    rng = np.random.default_rng(4)
    lengths = rng.integers(50, 400, 1000)
    with ncdata.NcWriter(src, ["a", "b"], 100, lengths, ["a b"] * 1000,
                         [f"s{i}" for i in range(1000)]) as w:
        for n in lengths:
            w.append(rng.standard_normal((n, 100), dtype=np.float32))
    size = os.path.getsize(src)                     # about 90 MB
    chunk_frames = int(lengths.sum()) // 160        # 4 shards x 40 chunks
    env = dict(os.environ, PYTHONPATH=str(os.path.dirname(os.path.dirname(__file__))))

    def peak(*args) -> int:
        r = subprocess.run([sys.executable, "-c", RSS_SCRIPT, *map(str, args)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split()[-1]) * 1024

    base = peak("base", src)
    sharded = peak("shard", src, tmp_path / "out", chunk_frames)
    print(f"corpus {size / 1e6:.0f} MB, peak RSS baseline {base / 1e6:.0f} MB, "
          f"sharding {sharded / 1e6:.0f} MB")
    assert sharded - base < 0.15 * size, (base, sharded, size)


@pytest.mark.mpi
def test_train_two_ranks_on_manifest(tmp_path, synth_pair):
    """shard → train on 2 MPI ranks: every sequence is trained exactly once per epoch
    (global counts from the metrics) and a 3-rank run is refused with a clear line."""
    from tests.conftest import mpiexec
    mpi = mpiexec()
    if mpi is None:
        pytest.skip("mpiexec not available")
    import subprocess
    man = shard([str(synth_pair[0])], 2, str(tmp_path / "d"), chunk_seqs=20)
    ds = Dataset.open(str(man))
    args = ["-m", "rnntrain", "train", "configs/default.toml", f"data.train={man}",
            "data.val=", "train.epochs=1", "model.hidden=8", "model.layers=1",
            "compute.threads=1", "log.every_steps=1", f"run.dir={tmp_path / 'run'}"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    r = subprocess.run([mpi, "-n", "2", sys.executable, *args], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
            if x.strip()]
    assert sum(x["seqs"] for x in recs if x["split"] == "train") == int(ds.feasible(1).sum())
    r = subprocess.run([mpi, "-n", "3", sys.executable, *args[:-1], f"run.dir={tmp_path}/r3"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "2 shards cannot be dealt evenly to 3 ranks" in r.stderr
    assert "Traceback" not in r.stderr


def test_folder_without_manifest(tmp_path):
    (tmp_path / "half" / "shard-000").mkdir(parents=True)
    with pytest.raises(UserError, match="without manifest.json"):
        Dataset.open(str(tmp_path / "half"))
