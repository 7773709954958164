"""The process's memory allocator: keep freed memory for the next step (``compute.allocator``).

A training step allocates and frees the same large tensors every time (the LSTM's gate
workspace, the CTC lattices, activations). glibc hands blocks over its mmap threshold
straight back to the kernel on ``free`` and unmaps a worker arena's heap once it is empty, so
every step faults all of that memory in again, one zeroed 4 KiB page at a time: on the
reference model a third of a core went to the kernel (docs/threads.md, "The allocator").

``cache`` tells glibc, before the workers start, to serve every thread from one arena
(``M_ARENA_MAX`` 1: a worker's heap is never unmapped), every block from it, however large
(``M_MMAP_MAX`` 0: glibc caps its mmap threshold at 32 MiB, and a step of the reference
model allocates larger blocks: mapped fresh each time, they cost it 60,000-90,000 page
faults per task) and to keep what is freed (``M_TRIM_THRESHOLD``): after the first steps
the process reuses its own pages. The price is a higher resident peak, since freed
blocks of one shape cannot always serve the next shape: the reference model peaks 1.6x
higher than under ``system``.

``capped`` bounds that peak: the same single arena, but every block over ``CACHE_CAP``
(32 MiB, the most glibc's mmap threshold can be: ``M_MMAP_THRESHOLD``) is mapped from the
kernel and given back on ``free``, as under ``system``, and a free top of the heap over
``TOP_KEEP`` (64 MiB, what glibc's default trims at once its threshold has risen to 32 MiB)
goes back to the kernel on the ``free`` that makes it (``M_TRIM_THRESHOLD``; glibc trims
only the top, never the free blocks inside, so the steps' pages in use are not touched).
The large blocks are the few largest workspaces, whose sizes follow each task's T x N, so
no freed one fits the next; kept in the heap they fragment it, with small live blocks
pinned between them. Everything smaller is reused, and what a step frees above the
heap's live blocks is returned once it exceeds ``TOP_KEEP``. On the reference model it
peaked at ``system``'s resident size (-4 to +10 %, one and two workers; ``cache``: +34-61 %;
without the top trim 0 to +20 %) for 1-3 % more CPU time than without it, and 9-15 % more
than ``cache``, as ``system``: the pages given back are zeroed again when faulted in
(docs/benchmarks.md, "Peak RSS by allocator policy"; interleaved on ``bench flops``' workload,
2 workers, 6 rounds: 5-8x ``cache``'s kernel time, 86 % of its CPU efficiency in the
median). ``system`` leaves glibc's defaults.
Elsewhere than glibc (musl, macOS) all three are the same. ``rnntrain eval`` and
``decode`` apply the checkpoint's policy as well.

``trim`` hands the heap's free pages back to the kernel (``malloc_trim``). The loop calls
it when an epoch moves from one data chunk to the next: freed blocks that no later shape
fits would otherwise pile up over a long epoch, and the resident peak would grow with the
dataset (``bench reader``: +17 % for 10x the data without it, -1 to +7 % with it). A chunk
holds many steps (2M frames by default), so the pages the next step faults in again once
cost little; an epoch start is not a switch (one-chunk data would fault its whole working
set in again every epoch).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Literal

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -3, -4, -8
CACHE_CAP = 32 * 2**20  # bytes: under "capped", larger blocks are mapped and unmapped
TOP_KEEP = 64 * 2**20  # bytes: under "capped", a larger free heap top goes back on free
NEVER = 2**31 - 1  # M_TRIM_THRESHOLD: keep the top, however large
_applied: str | None = None


@functools.cache
def _libc():
    """glibc, or None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 (glibc only)
        libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    return libc


def trim() -> bool:
    """Return the heap's free pages to the kernel, under ``cache`` and ``capped`` only
    (glibc's own policy already does under ``system``). True when something was released."""
    if _applied not in ("cache", "capped"):
        return False
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def configure(mode: Literal["cache", "capped", "system"]) -> bool:
    """Set the allocator policy for this process (call before torch starts threads: the
    arena limit only holds for threads that have not allocated yet). Returns True when
    the policy took effect (glibc), False otherwise. Idempotent."""
    global _applied
    if mode == "system":
        return False
    if _applied == mode:
        return True
    libc = _libc()
    if libc is None:
        return False
    params = ([(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER)] if mode == "cache" else
              # glibc's default mapping count, the cap, the top trimmed over TOP_KEEP
              [(M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, CACHE_CAP), (M_TRIM_THRESHOLD, TOP_KEEP)])
    ok = all(libc.mallopt(p, v) == 1 for p, v in (*params, (M_ARENA_MAX, 1)))
    _applied = mode if ok else None
    return ok
