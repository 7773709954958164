"""The large-block cache behind torch's CPU allocator (``compute.allocator = "capped"``;
under ``"cache"`` too, for blocks of 32 MiB and more, unbounded: ``allocator.CACHE_LARGE``).

``_cpucache.cpp`` (shipped with the package; its header has the details) replaces torch's
CPU allocator (``c10::SetCPUAllocator``, which only C++ can call) with one that keeps freed
blocks of at least ``THRESHOLD`` bytes as separate mappings and hands them out again by
size (the same size first, else resized with ``mremap``), so a step's workspaces are not
zeroed by the kernel again in every task. The bound is on the process's resident size: the
cache's free blocks are unmapped (least recently freed first) whenever the resident size
would pass the peak the process had without them (its resident size less the cache's free
blocks, sampled at every large allocation and free) plus ``SLACK``. Smaller blocks go to
torch's own allocator as before (glibc's heap, under the ``capped`` settings).

With ``MOVE`` (where the kernel has userfaultfd's ``UFFDIO_MOVE``, Linux 6.8+), a reused
block is handed out with only the pages its pattern's user had written by the start of its
backward (the forward part of oneDNN's LSTM workspace), and the pages a block's user wrote
during a backward are moved, when it is freed, into the pages the same thread's live
blocks will write next (the next-lower layer's workspace): the backward half of the
workspaces comes from pages already resident instead of pages the kernel zeroes, and the
process holds no more at its peak (docs/threads.md, "The allocator"). With ``FILL`` as
well, the pages a block handed out will likely touch and lacks are moved in from spare
resident pages (its own stale ones, a shrunk tail, evicted blocks, then the cache's free
blocks, least recently freed first), and at a backward's start the thread's last workspace
gets its backward part from the cache's free blocks: the resident size stays as it is and
the kernel zeroes fewer pages. ``RNNTRAIN_CPUCACHE_MOVE=off`` turns both off; where userfaultfd is missing or refused (an older kernel, seccomp) blocks are
reused whole as before, and ``moves()`` says why (``allocator.note`` logs it).

The wheel stays pure Python: the source is compiled on first use with the system's C++
compiler (``$CXX``, else ``c++``) against the torch in use (its headers, ``libc10``, its C++
ABI) into ``$XDG_CACHE_HOME/rnntrain`` (``~/.cache/rnntrain``), under a name keyed by the
source, torch's version and the compiler, written atomically (``fsutil.atomic_path``: MPI
ranks that build at once each rename a whole library over the same name); later runs load
it in milliseconds. ``RNNTRAIN_CPUCACHE=off`` disables it, ``RNNTRAIN_CPUCACHE=/path/lib.so``
loads a library built elsewhere (a missing or foreign file: the reason, naming the path).
Without a compiler, or when the build fails, ``install`` returns the reason (one line) and
``capped`` stays glibc's policy alone (``allocator.note`` logs it). A new build removes the
other libraries in that folder unused for ``PRUNE_DAYS`` (30 days: earlier torch versions).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

THRESHOLD = 2**20      # bytes: blocks at least this large are cached by size
SLACK = 32 * 2**20     # bytes: resident size <= its peak without the cache's free blocks + SLACK
UNBOUNDED = 2**62      # a slack that never evicts (compute.allocator = "cache": kept whole)
FIT_DIV = 8            # a cached block up to 1/FIT_DIV larger than asked is reused whole
AHEAD = 0              # % of a new block's pages not yet resident counted against the bound
MOVE = True            # move pages written during a backward into the next live blocks
FILL = True            # with MOVE: move spare resident pages into the pages a block will touch
PRUNE_DAYS = 30        # a new build removes other built libraries older than this
SOURCE = Path(__file__).with_name("_cpucache.cpp")
ENV = "RNNTRAIN_CPUCACHE"
MOVE_ENV = "RNNTRAIN_CPUCACHE_MOVE"
STATS = ("live", "cached", "cached_resident", "peak_live", "base_peak", "rss_peak", "hits",
         "remaps", "misses", "dropped_bytes", "evictions", "evicted_bytes", "released_bytes", "threshold",
         "slack", "fits", "faulted_hits", "faulted_fits", "faulted_remaps", "faulted_misses",
         "moving", "moves", "moved_bytes", "fills", "filled_bytes")
_lib: ctypes.CDLL | None = None


def cache_dir() -> Path:
    """Where built libraries are kept: ``$XDG_CACHE_HOME/rnntrain`` or ``~/.cache/rnntrain``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rnntrain"


def _compiler() -> list[str]:
    return (os.environ.get("CXX") or shutil.which("c++") or "g++").split()


def compile_library(stem: str, source: Path, flags: list[str], libs: list[str] = (),
                    key: tuple[str, ...] = ()) -> Path:
    """``source`` compiled by the system's C++ compiler into ``cache_dir()/STEM-KEY.so``,
    now unless already there; KEY hashes the source, the compiler and its version, the flags
    and ``key`` (what else the library depends on). Written atomically (MPI ranks that build
    at once each rename a whole library over the same name); a found library is touched and
    a new one prunes its kind's others (``prune``). ``libs`` go after the source (link
    order). Raises OSError (no compiler) or RuntimeError (the build failed, its first error
    line). Shared by this cache and ``lstmscan``."""
    cxx = _compiler()
    version = subprocess.run([*cxx, "--version"], capture_output=True, text=True,
                             timeout=60).stdout.split("\n")[0]  # FileNotFoundError: none
    digest = hashlib.sha256(b"\0".join(x.encode() for x in (
        source.read_text(), " ".join(cxx), version, " ".join(flags), " ".join(libs), *key))
    ).hexdigest()[:16]
    out = cache_dir() / f"{stem}-{digest}.so"
    if out.is_file():
        try:
            os.utime(out)  # its time is its last use: prune() keeps what is in use
        except OSError:
            pass
        return out
    from rnntrain import fsutil
    out.parent.mkdir(parents=True, exist_ok=True)
    fsutil.remove_dead_temps(out)  # what a killed build left
    with fsutil.atomic_path(out) as tmp:
        p = subprocess.run([*cxx, *flags, str(source), "-o", str(tmp), *libs],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            errs = [ln for ln in p.stderr.splitlines() if "error" in ln] or p.stderr.splitlines()
            raise RuntimeError(f"{' '.join(cxx)} failed: {(errs or ['no output'])[0].strip()}")
    prune(out)
    return out


def build() -> Path:
    """The library for this torch and compiler, compiled now unless already cached
    (``compile_library``, against the torch in use: its headers, ``libc10``, its C++ ABI).
    Raises OSError (no compiler) or RuntimeError (the build failed, its first error line)."""
    import torch
    tdir = Path(torch.__file__).parent
    abi = int(torch.compiled_with_cxx11_abi())
    return compile_library(
        "_cpucache", SOURCE,
        ["-O2", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
         f"-I{tdir / 'include'}"],
        [f"-L{tdir / 'lib'}", "-lc10", f"-Wl,-rpath,{tdir / 'lib'}"],
        key=(torch.__version__, str(tdir)))


def prune(keep: Path, max_age_days: float = PRUNE_DAYS) -> list[Path]:
    """Remove the other built libraries of ``keep``'s kind (``_cpucache-*.so``, or
    ``_lstmscan-*.so``: the part of its name before the key) beside it not used (built, or
    found by ``build``, which touches it) for ``max_age_days``: those of earlier torch
    versions, sources or compilers, which would otherwise pile up. A process that has one
    loaded keeps its mapping (an unlinked file stays mapped); ``keep``, the one in use, is
    never removed. Returns those removed."""
    cutoff = time.time() - max_age_days * 86400
    gone = []
    for p in keep.parent.glob(keep.name.split("-")[0] + "-*.so"):
        try:
            if p.name != keep.name and p.is_file() and not p.is_symlink() \
                    and p.stat().st_mtime < cutoff:
                p.unlink()
                gone.append(p)
        except OSError:  # removed by another process meanwhile, or not ours to remove
            pass
    return gone


def _load() -> ctypes.CDLL:
    """The library (``$RNNTRAIN_CPUCACHE`` when it names one, else ``build()``), loaded once.
    Raises OSError/RuntimeError with one line for the user (``install`` returns it)."""
    global _lib
    if _lib is None:
        choice = os.environ.get(ENV, "")
        if choice in ("", "on", "1"):
            path = build()
        else:
            path = Path(choice)
            if not path.is_file():
                raise RuntimeError(f"{ENV}={choice}: no such file (a library built by "
                                   f"rnntrain.compute.cpucache.build(), or 'off')")
        try:
            lib = ctypes.CDLL(str(path))
            nstats = lib.rnntrain_cpucache_nstats()
        except (OSError, AttributeError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0].removeprefix(f"{path}: ")
            raise RuntimeError(f"{path}: not a large-block cache library ({why})")
        if nstats != len(STATS):
            raise RuntimeError(f"{path}: built from another version of _cpucache.cpp "
                               f"({nstats} statistics, this one has {len(STATS)})")
        lib.rnntrain_cpucache_install.argtypes = [ctypes.c_size_t] * 6
        lib.rnntrain_cpucache_why_not_moving.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.rnntrain_cpucache_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        lib.rnntrain_cpucache_release.restype = ctypes.c_size_t
        _lib = lib
    return _lib


def unavailable() -> str | None:
    """Before torch is imported: None when ``install`` can likely put the cache in (Linux,
    not turned off, a library named or a compiler to build one), else why not (one line).
    ``allocator.configure("cache")`` asks it before any thread allocates, since the number
    of malloc arenas it picks holds from the first thread's first malloc on."""
    choice = os.environ.get(ENV, "")
    if choice.lower() in ("off", "0", "no"):
        return f"{ENV}={choice}"
    if sys.platform != "linux":
        return "not Linux (mmap/mremap)"
    if choice not in ("", "on", "1"):
        return None if Path(choice).is_file() else f"{ENV}={choice}: no such file"
    cxx = _compiler()[0]
    return None if shutil.which(cxx) else f"no C++ compiler ({cxx} not found; set CXX)"


def install(threshold: int | None = None, slack: int | None = None,
            fit_div: int | None = None, move: bool | None = None) -> str | None:
    """Put the cache in front of torch's CPU allocator (torch must be imported; call it
    before the workers allocate); the settings default to the module's (``THRESHOLD``,
    ``SLACK``, ``FIT_DIV``, ``MOVE``, the last off under ``RNNTRAIN_CPUCACHE_MOVE=off``),
    read now. None when it is in place, else why not (one line); ``moves()`` says whether
    pages are moved."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "no"):
        return f"{ENV}={os.environ[ENV]}"
    if sys.platform != "linux":
        return "not Linux (mmap/mremap)"
    try:
        lib = _load()
    except FileNotFoundError:
        return f"no C++ compiler ({' '.join(_compiler())} not found; set CXX)"
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    move = (MOVE if move is None else move) and \
        os.environ.get(MOVE_ENV, "").lower() not in ("off", "0", "no")
    rc = lib.rnntrain_cpucache_install(THRESHOLD if threshold is None else threshold,
                                       SLACK if slack is None else slack,
                                       FIT_DIV if fit_div is None else fit_div, AHEAD,
                                       int(move), int(FILL))
    return None if rc == 0 else {
        -1: "torch's CPU allocator has no raw deleter",
        -2: "another CPU allocator is installed"}.get(rc, f"install returned {rc}")


def active() -> bool:
    """Whether this process's torch CPU allocator is the cache."""
    return _lib is not None and stats()["threshold"] > 0


def moves() -> str | None:
    """None when the installed cache moves pages into live blocks, else why not (one line:
    the setting, or the userfaultfd call that failed and its error)."""
    if not active():
        return "the large-block cache is not installed"
    if stats()["moving"]:
        return None
    buf = ctypes.create_string_buffer(256)
    _lib.rnntrain_cpucache_why_not_moving(buf, len(buf))
    why = buf.value.decode(errors="replace")
    if why:
        return why
    if os.environ.get(MOVE_ENV, "").lower() in ("off", "0", "no"):
        return f"{MOVE_ENV}={os.environ[MOVE_ENV]}"
    return "turned off (cpucache.MOVE)"


def stats() -> dict[str, int]:
    """The cache's books (``STATS``; bytes and counts); all 0 when it is not installed."""
    if _lib is None:
        return dict.fromkeys(STATS, 0)
    out = (ctypes.c_uint64 * len(STATS))()
    _lib.rnntrain_cpucache_stats(out)
    return dict(zip(STATS, out))


def release() -> int:
    """Unmap every cached free block (``allocator.trim`` at a chunk switch); bytes released."""
    return int(_lib.rnntrain_cpucache_release()) if _lib is not None else 0
