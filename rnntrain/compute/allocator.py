"""The process's memory allocator: keep freed memory for the next step (``compute.allocator``).

A training step allocates and frees the same large tensors every time (the LSTM's gate
workspace, the CTC lattices, activations). glibc hands blocks over its mmap threshold
straight back to the kernel on ``free`` and unmaps a worker arena's heap once it is empty, so
every step faults all of that memory in again, one zeroed 4 KiB page at a time: on the
reference model a third of a core went to the kernel (docs/threads.md, "The allocator").

``cache`` tells glibc, before the workers start, to keep what is freed
(``M_TRIM_THRESHOLD``: after the first steps the process reuses its own pages) and to serve
every block from its heaps, however large (``M_MMAP_MAX`` 0: glibc caps its mmap threshold
at 32 MiB, and a step of the reference model allocates larger blocks: mapped fresh each
time, they cost it 60,000-90,000 page faults per task). Each thread mallocs from an arena of
its own (``M_ARENA_MAX``: one per core and two more), so two workers do not wait for each
other's malloc lock on every tensor they allocate or free (with one arena for all, 67-72 %
of their sleeps were on it: docs/threads.md, "What the second worker waits for"), and an
arena keeps its heaps mapped once empty (``M_TOP_PAD`` 64 MiB). A thread arena's heap holds
64 MiB at most, and glibc maps a larger block on its own whatever ``M_MMAP_MAX`` says, so
torch's blocks of ``CACHE_LARGE`` (32 MiB) and more leave glibc for the large-block cache
(below) without its bound: a freed block is kept as it is and handed out again by size, a
larger one whole, and nothing is evicted. Where that cache cannot go in (no C++ compiler,
``RNNTRAIN_CPUCACHE=off``) ``cache`` serves all threads from one arena, as it did before
(``note`` says which). The price is a higher resident peak, since freed blocks of one shape
cannot always serve the next shape: the reference model peaks 18 % higher than under
``system`` (1,358 against 1,153 MB, docs/benchmarks.md's flops section, 2026-11-27, with
``compute.lstm = "scan"``; 1.7x with oneDNN's LSTM kernel, whose workspaces are larger),
and runs 1.08x as fast.

``capped`` bounds that peak and keeps the speed: one arena for all threads, and the large
blocks (at least ``cpucache.THRESHOLD``, 1 MiB) leave glibc altogether. A cache in front of
torch's CPU allocator (rnntrain/compute/cpucache.py and _cpucache.cpp, compiled on first
use) keeps each freed one as its own mapping and hands it out again by size, so the
workspaces are not zeroed again in every task, and never lets the process hold more than
its resident peak without the cache's free blocks plus ``cpucache.SLACK`` (32 MiB): it
unmaps the least recently freed ones first. glibc's part stays bounded as before: blocks
over ``CACHE_CAP`` (32 MiB, the most glibc's mmap threshold can be: ``M_MMAP_THRESHOLD``)
that do not come through torch are mapped and given back on ``free``, and a free top of
the heap over ``TOP_KEEP`` (64 MiB) goes back to the kernel on the ``free`` that makes it
(``M_TRIM_THRESHOLD``; glibc trims only the top, never the free blocks inside). Without a
C++ compiler (or with ``RNNTRAIN_CPUCACHE=off``) ``capped`` is that glibc part alone: the
peak of ``system`` at ``system``'s speed, as before the cache; the run log says which
(``note``). Where userfaultfd's ``UFFDIO_MOVE`` is there, the pages a backward writes into
a workspace move into the next layer's workspace when it is freed (``cpucache.MOVE``;
``note`` says whether), and the pages a block handed out lacks are moved in from spare
resident ones (``cpucache.FILL``). On the reference model (Intel Xeon, 2026-11-27) ``capped``
peaked at -15 to -5 % (one worker) and +0.3 to +5 % (two; -6 to +1 % with ``SLACK`` at
today's 32 MiB) of ``system``'s resident size at
96.5-100.5 % and 89.4-107.4 % (median 96 %) of ``cache``'s CPU efficiency, with as few page
faults as ``cache`` (without fills 85-96 % and 91-106 %, median 94 %; docs/benchmarks.md,
"Peak RSS by allocator policy").
``system`` leaves glibc's defaults.
Elsewhere than glibc (musl, macOS) all three are the same. ``rnntrain eval`` and
``decode`` apply the checkpoint's policy as well.

``trim`` hands the heap's free pages back to the kernel (``malloc_trim``), and the
large-block cache's free blocks (``cpucache.release``; under ``capped`` and ``cache``). The loop calls
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
import os
import sys
from typing import Literal

from rnntrain.compute import cpucache

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -2, -3, -4, -8
CACHE_CAP = 32 * 2**20  # bytes: under "capped", larger blocks are mapped and unmapped
TOP_KEEP = 64 * 2**20  # bytes: under "capped", a larger free heap top goes back on free
NEVER = 2**31 - 1  # M_TRIM_THRESHOLD: keep the top, however large
# M_TOP_PAD under "cache": glibc unmaps a thread arena's extra heap (64 MiB each) once it
# is empty unless the pad says to keep that much; kept, a worker's next task reuses its pages
HEAP_KEEP = 64 * 2**20
# under "cache": torch's blocks of at least this many bytes are kept by size outside glibc
# (cpucache, never evicted: UNBOUNDED slack): a thread arena's heap is 64 MiB at most, and
# glibc maps a larger block on its own (whatever M_MMAP_MAX says) and unmaps it on free
CACHE_LARGE = 32 * 2**20


def cache_arenas() -> int:
    """M_ARENA_MAX under "cache" (with the large-block cache): one arena per core and two
    more (the main thread, the reader), so that each worker thread mallocs and frees in its
    own arena: with one arena for all, two workers waited for its lock on every tensor they
    allocate or free (docs/threads.md, "What the second worker waits for")."""
    try:  # as compute.pool.usable_cores, which imports torch: this module must not
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return cores + 2


_applied: str | None = None
_cache_note: str | None = None  # "" = the large-block cache is in, else why not
_arenas = 1  # M_ARENA_MAX as set (cache: one per thread where the large-block cache can go in)


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
    (glibc's own policy already does under ``system``), and the large-block cache's free
    blocks too where it is in. True when something was released."""
    if _applied not in ("cache", "capped"):
        return False
    released = _cache_note == "" and cpucache.release() > 0
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0)) or released


def note() -> str | None:
    """One line for the run log on how ``cache`` and ``capped`` run (with the large-block
    cache, or why without it); None under ``system``."""
    if _applied == "cache":
        if _arenas == 1:  # decided before torch: no compiler, or the cache turned off
            return (f"allocator: cache, one malloc arena for all threads "
                    f"({cpucache.unavailable() or 'no large-block cache'})")
        if _cache_note == "":
            return (f"allocator: cache, a malloc arena per thread ({_arenas} at most), "
                    f"blocks of {CACHE_LARGE / 2**20:g} MiB and more kept by size "
                    f"(rnntrain.compute.cpucache)")
        return (f"allocator: cache, a malloc arena per thread without its large-block cache "
                f"({_cache_note or 'not installed'}): the largest blocks are mapped afresh "
                f"in every task")
    if _applied != "capped":
        return None
    if _cache_note == "":
        why = cpucache.moves()
        return (f"allocator: capped, blocks of {cpucache.THRESHOLD / 2**20:g} MiB and more "
                f"cached by size behind torch's CPU allocator (rnntrain.compute.cpucache), "
                + ("pages written in a backward moved into the next workspaces"
                   + (", spare pages into the blocks handed out" if cpucache.FILL else "")
                   if why is None else f"no page moves ({why})"))
    return (f"allocator: capped without its large-block cache ({_cache_note or 'not installed'}"
            f"): glibc's settings alone, at about system's speed")


def _large_cache(mode: str):
    """Once torch is imported: install the large-block cache (once), bounded under
    ``capped``, unbounded without page moves under ``cache``."""
    global _cache_note
    if _cache_note is None and "torch" in sys.modules:
        _cache_note = (cpucache.install() if mode == "capped" else
                       cpucache.install(threshold=CACHE_LARGE, slack=cpucache.UNBOUNDED,
                                        move=False)) or ""


def configure(mode: Literal["cache", "capped", "system"]) -> bool:
    """Set the allocator policy for this process (call before torch starts threads: the
    arena limit holds from the first thread's first malloc on). Returns True when the
    policy took effect (glibc), False otherwise. Idempotent. The call made once torch is
    imported installs the large-block cache (``cpucache``; ``note`` says whether it is in):
    `rnntrain train` calls it before and after importing torch. Under ``cache`` each thread
    gets its own arena only where that cache can go in (``cpucache.unavailable``): without
    it, a worker's blocks over its arena's 64 MiB heap would be mapped in every task."""
    global _applied, _arenas
    if mode == "system":
        return False
    if _applied != mode:
        libc = _libc()
        if libc is None:
            return False
        _arenas = cache_arenas() if mode == "cache" and cpucache.unavailable() is None else 1
        params = ([(M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER)]
                  + ([(M_TOP_PAD, HEAP_KEEP)] if _arenas > 1 else []) if mode == "cache" else
                  # glibc's default mapping count, the cap, the top trimmed over TOP_KEEP
                  [(M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, CACHE_CAP),
                   (M_TRIM_THRESHOLD, TOP_KEEP)])
        ok = all(libc.mallopt(p, v) == 1 for p, v in (*params, (M_ARENA_MAX, _arenas)))
        _applied = mode if ok else None
        if not ok:
            return False
    if mode == "capped" or (mode == "cache" and _arenas > 1):
        _large_cache(mode)
    return True
