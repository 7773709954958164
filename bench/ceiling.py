"""The scaling ceiling that a task split sets: its tasks timed alone.

A step of W workers (or R ranks) finishes when its slowest lane does, and every task pays
a fixed cost whatever its size (oneDNN's per-call work in each LSTM direction, the
autograd graph, the CTC call). So cutting the same batch into more tasks, as two workers
or two ranks must, costs frames/s before any thread or rank waits for another. This module
runs every task of each setting's split alone, one after the other on one thread, with
the training ``TaskComputer``, and deals the measured times to the lanes as the step does
(a rank's tasks to its own worker; the pool's queue: each task to the first free worker).
The rate of one setting over another's is then the most that setting can reach: no pool,
barrier, reduce, exchange or update around the tasks, and no second core sharing the
memory system.

Not a section itself: ``bench.threads`` and ``bench.ranks`` print the ceilings beside
their measured ratios.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# a step: its lanes, each (workers, task groups of sequence ids); the step ends when its
# slowest lane does
Lane = tuple[int, Sequence[tuple[int, ...]]]
Step = Sequence[Lane]


@dataclass
class Ceiling:
    """One setting's tasks timed alone (best of the rounds)."""
    frames: int       # real frames of the steps
    busy_s: float     # every task's time added up (the split's total work)
    wall_s: float     # the sum over steps of the slowest lane's makespan
    tasks: int
    lanes: int        # workers (summed over a step's lanes)

    @property
    def fps(self) -> float:
        """Real frames over the wall time: the setting's best frames/s."""
        return self.frames / self.wall_s

    @property
    def balance(self) -> float:
        """Busy time over lanes x wall: what uneven tasks leave of the lanes' time."""
        return self.busy_s / (self.lanes * self.wall_s)


def thread_steps(batches, lengths: np.ndarray, workers: int, tasks_per_worker: int,
                 cost) -> list[Step]:
    """Each batch split for ``workers`` workers exactly as the step splits it
    (``pool.split_tasks``): one lane of ``workers``."""
    from rnntrain.compute.pool import split_tasks
    return [[(workers, split_tasks(tuple(b), lengths, workers * tasks_per_worker, cost,
                                   workers))] for b in batches]


def rank_steps(batches, lengths: np.ndarray, world: int, tasks_per_worker: int,
               cost) -> list[Step]:
    """Each global batch dealt to ``world`` ranks as the plan deals it (``snake_share``),
    every share split for its rank's one worker: one lane per rank."""
    from rnntrain.compute.pool import split_tasks
    from rnntrain.data.plan import snake_share
    steps = []
    for b in batches:
        b = np.asarray(b)
        steps.append([(1, split_tasks(snake_share(b, lengths, r, world), lengths,
                                      tasks_per_worker, cost, 1)) for r in range(world)])
    return steps


def predicted_fps(steps: list[Step], lengths: np.ndarray, cost) -> float:
    """The same dealing with the cost model's task costs instead of timed ones (``cost``:
    a ``pool.CostModel``, its units padded-frame equivalents): real frames per unit of
    predicted time. A function of the lengths alone: no timing, no machine load."""
    from rnntrain.compute.pool import _list_schedule
    frames = wall = 0.0
    for step in steps:
        slowest = 0.0
        for workers, groups in step:
            costs = [cost(len(g), int(lengths[list(g)].max())) for g in groups]
            frames += sum(int(lengths[list(g)].sum()) for g in groups)
            slowest = max(slowest, _list_schedule(costs, workers))
        wall += slowest
    return frames / wall


def measure(comp, payload, targets, lengths: np.ndarray, settings: dict[str, list[Step]],
            rounds: int = 2, seed: int = 1, epoch: int = 0,
            clock=time.perf_counter) -> dict[str, Ceiling]:
    """Time every task of every setting alone on this thread (``comp``: a training
    ``TaskComputer``; ``payload[s]``: the frames of sequence s; step i draws its noise
    and dropout from (``seed``, ``epoch``, i) as training does), settings interleaved
    round by round, the best round of each kept (this VM's speed drifts by minutes).
    ``clock``: ``time.perf_counter`` (wall) or ``time.thread_time`` (this thread's CPU
    time: on a machine other jobs load, the time a task waits for a core is left out)."""
    from rnntrain.compute.pool import Task, _list_schedule, task_settings
    best: dict[str, Ceiling] = {}
    with task_settings(1):
        first = next(g for steps in settings.values() for st in steps for _, gs in st
                     for g in gs)[:1]
        comp.begin_step(1, (seed, epoch, -1), True)   # warm-up, untimed: the first kernels
        comp(0, Task(0, first, ([payload[s] for s in first], [targets[s] for s in first])))
        for _ in range(rounds):
            for name, steps in settings.items():
                busy = wall = 0.0
                frames = tasks = 0
                for i, step in enumerate(steps):
                    slowest = 0.0
                    for workers, groups in step:
                        comp.begin_step(len(groups), (seed, epoch, i), True)
                        times = []
                        for j, g in enumerate(groups):
                            task = Task(j, g, ([payload[s] for s in g],
                                               [targets[s] for s in g]))
                            t0 = clock()
                            comp(0, task)
                            times.append(clock() - t0)
                            frames += int(lengths[list(g)].sum())
                        busy += sum(times)
                        tasks += len(times)
                        slowest = max(slowest, _list_schedule(times, workers))
                    wall += slowest
                lanes = sum(w for w, _ in steps[0])
                c = Ceiling(frames, busy, wall, tasks, lanes)
                if name not in best or c.fps > best[name].fps:
                    best[name] = c
    return best
