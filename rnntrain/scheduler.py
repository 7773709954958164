"""The thread-pool batch scheduler.

The main thread splits a batch into tasks (micro-batches of similar length and about equal
cost) and puts them in a shared queue. Worker threads take tasks under the lock and sleep
on a condition variable while the queue is empty. When every task of the batch is done
and all workers are idle (the barrier), ``run`` returns the results in task order, so the
caller can reduce the per-task gradients in a fixed order: the result is bit-identical
whatever the thread timing. PyTorch releases the GIL inside its kernels, so two workers
with one intra-op thread each keep two cores busy.

Errors: an exception in a task is re-raised by ``run`` in the main thread (TaskError,
naming the worker and the task); the remaining queued tasks of that batch are dropped and
the pool stays usable. ``close()`` wakes and joins every worker.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import trace


class TaskError(RuntimeError):
    """A task failed in a worker thread."""


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
                 name: str = "rnntrain-worker", on_start: Callable[[int], None] | None = None):
        """fn(worker_id, task) → result, called on worker threads; on_start(worker_id) once
        per worker thread before its first task (sets torch's per-thread intra-op count)."""
        assert workers >= 1
        self._fn, self.workers, self.intra_threads = fn, workers, intra_threads
        self._on_start = on_start
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)   # workers wait here for tasks
        self._idle_cv = threading.Condition(self._lock)  # the main thread waits here
        self._queue: deque[Task] = deque()
        self._idle = 0
        self._pending = 0              # tasks of the current batch not finished yet
        self._results: list = []
        self._error: tuple | None = None
        self._closed = False
        self._busy = [0.0] * workers
        self._last_end = [0.0] * workers
        self._threads = [threading.Thread(target=self._loop, args=(w,), name=f"{name}-{w}",
                                          daemon=True) for w in range(workers)]
        for t in self._threads:
            t.start()
        with self._lock:  # all workers up and idle before the first batch
            while self._idle < workers:
                self._idle_cv.wait()

    def _loop(self, w: int):
        if self._on_start is not None:
            self._on_start(w)
        while True:
            with self._lock:
                self._idle += 1
                if self._idle == self.workers:
                    self._idle_cv.notify()
                while not self._queue and not self._closed:
                    self._work.wait()
                if self._closed:
                    return
                task = self._queue.popleft()
                self._idle -= 1
            t0 = time.perf_counter()
            try:
                with trace.span("task", index=task.index, seqs=len(task.seqs)):
                    res, err = self._fn(w, task), None
            except BaseException as e:  # reaches the main thread through run()
                res, err = None, e
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

    def run(self, tasks: Sequence[Task]) -> tuple[list, BatchTiming]:
        """Run one batch; return the results in task order once the barrier is reached."""
        assert all(t.index == i for i, t in enumerate(tasks)), "tasks must be indexed 0..n-1"
        t0 = time.perf_counter()
        with self._lock:
            assert not self._closed, "pool is closed"
            assert self._pending == 0 and not self._queue
            self._results = [None] * len(tasks)
            self._busy = [0.0] * self.workers
            self._last_end = [t0] * self.workers
            self._error = None
            self._queue.extend(tasks)
            self._pending = len(tasks)
            self._work.notify(min(len(tasks), self.workers))
            # the barrier: all tasks done and every worker back in the idle state
            while self._pending > 0 or self._idle < self.workers:
                self._idle_cv.wait()
            t1 = time.perf_counter()
            results, error = self._results, self._error
            timing = BatchTiming(t1 - t0, list(self._busy), [t1 - e for e in self._last_end])
        for w, th in enumerate(self._threads):  # each worker's wait for the slowest one
            trace.complete("barrier wait", self._last_end[w], t1, th)
        if error is not None:
            w, task, e = error
            raise TaskError(f"worker {w} failed on task {task.index} (sequences "
                            f"{list(task.seqs)[:10]}{' ...' if len(task.seqs) > 10 else ''}): "
                            f"{type(e).__name__}: {e}") from e
        return results, timing

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


def split_tasks(seqs: Sequence[int], lengths: np.ndarray, n_tasks: int) -> list[tuple[int, ...]]:
    """Cut a batch into at most ``n_tasks`` micro-batches of neighbouring lengths whose
    padded cost (n × longest) is about equal. Deterministic in its inputs."""
    if not len(seqs):
        return []
    order = sorted(seqs, key=lambda s: (-int(lengths[s]), s))  # longest first
    n_tasks = max(1, min(n_tasks, len(order)))
    total = sum(int(lengths[s]) for s in order)
    target = total / n_tasks
    out, cur, cost = [], [], 0
    for s in order:
        # padded cost if s joins: (len(cur)+1) × longest in cur
        longest = int(lengths[cur[0]]) if cur else int(lengths[s])
        if cur and (len(cur) + 1) * longest > target * 1.05 and len(out) < n_tasks - 1:
            out.append(tuple(cur))
            cur, cost = [], 0
        cur.append(s)
    out.append(tuple(cur))
    return out
