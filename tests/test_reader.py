"""The double-buffered chunk reader: order, two resident chunks, errors, close."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rnntrain.data.dataset import Dataset
from rnntrain.errors import DataError
from rnntrain.data.plan import chunk_order, make_plan
from rnntrain.data.reader import ChunkReader


class Tracker:
    """A load function that records, independently of the reader, how many chunks are
    alive (loaded and not yet released by the consumer) when each load starts."""

    def __init__(self, load_s: float = 0.0, fail_at: int | None = None):
        self.lock = threading.Lock()
        self.started = 0
        self.released = 0
        self.peak = 0
        self.threads = set()
        self.load_s, self.fail_at = load_s, fail_at

    def __call__(self, k: int) -> dict:
        with self.lock:
            self.started += 1
            self.peak = max(self.peak, self.started - self.released)
        self.threads.add(threading.current_thread().name)
        if k == self.fail_at:
            raise DataError(f"chunk-{k}.nc", "cannot read rows 0:10", var="inputs")
        if self.load_s:
            time.sleep(self.load_s)   # a slow disk
        return {"chunk": k, "data": np.full(4, k)}

    def consumed(self):
        with self.lock:
            self.released += 1


@pytest.mark.parametrize("load_s,work_s", [(0.0, 0.01), (0.01, 0.0)])
def test_order_and_at_most_two_resident(load_s, work_s):
    order = [5, 2, 9, 0, 7, 3, 1, 8]
    t = Tracker(load_s)
    got = []
    with ChunkReader(t, order) as r:
        for _ in order:
            k, payload = r.next()
            assert payload["chunk"] == k and (payload["data"] == k).all()
            got.append(k)
            time.sleep(work_s)        # training on the chunk
            t.consumed()              # released by the next next()
        with pytest.raises(StopIteration):
            r.next()
    assert got == order
    assert r.max_resident_seen <= 2 and t.peak <= 2
    assert t.threads == {"rnntrain-reader"}      # loads only on the reader thread
    assert r.loaded == len(order)


def test_loader_error_reaches_consumer_naming_file():
    t = Tracker(fail_at=3)
    r = ChunkReader(t, [1, 2, 3, 4])
    assert r.next()[0] == 1
    assert r.next()[0] == 2
    with pytest.raises(DataError, match=r"chunk-3\.nc.*inputs"):
        r.next()
    r.close()
    assert not r._thread.is_alive()


def test_close_mid_epoch_joins():
    # the loader is waiting for a free slot (consumer holds one, next is loaded)
    r = ChunkReader(Tracker(), list(range(10)))
    r.next()
    time.sleep(0.05)
    r.close()
    assert not r._thread.is_alive()
    # the loader is inside a slow load
    r = ChunkReader(Tracker(load_s=0.2), list(range(10)))
    r.close()
    assert not r._thread.is_alive()


def test_reader_over_manifest_in_plan_order(tmp_path, synth_pair):
    """Real chunks: payloads match a whole-file read, served in plan order; a corrupted
    chunk is reported naming it when the reader reaches it."""
    from data_tools.shard import shard
    from rnntrain.data import ncdata
    man = shard([str(synth_pair[0])], 2, str(tmp_path / "d"), chunk_seqs=15)
    ds = Dataset.open(str(man))
    keep = np.ones(ds.num_seqs, bool)
    h, seqs = ncdata.read_file(synth_pair[0])
    by_tag = dict(zip(h.tags, seqs))
    for rank in (0, 1):
        plan = make_plan(ds, keep, 600, 1, 0, rank, 2)
        order = chunk_order(plan)
        with ChunkReader(ds.load_chunk, order) as r:
            cur = None
            for step in plan:
                if step.chunk != cur:
                    cur, payload = r.next()
                    assert cur == step.chunk
                for s in step.seqs:
                    assert np.array_equal(payload[s], by_tag[ds.tags[s]])
        assert r.max_resident_seen <= 2
    bad = ds.chunks[order[2]]
    raw = bytearray(open(bad.path, "rb").read())
    raw[len(raw) // 2] ^= 1
    open(bad.path, "wb").write(raw)
    with ChunkReader(ds.load_chunk, order) as r:
        r.next(), r.next()
        with pytest.raises(DataError, match="checksum") as e:
            r.next()
        assert bad.path in str(e.value)


def test_single_file_virtual_chunks(synth_pair):
    """An RNNLIB .nc file is served as contiguous virtual chunks, bit-exact."""
    from rnntrain.data import ncdata
    ds = Dataset.open(str(synth_pair[0]), chunk_frames=500)
    assert len(ds.chunks) > 3
    h, seqs = ncdata.read_file(synth_pair[0])
    seen = {}
    with ChunkReader(ds.load_chunk, list(range(len(ds.chunks)))) as r:
        for _ in ds.chunks:
            seen.update(r.next()[1])
    assert sorted(seen) == list(range(h.num_seqs))
    assert all(np.array_equal(seen[i], seqs[i]) for i in range(h.num_seqs))


def test_extend_serves_appended_chunks_after_an_idle_wait():
    """An order that grows while the reader runs (a training run's one reader): chunks
    appended after the thread has loaded everything queued are served in order, on the
    same thread, at most two resident; a failing chunk appended later is raised only by
    the next() that wants it."""
    t = Tracker(fail_at=99)
    with ChunkReader(t, [3]) as r:
        assert r.next()[0] == 3
        time.sleep(0.05)                 # the thread has nothing queued: it sleeps
        r.extend([4, 5])
        t.consumed()
        assert r.next()[0] == 4
        r.extend([6, 99])
        for want in (5, 6):
            t.consumed()
            assert r.next()[0] == want
        with pytest.raises(DataError, match=r"chunk-99\.nc"):
            r.next()
    assert r.max_resident_seen <= 2 and t.peak <= 2
    assert t.threads == {"rnntrain-reader"}
    r = ChunkReader(t, [])
    with pytest.raises(StopIteration):   # nothing queued: the consumer is told, no hang
        r.next()
    r.extend([7])
    assert r.next()[0] == 7
    r.close()
    assert not r._thread.is_alive()


def test_run_reader_training_and_validation_on_one_thread(synth_pair):
    """The training loop's reader (run.step.RunReader) over two real files: two epochs'
    training chunks with the validation set between them, queued as the loop queues them
    (the next epoch's and the validation chunks before the epoch runs), come back in that
    order with the frames of a whole-file read, all on one thread, at most two chunks
    resident with validation chunks counted."""
    from rnntrain.data import ncdata
    from rnntrain.run.evaluate import eval_batches
    from rnntrain.run.step import EpochFeed, RunReader
    train = Dataset.open(str(synth_pair[0]), chunk_frames=500)
    val = Dataset.open(str(synth_pair[1]), chunk_frames=300)
    keep, vkeep = np.ones(train.num_seqs, bool), np.ones(val.num_seqs, bool)
    truth = {name: dict(enumerate(ncdata.read_file(p)[1]))
             for name, p in zip(("train", "val"), synth_pair)}
    val_chunks = list(eval_batches(val, vkeep, 300))
    assert len(val_chunks) >= 2 and len(train.chunks) >= 3
    plans = [make_plan(train, keep, 600, 1, e) for e in range(2)]
    threads = []                            # (thread ident, source) of every read
    for name, ds in (("train", train), ("val", val)):
        def recorded(k, buffers=None, _load=ds.load_chunk, _name=name):
            threads.append((threading.get_ident(), _name))
            return _load(k, buffers)
        ds.load_chunk = recorded
    rr = RunReader(train, val)
    try:
        rr.queue("train", chunk_order(plans[0]))
        for e, plan in enumerate(plans):
            rr.queue("val", val_chunks)
            if e + 1 < len(plans):
                rr.queue("train", chunk_order(plans[e + 1]))
            feed = EpochFeed(train, plan, e, 0, 0, rr.stream("train"))
            prev = None
            for fed in feed:
                assert all(np.array_equal(fed.payload[s], truth["train"][s])
                           for s in fed.batch.seqs)
                if prev is not None:  # at a switch the feed took the old chunk back
                    assert (prev.payload is None) == (prev.batch.chunk != fed.batch.chunk)
                prev = fed
            prev = None
            fed = None
            feed.close()  # a feed on the run's reader leaves it running for validation
            assert rr.reader._thread.is_alive()
            stream = rr.stream("val")
            for want in val_chunks:
                k, payload = stream.next()
                assert k == want
                assert all(np.array_equal(a, truth["val"][s]) for s, a in payload.items())
                payload = None
        assert rr.reader.loaded == 2 * (len(chunk_order(plans[0])) + len(val_chunks))
        assert rr.reader.max_resident_seen <= 2
        # the consumers let go of each chunk before the next (the feed drops the payload
        # of the batch it handed out last): never more than two buffers for the frames
        largest = max(c.frames for d in (train, val) for c in d.chunks) * train.input_size * 4
        assert rr.buffers.max_mapped_bytes <= 2 * _mapping(largest)
    finally:
        rr.close()
    assert len({ident for ident, _ in threads}) == 1        # one thread read both files
    assert {src for _, src in threads} == {"train", "val"}
    assert threads[0][0] == rr.reader._thread.ident and not rr.reader._thread.is_alive()


def _varied_file(path, num_seqs=60, features=5, seed=3):
    """A real .nc file of sequences of very different lengths (4 to 400 frames)."""
    from rnntrain.data import ncdata
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(4, 400, num_seqs)]
    seqs = [rng.standard_normal((n, features)).astype(np.float32) for n in lengths]
    with ncdata.NcWriter(path, ["a", "b"], features, lengths, ["a b"] * num_seqs,
                         [f"s{i}" for i in range(num_seqs)]) as w:
        for x in seqs:
            w.append(x)
    return seqs


def _mapping(nbytes: int) -> int:
    """The bytes ChunkBuffers maps for a chunk of ``nbytes`` (with its headroom, in pages)."""
    import mmap
    from rnntrain.data.chunkbuf import HEADROOM
    return -(-int(nbytes * (1 + HEADROOM)) // mmap.PAGESIZE) * mmap.PAGESIZE


def test_chunk_buffers_bounded_across_chunks_of_differing_sizes(tmp_path):
    """Many chunks of differing sizes through one reader: the frames are exact, and every
    chunk lands in one of two buffers (counted from the arrays' own addresses) whose bytes
    never exceed two of the largest chunk (computed from the chunk index) plus headroom,
    however many chunks there are."""
    from functools import partial
    from rnntrain.data import chunkbuf
    seqs = _varied_file(tmp_path / "v.nc")
    ds = Dataset.open(str(tmp_path / "v.nc"), chunk_frames=700)
    frames = [c.frames for c in ds.chunks]
    assert len(frames) >= 12 and len(set(frames)) >= 8
    buffers = chunkbuf.ChunkBuffers()
    order = list(range(len(ds.chunks))) * 2          # two epochs: the largest chunk twice
    starts = set()
    with ChunkReader(partial(ds.load_chunk, buffers=buffers), order) as r:
        for _ in order:
            k, payload = r.next()
            assert all(np.array_equal(payload[s], seqs[s]) for s in ds.chunks[k].seqs)
            starts.add(payload[int(ds.chunks[k].seqs[0])].ctypes.data)
            payload = None                           # released before the next chunk
    largest = max(frames) * ds.input_size * 4
    assert buffers.max_mapped_bytes <= 2 * _mapping(largest)
    assert len(starts) <= buffers.maps  # distinct places: no more than mappings made


def test_chunk_buffers_never_overwrite_a_chunk_still_held(tmp_path):
    """A consumer that keeps a chunk's frames past its release (a view, a tensor made from
    them) keeps them intact: the next chunks get another buffer, and once the chunk is let
    go its buffer serves again, at most ``keep`` free ones kept."""
    import torch
    from functools import partial
    from rnntrain.data import chunkbuf
    seqs = _varied_file(tmp_path / "v.nc")
    ds = Dataset.open(str(tmp_path / "v.nc"), chunk_frames=700)
    buffers = chunkbuf.ChunkBuffers()
    order = list(range(len(ds.chunks)))
    with ChunkReader(partial(ds.load_chunk, buffers=buffers), order) as r:
        k0, p0 = r.next()
        held = torch.from_numpy(p0[int(ds.chunks[k0].seqs[0])])  # a tensor viewing it
        view = p0[int(ds.chunks[k0].seqs[-1])][1:]
        p0 = None
        for _ in order[1:]:
            k, payload = r.next()
            assert all(np.array_equal(payload[s], seqs[s]) for s in ds.chunks[k].seqs)
            payload = None
        assert np.array_equal(held.numpy(), seqs[int(ds.chunks[k0].seqs[0])])
        assert np.array_equal(view, seqs[int(ds.chunks[k0].seqs[-1])][1:])
        assert buffers.maps >= 3         # the held chunk's buffer was not handed out
        held = view = None
    rows = buffers.take((10, ds.input_size))  # all free now: one reused, extra unmapped
    assert len(buffers._blocks) <= buffers.keep and rows.shape == (10, ds.input_size)


def test_read_rows_in_blocks_equals_one_read(tmp_path, monkeypatch):
    """read_rows reads READ_BLOCK bytes at a time into its result: the same rows as one
    netCDF read of the range, and an unwritten row is named (with the count of all such
    rows in the range) whichever block it falls in."""
    import netCDF4
    from rnntrain.data import chunkbuf, ncdata
    _varied_file(tmp_path / "v.nc")
    with netCDF4.Dataset(tmp_path / "v.nc") as f:
        want = np.asarray(f.variables["inputs"][37:2011, :])
    monkeypatch.setattr(ncdata, "READ_BLOCK", 7 * 5 * 4)   # 7 rows a time
    got = ncdata.read_rows(tmp_path / "v.nc", 37, 2011, chunkbuf.ChunkBuffers())
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(ncdata.read_rows(tmp_path / "v.nc", 37, 2011), want)
    with netCDF4.Dataset(tmp_path / "v.nc", "a") as f:   # two rows never written (fill)
        v = f.variables["inputs"]
        fill = ncdata.fill_value(v)
        v[100, :] = fill
        v[1500, :] = fill
    with pytest.raises(DataError, match=r"row 100 \(and 1 more of rows 37:2011\) holds only "
                                        r"the fill value"):
        ncdata.read_rows(tmp_path / "v.nc", 37, 2011)
    assert ncdata.first_nonfinite_row(want) is None
    want[1500 - 37, 3] = np.inf
    assert ncdata.first_nonfinite_row(want) == 1500 - 37
