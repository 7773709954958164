"""The double-buffered chunk reader.

One loader thread and two slots: while the trainer works on chunk k the thread loads
chunk k+1. Chunk k-1 is released (``next()``) before k+1 may start loading, so at most two
chunks are resident. The consumer waits on a condition variable only when the next chunk
is not complete yet. Every NetCDF call of a training process happens on this thread
(the NetCDF/HDF5 libraries are not thread-safe). A loader error is raised in the consumer
by the ``next()`` that wanted that chunk (the chunks before it are served as usual);
``close()`` joins the thread, mid-epoch too.
The bound holds in memory when the consumer drops its references to the old payload
before calling ``next()`` (the loader may start on the chunk after next at once). The
training run's and evaluation's loads read the frames into the two mappings of a
``data.chunkbuf.ChunkBuffers`` (``Dataset.load_chunk(k, buffers)``), which serve each
chunk again once the consumer has let go of the one before: chunk memory is then two
buffers of the largest chunk, outside the heap, whatever the dataset's size.

The order can grow while the reader runs (``extend``): a training run keeps one reader
for all its epochs and its validation passes (``run.step.RunReader``), so the thread
reads the validation set during an epoch's last steps and the next epoch's first chunk
during validation, under the same bound. With nothing queued the thread sleeps.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Hashable, Iterable

from rnntrain import trace


class ChunkReader:
    def __init__(self, load: Callable[[Hashable], dict], order: Iterable[Hashable] = (),
                 name: str = "rnntrain-reader", max_resident: int = 2):
        """load: chunk id → payload (runs on the loader thread); order: chunk ids to serve
        (more can be appended with ``extend``)."""
        assert max_resident >= 2
        self._load, self._order, self._limit = load, list(order), max_resident
        self._cond = threading.Condition()
        self._ready: dict[int, dict] = {}   # position in order → payload
        self._resident = 0                  # loaded or being loaded, not yet released
        self._held: int | None = None       # position the consumer holds
        self._pos = -1                      # position of the last chunk served
        self._error: BaseException | None = None
        self._closed = False
        # instrumentation (read by tests and metrics)
        self.max_resident_seen = 0
        self.wait_s = 0.0
        self.load_s = 0.0
        self.loaded = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def extend(self, order: Iterable[Hashable]):
        """Append chunk ids to serve after those already queued."""
        with self._cond:
            self._order.extend(order)
            self._cond.notify_all()

    def _run(self):
        pos = 0
        while True:
            with self._cond:
                while (pos >= len(self._order) or self._resident >= self._limit) \
                        and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._resident += 1
                self.max_resident_seen = max(self.max_resident_seen, self._resident)
                k = self._order[pos]
            t0 = time.perf_counter()
            try:
                with trace.span("load chunk", chunk=k):
                    payload = self._load(k)
            except BaseException as e:  # delivered to the consumer, which names the chunk
                with self._cond:
                    self._error = e
                    self._resident -= 1
                    self._cond.notify_all()
                return
            with self._cond:
                self.load_s += time.perf_counter() - t0
                self.loaded += 1
                self._ready[pos] = payload
                self._cond.notify_all()
            payload = None  # the consumer's from now on: the thread keeps no reference
            pos += 1

    def next(self) -> tuple[Hashable, dict]:
        """Release the chunk held so far and return (chunk id, payload) of the next one."""
        t0 = time.perf_counter()
        with self._cond:
            if self._held is not None:
                self._resident -= 1
                self._held = None
                self._cond.notify_all()
            if self._pos + 1 >= len(self._order):
                raise StopIteration
            self._pos += 1
            while self._pos not in self._ready and self._error is None:
                self._cond.wait()
            if self._pos not in self._ready:
                raise self._error
            payload = self._ready.pop(self._pos)
            self._held = self._pos
            self.wait_s += time.perf_counter() - t0
            return self._order[self._pos], payload

    def close(self):
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()
