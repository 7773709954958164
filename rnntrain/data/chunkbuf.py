"""Memory for the chunks a reader loads, mapped once and used again (``ChunkBuffers``).

The chunk reader (``rnntrain.data.reader``) holds at most two chunks. Read into fresh
arrays, every chunk would still put a block of a new size (the chunk's frames, tens of MB)
into the process heap while the workers allocate the step's tensors there. Under
``compute.allocator = "cache"`` (one arena, every block in it, nothing given back on
``free``: rnntrain/compute/allocator.py) those chunk blocks land between the step's
blocks, and the holes each leaves when it is released are refilled by the step's tensors
and by the next chunks in another layout every time; the loop's trim at each chunk switch
returns the free pages, but the layout a chunk's steps touch again varies from chunk to
chunk, and the largest of them sets the epoch's peak: on 10x the chunks the peak RSS
rose by +1.5 to +13.4 % (+8.3 % in the median of 8 runs; with this: -1.9 to +8.2 %,
median +0.9 %; docs/threads.md, "Peak RSS and the number of chunks").

``ChunkBuffers`` keeps the chunks out of the heap: each chunk's rows are read into an
anonymous mapping of its own, and a mapping no array views any more serves the next
chunk that fits, with its pages still resident (no page faults, no zeroing). A mapping
is free again when nothing references it: a view of it (an array of the payload, a tensor
made from one) holds a reference, so one kept past the chunk's release is never
overwritten; the next chunk then gets a new mapping instead. Free mappings beyond
``keep`` are unmapped. With the reader's two chunks, the memory for chunk frames is two
mappings the size of the largest chunk (plus ``HEADROOM``), however many chunks the
dataset has.

    buffers = ChunkBuffers()
    rows = buffers.take((T, F))           # (T, F) float32 array in a mapping
"""
from __future__ import annotations

import mmap
import sys
import threading

import numpy as np

HEADROOM = 1 / 16  # a new mapping is this much larger than asked: chunks differ a little
_PRIVATE = getattr(mmap, "MAP_PRIVATE", None)  # Unix (fileno -1 adds MAP_ANONYMOUS)


def _free(blocks: list, i: int) -> bool:
    """No array views ``blocks[i]``: the only references are the list's and the call's."""
    return sys.getrefcount(blocks[i]) == 2


class ChunkBuffers:
    """Mappings for chunk frames, handed out again once nothing views them (see the
    module docstring). ``take`` may be called from one thread at a time (the loader's);
    the arrays it returns may be read and dropped on any thread."""

    def __init__(self, keep: int = 2):
        """keep: free mappings kept for the next chunks (the reader's resident chunks)."""
        self.keep = keep
        self._blocks: list[mmap.mmap] = []
        self._lock = threading.Lock()
        # instrumentation (read by tests and the benchmark)
        self.maps = 0              # mappings made so far
        self.mapped_bytes = 0      # bytes mapped now
        self.max_mapped_bytes = 0  # the most bytes mapped at once

    def take(self, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """An uninitialised array of ``shape`` in a mapping nothing else views."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = max(count * dtype.itemsize, 1)
        with self._lock:
            free = [i for i in range(len(self._blocks)) if _free(self._blocks, i)]
            fits = [i for i in free if len(self._blocks[i]) >= nbytes]
            if fits:
                use = min(fits, key=lambda i: len(self._blocks[i]))
            else:  # none free or large enough: free ones too small go first
                for i in sorted(free, reverse=True):
                    self._unmap(i)
                free = []
                use = self._map(nbytes + int(nbytes * HEADROOM))
            block = self._blocks[use]
            # unmap free mappings over ``keep`` (a chunk held past its release made one)
            for i in sorted((i for i in free if i != use), reverse=True):
                if len(self._blocks) <= self.keep:
                    break
                self._unmap(i)
        return np.frombuffer(block, dtype, count).reshape(shape)

    def _map(self, nbytes: int) -> int:
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        self._blocks.append(mmap.mmap(-1, size) if _PRIVATE is None
                            else mmap.mmap(-1, size, flags=_PRIVATE))
        self.maps += 1
        self.mapped_bytes += size
        self.max_mapped_bytes = max(self.max_mapped_bytes, self.mapped_bytes)
        return len(self._blocks) - 1

    def _unmap(self, i: int):
        block = self._blocks.pop(i)
        self.mapped_bytes -= len(block)
        block.close()
