"""The thread-pool batch scheduler.

The main thread splits a batch into tasks (micro-batches of similar length and about equal
cost) and puts them in a shared queue. Worker threads take tasks under the lock and sleep
on a condition variable while the queue is empty. When every task of the batch is done
and all workers are idle (the barrier), ``run`` returns the results in task order, so the
caller can reduce the per-task gradients in a fixed order: the result is bit-identical
whatever the thread timing. PyTorch releases the GIL inside its kernels, so two workers
with one intra-op thread each keep two cores busy.

Task sizing (``split_tasks``) uses a fixed cost model of lengths alone (``CostModel``), so
the task boundaries, and with them the summation order, never depend on timing.

Errors: an exception in a task is re-raised by ``run`` in the main thread (TaskError,
naming the worker and the task); the remaining queued tasks of that batch are dropped and
the pool stays usable. A failure of a worker itself (its start-up hook raises, or
anything else ends its thread: a ``BaseException`` such as ``SystemExit`` out of a task,
an error in the loop) marks the pool broken, as CPython's ``ThreadPoolExecutor`` does
when an initializer fails: the other workers are stopped and joined, and the constructor,
``submit``, ``run`` and ``wait`` raise ``BrokenPool`` in the caller at once, never wait
for a worker that is gone. ``close()`` wakes and joins every worker.
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from rnntrain import trace


class TaskError(RuntimeError):
    """A task failed in a worker thread."""


class BrokenPool(TaskError):
    """A worker failed outside a task (start-up hook, or its thread ended): the pool
    cannot run batches any more (CPython's ``BrokenThreadPool``)."""


@dataclass
class Task:
    """A micro-batch: ``index`` is its position in the batch (the reduce order)."""
    index: int
    seqs: tuple[int, ...]
    payload: Any = None


@dataclass
class BatchTiming:
    wall_s: float = 0.0                  # enqueue → barrier release
    busy_s: list = field(default_factory=list)   # per worker: time spent in tasks
    idle_s: list = field(default_factory=list)   # per worker: waiting for the slowest

    @property
    def barrier_share(self) -> float:
        """Share of worker time spent idle at the barrier (0 = perfectly balanced)."""
        tot = self.wall_s * len(self.busy_s)
        return sum(self.idle_s) / tot if tot > 0 else 0.0


class WorkerPool:
    def __init__(self, fn: Callable[[int, Task], Any], workers: int, intra_threads: int = 1,
                 name: str = "rnntrain-worker", on_start: Callable[[int], None] | None = None,
                 inline: bool = False):
        """fn(worker_id, task) → result, called on worker threads; on_start(worker_id) once
        on each worker thread before its first task (per-worker state: a CUDA stream, pinned
        buffers). Sets torch's intra-op threads to ``intra_threads`` (process-wide, see
        ``set_intra_threads``).

        ``inline`` (one worker only): no thread; ``run`` calls fn on the calling thread.
        For one worker with several intra-op threads on the CPU: GNU OpenMP gives every
        thread that opens a parallel region its own team, and once the teams hold more
        threads than there are cores it stops spinning between regions, so each of the
        LSTM kernel's many short regions waits for a sleeping thread to wake up (the
        slowdown is in docs/threads.md, "Settings"). Inline, the task and the update share
        the main thread's one team.
        """
        assert workers >= 1 and intra_threads >= 1
        assert not inline or workers == 1, "inline runs exactly one worker"
        set_intra_threads(intra_threads)
        self._fn, self.workers, self.intra_threads = fn, workers, intra_threads
        self._on_start = on_start
        self._inline, self._started = inline, False
        self._submitted: Sequence[Task] | None = None  # inline: the batch ``wait`` runs
        self._t_submit = 0.0
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)   # workers wait here for tasks
        self._idle_cv = threading.Condition(self._lock)  # the main thread waits here
        self._queue: deque[Task] = deque()
        self._idle = 0
        self._want_free = False        # the caller waits in ``wait_for_a_free_worker``
        self._pending = 0              # tasks of the current batch not finished yet
        self._results: list = []
        self._error: tuple | None = None
        self._broken: BrokenPool | None = None  # set once, by the first failing worker
        self._closed = False
        self._busy = [0.0] * workers
        self._last_end = [0.0] * workers
        self._threads = [] if inline else [
            threading.Thread(target=self._loop, args=(w,), name=f"{name}-{w}", daemon=True)
            for w in range(workers)]
        if inline:
            self._idle = workers
        for t in self._threads:
            t.start()
        with self._lock:  # all workers up and idle before the first batch
            while self._idle < workers and self._broken is None:
                self._idle_cv.wait()
        self._raise_if_broken()

    def _loop(self, w: int):
        """A worker thread: start-up, then tasks until closed. Whatever ends the thread
        otherwise marks the pool broken (the caller would wait for this worker forever)."""
        phase = "start-up hook"
        try:
            # Flush denormals to zero on this thread, as TensorFlow does on its CPU
            # threads: gradients that decay through long recurrences reach denormal
            # floats, each of which costs the CPU ~100 cycles (docs/threads.md,
            # "Settings"). MXCSR is per thread, so every worker sets it for itself.
            torch.set_flush_denormal(True)
            if self._on_start is not None:
                self._on_start(w)
            phase = "worker loop"
            self._serve(w)
        except BaseException as e:
            self._break(w, phase, e)

    def _break(self, w: int, phase: str, e: BaseException):
        """Mark the pool broken (first failure wins), stop the other workers and wake the
        caller, wherever it waits."""
        with self._lock:
            if self._broken is None:
                self._broken = BrokenPool(f"worker pool broken: worker {w} failed in its "
                                          f"{phase}: {type(e).__name__}: {e}")
                self._broken.__cause__ = e
            self._closed = True
            self._queue.clear()
            self._work.notify_all()
            self._idle_cv.notify_all()

    def _raise_if_broken(self):
        """Raise the pool's BrokenPool after joining the workers that are left."""
        if self._broken is None:
            return
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
        raise self._broken

    def _serve(self, w: int):
        while True:
            with self._lock:
                self._idle += 1
                if self._idle == self.workers or (self._want_free and not self._queue):
                    self._idle_cv.notify()
                while not self._queue and not self._closed:
                    self._work.wait()
                if self._closed:
                    return
                task = self._queue.popleft()
                self._idle -= 1
                if self._want_free and not self._queue and self._idle:
                    self._idle_cv.notify()  # the last task is taken and a worker is left over
            t0 = time.perf_counter()
            try:
                with trace.span("task", index=task.index, seqs=len(task.seqs)):
                    res, err = self._fn(w, task), None
            except Exception as e:  # reaches the main thread through run()
                res, err = None, e
            # a BaseException (SystemExit, KeyboardInterrupt) ends this thread: _loop
            # marks the pool broken
            t1 = time.perf_counter()
            with self._lock:
                self._busy[w] += t1 - t0
                self._last_end[w] = t1
                self._results[task.index] = res
                self._pending -= 1
                if err is not None and self._error is None:
                    self._error = (w, task, err)
                    self._pending -= len(self._queue)  # drop the rest of the batch
                    self._queue.clear()
            # drop our references before sleeping: an idle worker must not keep the last
            # task's frames (and so its whole chunk) alive while the reader loads the next
            task = res = err = None

    def run(self, tasks: Sequence[Task]) -> tuple[list, BatchTiming]:
        """Run one batch; return the results in task order once the barrier is reached."""
        self.submit(tasks)
        return self.wait()

    def submit(self, tasks: Sequence[Task]):
        """Hand out one batch and return at once (the workers start on it); ``wait`` then
        returns its results. The caller may do other work in between (the next batch's
        task split): that is time the main thread would otherwise spend at the barrier.
        Inline (no worker thread), the tasks run in ``wait``."""
        assert all(t.index == i for i, t in enumerate(tasks)), "tasks must be indexed 0..n-1"
        self._raise_if_broken()
        if self._inline:
            assert self._submitted is None, "wait for the previous batch first"
            self._submitted = tasks
            return
        self._t_submit = time.perf_counter()
        with self._lock:
            assert not self._closed, "pool is closed"
            assert self._pending == 0 and not self._queue
            self._results = [None] * len(tasks)
            self._busy = [0.0] * self.workers
            self._last_end = [self._t_submit] * self.workers
            self._error = None
            self._queue.extend(tasks)
            self._pending = len(tasks)
            self._work.notify(min(len(tasks), self.workers))

    def wait_for_a_free_worker(self):
        """After ``submit``: return once a worker has nothing left to take (the queue is
        empty and a worker is idle), or the batch has ended. Python work the caller does
        next (the next batch's task split) holds the GIL; done right after ``submit`` it
        holds back the woken workers, which need the GIL to start their tasks, while here
        it runs on the core a worker has left (docs/threads.md, "The update and the
        reverse"). Inline (no worker thread): returns at once."""
        if self._inline:
            return
        with self._lock:
            self._want_free = True
            while ((self._queue or self._idle == 0) and self._pending > 0
                   and self._broken is None and not self._closed):
                self._idle_cv.wait()
            self._want_free = False

    def wait(self) -> tuple[list, BatchTiming]:
        """The submitted batch's results in task order, once the barrier is reached."""
        if self._inline:
            tasks, self._submitted = self._submitted, None
            assert tasks is not None, "nothing submitted"
            return self._run_inline(tasks)
        t0 = self._t_submit
        with self._lock:
            # the barrier: all tasks done and every worker back in the idle state
            while (self._pending > 0 or self._idle < self.workers) and self._broken is None:
                self._idle_cv.wait()
            t1 = time.perf_counter()
            results, error = self._results, self._error
            timing = BatchTiming(t1 - t0, list(self._busy), [t1 - e for e in self._last_end])
        self._raise_if_broken()
        for w, th in enumerate(self._threads):  # each worker's wait for the slowest one
            trace.complete("barrier wait", self._last_end[w], t1, th)
        if error is not None:
            w, task, e = error
            raise TaskError(f"worker {w} failed on task {task.index} (sequences "
                            f"{list(task.seqs)[:10]}{' ...' if len(task.seqs) > 10 else ''}): "
                            f"{type(e).__name__}: {e}") from e
        return results, timing

    def _run_inline(self, tasks: Sequence[Task]) -> tuple[list, BatchTiming]:
        self._raise_if_broken()
        assert not self._closed, "pool is closed"
        if not self._started:
            if self._on_start is not None:
                try:
                    self._on_start(0)
                except BaseException as e:
                    self._break(0, "start-up hook", e)
                    self._raise_if_broken()
            self._started = True
        t0 = time.perf_counter()
        results = [None] * len(tasks)
        with task_settings(self.intra_threads):  # as on a worker thread, for the tasks only
            for task in tasks:
                try:
                    with trace.span("task", index=task.index, seqs=len(task.seqs)):
                        results[task.index] = self._fn(0, task)
                except Exception as e:
                    raise TaskError(f"worker 0 failed on task {task.index} (sequences "
                                    f"{list(task.seqs)[:10]}"
                                    f"{' ...' if len(task.seqs) > 10 else ''}): "
                                    f"{type(e).__name__}: {e}") from e
        wall = time.perf_counter() - t0
        return results, BatchTiming(wall, [wall], [0.0])

    def close(self):
        with self._lock:
            self._closed = True
            self._work.notify_all()
        for t in self._threads:
            t.join()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


@dataclass(frozen=True)
class CostModel:
    """Predicted cost of a task of N sequences padded to T_max frames:
    a·N·T_max + b·N + c + d·T_max.

    Units are "padded frames" (a = 1): b is the per-sequence cost (CTC, best-path decode,
    collate), c the per-task cost (Python and dispatch overhead, mostly under the GIL) and
    d the per-time-step cost that does not grow with N (each step of the recurrence is one
    small product and a kernel call whatever the batch: large in bf16, where oneDNN's
    per-step overhead is ~10 frames' work), all in frame equivalents. The constants are
    fixed, never timed at run time: task boundaries decide the order of the gradient sum,
    so they must depend on lengths alone for a run to be reproducible. ``fit`` recovers
    them from measured task times (bench/threads.py prints the fit for the default and
    the reference model).
    """
    a: float = 1.0
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0

    def __call__(self, n, t_max):
        return self.a * n * t_max + self.b * n + self.c + self.d * t_max

    @classmethod
    def fit(cls, n, t_max, seconds) -> "CostModel":
        """Least squares of seconds ≈ a·N·T + b·N + c + d·T over measured tasks, rescaled
        so that a = 1; negative coefficients (noise) are clipped to 0."""
        n, t_max, y = (np.asarray(v, dtype=float) for v in (n, t_max, seconds))
        design = np.stack([n * t_max, n, np.ones_like(n), t_max], axis=1)
        (a, b, c, d), *_ = np.linalg.lstsq(design, y, rcond=None)
        assert a > 0, "task time does not grow with padded frames: measurement broken"
        return cls(1.0, max(b / a, 0.0), max(c / a, 0.0), max(d / a, 0.0))

    @classmethod
    def for_model(cls, flops_per_frame: float, params: int, layer_dirs: int = 0,
                  precision: str = "fp32", subsample: int = 1) -> "CostModel":
        """Per-sequence, per-task and per-step overheads in frame equivalents of a model.

        The constants below (seconds per task, per parameter, per sequence and per time
        step, and the frame throughput, for fp32 and bf16) were fitted once with ``fit``;
        docs/threads.md ("Task sizing") gives the fit and the command that measures it.
        A rough guess is enough: it moves task boundaries, never what a task computes;
        it keeps a batch whole when another task would cost more than it saves.
        """
        bf16 = precision == "bf16"
        frame_s = max(flops_per_frame, 1.0) / (260e9 if bf16 else 110e9)
        task_s = 1.2e-3 + (12e-9 if bf16 else 4e-9) * params
        step_s = (150e-6 if bf16 else 0.0) * layer_dirs / max(subsample, 1)  # per input frame
        return cls(1.0, 20e-6 / frame_s, task_s / frame_s, step_s / frame_s)


def split_tasks(seqs: Sequence[int], lengths: np.ndarray, n_tasks: int,
                cost: CostModel = CostModel(), workers: int | None = None
                ) -> list[tuple[int, ...]]:
    """Cut a batch into at most ``n_tasks`` micro-batches of neighbouring lengths and
    about equal predicted cost (``cost``), for ``workers`` workers (default: n_tasks).

    For each task count k ≤ n_tasks, the longest-first order is cut into k contiguous
    groups minimising the costliest one (exact for this order: bisection on the
    bottleneck with a greedy fill); the k whose groups finish first when dealt to the
    workers in queue order wins, ties going to fewer tasks. So a task is only created when
    it shortens the predicted batch time: tiny batches become one or two tasks, because
    each task pays the per-task cost ``c``. Tasks come out costliest first (a good queue
    order) and depend on the lengths alone.
    """
    if not len(seqs):
        return []
    order = sorted(seqs, key=lambda s: (-int(lengths[s]), s))  # longest first
    lens = [int(lengths[s]) for s in order]
    n_tasks = max(1, min(n_tasks, len(order)))
    workers = workers or n_tasks
    best, best_time = None, math.inf
    for k in range(1, n_tasks + 1):
        cuts = _min_max_cuts(lens, k, cost)
        bounds = [0, *cuts]
        costs = [cost(bounds[i + 1] - bounds[i], lens[bounds[i]]) for i in range(len(cuts))]
        t = _list_schedule(costs, workers)
        if t < best_time * (1 - 1e-9):
            best, best_time = cuts, t
    groups, start = [], 0
    for end in best:
        groups.append(tuple(order[start:end]))
        start = end
    return groups


def _min_max_cuts(lens: list[int], k: int, cost: CostModel) -> list[int]:
    """End indices of ≤ k contiguous groups of ``lens`` (descending) whose costliest group
    is as cheap as possible (to a relative 1e-4)."""
    ca, cb, cc, cd = cost.a, cost.b, cost.c, cost.d
    total = len(lens)

    def cost_of(n: int, t: int) -> float:  # CostModel.__call__'s expression, same rounding
        return ca * n * t + cb * n + cc + cd * t

    def fill(limit: float) -> list[int] | None:
        # Greedy: each group starting at ``start`` takes the most sequences whose cost
        # stays <= limit (at least one). The size comes from solving the cost formula,
        # then is corrected with the formula itself (its float value grows with n), so the
        # cuts are those of a scan over every sequence, in a few operations per group:
        # this runs on the main thread at every step.
        cuts, start = [], 0
        while start < total:
            t = lens[start]
            n = int(min(max((limit - cc - cd * t) / (ca * t + cb), 0.0), total))
            while n < total and cost_of(n + 1, t) <= limit:
                n += 1
            while n > 0 and cost_of(n, t) > limit:
                n -= 1
            start = min(start + max(n, 1), total)
            cuts.append(start)
            if len(cuts) > k:
                return None
        return cuts

    if k == 1:  # the bisection below could only ever return this
        return [total]
    # no group is cheaper than its longest sequence: cost(1, T) grows with T (coefficients
    # >= 0, and float rounding keeps the order), so the max over ``lens`` is at lens[0]
    lo = cost(1, lens[0])
    hi = cost(len(lens), lens[0])          # one group
    cuts = fill(hi)
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        c = fill(mid)
        if c is None:
            lo = mid
        else:
            hi, cuts = mid, c
    return cuts


def _list_schedule(costs: list[float], workers: int) -> float:
    """Finish time of tasks taken in order by the first free of ``workers`` workers."""
    free = [0.0] * workers
    for c in costs:
        w = free.index(min(free))
        free[w] += c
    return max(free)


def default_threads(threads: int, intra_threads: int, ranks_per_node: int = 1) -> int:
    """Worker threads for this process (``threads`` itself when set).

    ``threads = 0`` fills this rank's share of the usable cores (CPU affinity, so taskset
    and container limits count) with workers of ``intra_threads`` each.
    """
    cores = max(1, usable_cores() // max(ranks_per_node, 1))
    return threads or max(1, cores // intra_threads)


# oversubscription past this many threads per usable core only adds switching: a typo
# such as threads = 10000 would start 20,000 threads (workers and their OpenMP teams)
MAX_THREADS_PER_CORE = 4


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def cap_threads(workers: int, intra: int, ranks_per_node: int = 1, device=None) -> int:
    """``workers`` limited to MAX_THREADS_PER_CORE threads (workers x intra-op threads x
    ranks on this node) per usable core, with a warning on stderr when it is cut."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        limit = 64  # GPU: workers feed streams; more than a few never help
    else:
        limit = max(1, MAX_THREADS_PER_CORE * usable_cores() // max(intra * ranks_per_node, 1))
    if workers <= limit:
        return workers
    import sys
    print(f"rnntrain: warning: compute.threads = {workers} (x intra_threads {intra} x "
          f"{ranks_per_node} rank(s) on this node) is far more than the {usable_cores()} "
          f"usable cores; using {limit} workers", file=sys.stderr, flush=True)
    return limit


def set_intra_threads(n: int):
    """Set torch's intra-op thread count, once, from the main thread.

    Measured with this torch (OpenMP + MKL backends): ``torch.set_num_threads`` is
    process-wide, not per thread: a call on any thread changes the count every thread
    uses from its next parallel region on (a worker that set 1 spins 2 OpenMP threads once
    the main thread sets 2). So the pool's workers do not set it themselves; the count is
    set once here, and the main thread's reduce and optimizer step use it too.
    """
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@contextmanager
def task_settings(intra_threads: int = 1):
    """Run the enclosed code as the pool runs a task: ``intra_threads`` intra-op threads
    and denormals flushed to zero on this thread; both restored on exit.

    A float sum depends on how a kernel splits it over threads, and a flushed denormal is
    a different number: a reference computed outside the pool must use these settings to
    match the pool bit for bit (the default thread count is the core count, which differs
    between machines).
    """
    old = torch.get_num_threads()
    set_intra_threads(intra_threads)
    # set_flush_denormal has no getter; the main thread runs with it off (see _loop)
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        set_intra_threads(old)


@contextmanager
def intra_threads(n: int):
    """Temporarily use ``n`` intra-op threads on every thread (e.g. the whole machine for
    validation, which runs on the main thread while the workers sleep)."""
    old = torch.get_num_threads()
    set_intra_threads(n)
    try:
        yield
    finally:
        set_intra_threads(old)
