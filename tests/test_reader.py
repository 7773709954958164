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
