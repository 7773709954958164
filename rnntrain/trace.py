"""``rnntrain train --trace FILE``: a Chrome/Perfetto trace of a window of training steps.

Every thread of every rank records begin/end spans (reader loads, worker tasks, barrier
waits, the step phases of the main thread, the gradient collective) while the global step
is inside the window ``[first, last)``. At the end of training the ranks' events travel to
rank 0 (one ``allgather``), which writes one trace-event JSON file: open it in
https://ui.perfetto.dev or chrome://tracing. Each rank is a process ("rank N"), each
thread a track named after the thread.

Disabled (the default) it costs one global check per call: ``span()`` returns a shared
do-nothing context manager. Recording appends a tuple to a list (atomic under the GIL), so
worker threads need no lock. Clocks: each rank's timestamps are relative to a reference
taken right after a barrier at start-up, so ranks line up to within the barrier's skew
even on different hosts.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write

_on = False                 # inside the window: the one check on the hot path
_cfg: dict | None = None    # {"path", "first", "last"} once configure() was called
_events: list = []          # (name, t0_ns, t1_ns, thread ident, args)
_threads: dict[int, str] = {}
_t_ref = 0                  # perf_counter_ns() at the aligned start


class _Null:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


_NULL = _Null()


class _Span:
    __slots__ = ("name", "args", "t0")

    def __init__(self, name, args):
        self.name, self.args = name, args

    def __enter__(self):
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *_):
        t = threading.current_thread()
        _threads.setdefault(t.ident, t.name)
        _events.append((self.name, self.t0, time.perf_counter_ns(), t.ident, self.args))
        return False


def span(name: str, **args):
    """``with trace.span("load chunk", chunk=k):`` records a span while tracing is on."""
    if not _on:
        return _NULL
    return _Span(name, args)


def complete(name: str, t0: float, t1: float, thread: threading.Thread | None = None, **args):
    """Record a span measured elsewhere (``time.perf_counter()`` seconds) on ``thread``
    (default: the calling thread), e.g. a worker's barrier wait timed by the pool."""
    if not _on:
        return
    t = thread or threading.current_thread()
    _threads.setdefault(t.ident, t.name)
    _events.append((name, int(t0 * 1e9), int(t1 * 1e9), t.ident, args))


def parse_window(text: str) -> tuple[int, int]:
    """``"A:B"`` → (A, B): trace global steps A ≤ step < B (0-based)."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise UserError(f"--trace-steps {text!r} must look like A:B (e.g. 10:20)") from None
    if a < 0 or b <= a:
        raise UserError(f"--trace-steps {text!r}: need 0 <= A < B")
    return a, b


def configure(path: str | None, window: tuple[int, int] = (1, 11)):
    """Called by the CLI before training; ``path=None`` disables tracing."""
    global _cfg, _on, _events, _threads
    _on, _events, _threads = False, [], {}
    _cfg = None if path is None else {"path": str(path), "first": window[0], "last": window[1]}
    if _cfg is not None:
        parent = Path(path).resolve().parent
        try:  # fail now, not after the training
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--trace {path}: cannot create folder {parent} "
                            f"({e.strerror})") from None


def enabled() -> bool:
    return _cfg is not None


def attach(wait_for_all: Callable[[], None]):
    """Align the clocks of the ranks: ``wait_for_all`` is the ranks' barrier
    (``parallel.collectives.wait_for_all``; the tracer imports no stage, so it is passed
    in), called on every rank at the same point when tracing is on."""
    global _t_ref, _on
    if _cfg is None:
        return
    wait_for_all()
    _t_ref = time.perf_counter_ns()
    _on = _cfg["first"] == 0  # from step 0: include the first chunk load and the set-up


def begin_step(step: int):
    """Switch recording on for the steps inside the window (main thread, step start)."""
    global _on
    if _cfg is not None:
        _on = _cfg["first"] <= step < _cfg["last"]


def phases(step: int, t: tuple, **args):
    """The main thread's phases of one step from its timestamps t0..t5 (perf_counter s):
    data wait, compute (pool to barrier), reduce, allreduce, update; then switch recording
    off after the window's last step (validation is not traced)."""
    global _on
    if not _on:
        return
    names = ("data wait", "compute", "reduce tasks", "allreduce", "update")
    complete("step", t[0], t[-1], step=step, **args)
    for name, a, b in zip(names, t[:-1], t[1:]):
        complete(name, a, b, step=step)
    _on = step + 1 < _cfg["last"]


def _rank_events(rank: int) -> list[dict]:
    """This rank's events as trace-event dicts (µs relative to the aligned start)."""
    main = threading.main_thread().ident
    ids = {ident: i for i, ident in enumerate(sorted(_threads, key=lambda k: (
        k != main, _threads[k])))}  # main thread first, then by name
    out = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
            "args": {"name": f"rank {rank}"}},
           {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
            "args": {"sort_index": rank}}]
    for ident, name in _threads.items():
        out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": ids[ident],
                    "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": ids[ident],
                    "args": {"sort_index": ids[ident]}})
    for name, t0, t1, ident, args in list(_events):
        out.append({"name": name, "cat": name.split()[0], "ph": "X", "pid": rank,
                    "tid": ids[ident], "ts": round((t0 - _t_ref) / 1e3, 3),
                    "dur": round(max(t1 - t0, 0) / 1e3, 3), "args": args})
    return out


def finish(rank: int, size: int, gather_all: Callable[[list], list],
           failed: bool = False) -> str | None:
    """Gather every rank's events on rank 0 (``gather_all``: every rank's list, in rank
    order; ``parallel.collectives.gather_all``) and write the file; returns its path on
    rank 0.

    After a failure a collective could hang (a rank may be gone), so each rank writes its
    own ``FILE.rankN.json`` instead."""
    global _on, _cfg
    if _cfg is None:
        return None
    _on = False
    path, cfg = _cfg["path"], _cfg
    _cfg = None
    mine = _rank_events(rank)
    if failed:
        if size > 1:
            path = f"{path}.rank{rank}.json"
        _write(path, mine, cfg, [rank])
        return path
    gathered = gather_all(mine)
    if rank != 0:
        return None
    events = [e for rank_events in gathered for e in rank_events]
    _write(path, events, cfg, list(range(size)))
    spans = sum(e["ph"] == "X" for e in events)
    print(f"trace: {spans} spans of steps {cfg['first']}:{cfg['last']} from {size} "
          f"rank(s) written to {path} (open in https://ui.perfetto.dev)", file=sys.stderr)
    return path


def _write(path: str, events: list, cfg: dict, ranks: list[int]):
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"tool": "rnntrain", "steps": f"{cfg['first']}:{cfg['last']}",
                         "ranks": ranks}}
    try:
        atomic_write(path, json.dumps(doc))
    except OSError as e:  # never mask the training's own outcome (this runs in a finally)
        print(f"warning: --trace {path} not written ({e.strerror})", file=sys.stderr)
