"""The double-buffered chunk reader.

One loader thread and two slots: while the trainer works on chunk k the thread loads
chunk k+1. Chunk k-1 is released (``next()``) before k+1 may start loading, so at most two
chunks are resident. The consumer waits on a condition variable only when the next chunk
is not complete yet. Every NetCDF call of a training process happens on this thread
(the NetCDF/HDF5 libraries are not thread-safe). A loader error is raised in the consumer
by the ``next()`` that wanted that chunk; ``close()`` joins the thread, mid-epoch too.
The bound holds in memory when the consumer drops its references to the old payload
before calling ``next()`` (the loader may start on the chunk after next at once).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from rnntrain import trace


class ChunkReader:
    def __init__(self, load: Callable[[int], dict], order: list[int],
                 name: str = "rnntrain-reader", max_resident: int = 2):
        """load: chunk id → payload (runs on the loader thread); order: chunk ids to serve."""
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

    def _run(self):
        for pos, k in enumerate(self._order):
            with self._cond:
                while self._resident >= self._limit and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._resident += 1
                self.max_resident_seen = max(self.max_resident_seen, self._resident)
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

    def next(self) -> tuple[int, dict]:
        """Release the chunk held so far and return (chunk id, payload) of the next one."""
        t0 = time.perf_counter()
        with self._cond:
            if self._held is not None:
                self._resident -= 1
                self._held = None
                self._cond.notify_all()
            self._pos += 1
            if self._pos >= len(self._order):
                raise StopIteration
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
