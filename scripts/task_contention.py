"""What two worker threads cost each other, in figures that machine load hurts little.

Runs real training steps of the default model (``WorkerPool`` -> ``TaskComputer`` ->
fixed-order reduce -> Adam, as ``bench.threads`` does) over the first batches of a dataset
with 1 and then 2 workers, and prints per batch, summed over its tasks (ms):

- ``cpu``: the worker threads' on-CPU time inside tasks,
- ``runq``: time waiting for a core (other jobs' load: ignore it),
- ``blocked``: wall - cpu - runq, i.e. waiting for the GIL or a lock,

and the number of Python-level torch calls per task (each one a release and re-acquire of
the GIL on a worker; a ``TorchFunctionMode`` count). Linux only (``/proc/thread-self``).
docs/threads.md, "What two workers shared".

    python scripts/task_contention.py data/synth_train.nc [--batches 40] [--rounds 2]
"""
from __future__ import annotations

import argparse
import collections
import threading
import time

from rnntrain.compute import allocator

allocator.configure("cache")   # as `rnntrain train` does, before torch starts threads
import numpy as np  # noqa: E402
import torch  # noqa: E402
allocator.configure("cache")  # once torch is imported: its large-block cache
from torch.overrides import TorchFunctionMode  # noqa: E402

from rnntrain.compute.model import CTCModel  # noqa: E402
from rnntrain.compute.pool import Task, WorkerPool, split_tasks  # noqa: E402
from rnntrain.compute.tasks import FlatGrad, TaskComputer, cost_model_for  # noqa: E402
from rnntrain.data.dataset import Dataset  # noqa: E402
from rnntrain.data.plan import group_by_length  # noqa: E402


def schedstat() -> np.ndarray:
    """(wall, on-CPU, run-queue wait) of the calling thread, seconds."""
    with open("/proc/thread-self/schedstat") as f:
        cpu, runq, _ = f.read().split()
    return np.array([time.perf_counter(), int(cpu) * 1e-9, int(runq) * 1e-9])


class Accounted(TaskComputer):
    """The training task, with its thread's schedstat taken around it."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.lock, self.total = threading.Lock(), np.zeros(3)

    def __call__(self, worker, task):
        s0 = schedstat()
        fence = super().__call__(worker, task)
        d = schedstat() - s0
        with self.lock:
            self.total += d
        return fence


class CallCount(TorchFunctionMode):
    """Counts the torch functions called from Python."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="a training .nc (python -m data_tools synth ...)")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    ds = Dataset.open(args.data)
    frames = ds.load_chunk(0)
    torch.manual_seed(0)
    model = CTCModel(ds.input_size, ds.num_labels, layers=2, hidden=128)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    groups = group_by_length(np.arange(ds.num_seqs), ds.lengths, 3000,
                             np.random.default_rng(0))
    batches = [list(map(int, g)) for g in groups[: args.batches]]
    cost = cost_model_for(model)

    def tasks_of(b, threads):
        return [Task(j, g, ([frames[s] for s in g], [ds.targets[s] for s in g]))
                for j, g in enumerate(split_tasks(b, ds.lengths, 2 * threads, cost, threads))]

    comp = Accounted(model, torch.device("cpu"))
    counted = [t for b in batches[:20] for t in tasks_of(b, 2)]
    comp.ensure_buffers(8)
    count = CallCount()
    with count:
        for t in counted:
            comp(0, Task(0, t.seqs, t.payload))
    per = sum(count.calls.values()) / len(counted)
    top = ", ".join(f"{k} {v / len(counted):.1f}" for k, v in count.calls.most_common(8))
    print(f"{per:.1f} Python-level torch calls per task ({len(counted)} tasks; {top})")

    for _ in range(args.rounds):
        for threads in (1, 2):
            model.load_state_dict(init)
            params = list(model.parameters())
            opt = torch.optim.Adam(params, lr=1e-4, fused=True)  # as `rnntrain train` builds it
            flat = FlatGrad(params, torch.device("cpu"))
            comp = Accounted(model, torch.device("cpu"))
            with WorkerPool(comp, threads, 1, inline=threads == 1) as pool:
                t0 = time.perf_counter()
                for step, b in enumerate(batches):
                    tasks = tasks_of(b, threads)
                    comp.ensure_buffers(len(tasks))
                    comp.key = (1, 0, step)
                    fences, _ = pool.run(tasks)
                    flat.reduce_tasks(comp.buffers[: len(tasks)], fences)
                    flat.normalize_and_clip("sequences", 5.0)
                    opt.step()
                wall = time.perf_counter() - t0
            w, cpu, runq = 1e3 * comp.total / len(batches)
            print(f"{threads} worker(s): per batch cpu {cpu:.1f} ms, runq {runq:.1f} ms, "
                  f"blocked {w - cpu - runq:.1f} ms; {wall:.1f} s wall")


if __name__ == "__main__":
    main()
