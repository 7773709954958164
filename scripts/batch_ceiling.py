"""The split's ceiling and one worker's cost per frame, batch size by batch size.

For each ``batch.batch_frames`` given: the steps of epoch 0 of the training data as
``rnntrain train`` plans them for one rank (``make_plan``, the config's seed), every batch
split for one worker and for two exactly as the step splits it (``pool.split_tasks`` with
the model's cost model), then

- **predicted**: the cost model's own task costs (padded frames plus the fixed costs per
  task and per sequence, from the lengths alone: no timing, no load) dealt to the workers
  as the pool deals them; 2 workers' rate over 1 worker's;
- **measured**: every task of both splits run alone on this thread by the training
  ``TaskComputer`` (bench/ceiling.py), timed in thread CPU time (the time a task waits for
  a core on a loaded machine is left out), the splits interleaved round by round, best
  round of each: 2 workers' rate over 1 worker's (the ceiling), and one worker's CPU
  microseconds per real frame (what a batch size costs one worker).

The model is the config's (default: configs/default.toml), its weights as initialised.

    python scripts/batch_ceiling.py data/synth_train.nc --batch-frames 3000 4000 6000 \\
        [--config configs/default.toml] [--steps 0] [--rounds 2]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench package
from rnntrain.compute import allocator  # noqa: E402

allocator.configure("cache")   # as `rnntrain train` does, before torch starts threads
import torch  # noqa: E402
allocator.configure("cache")  # once torch is imported: its large-block cache

from bench import ceiling  # noqa: E402
from rnntrain.compute.model import build_model  # noqa: E402
from rnntrain.compute.tasks import TaskComputer, cost_model_for  # noqa: E402
from rnntrain.config import load_config  # noqa: E402
from rnntrain.data.dataset import Dataset  # noqa: E402
from rnntrain.data.plan import make_plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="training data (.nc) of the config's model")
    ap.add_argument("--batch-frames", type=int, nargs="+", required=True)
    ap.add_argument("--config", default="configs/default.toml")
    ap.add_argument("--steps", type=int, default=0, help="first N steps only (0: the epoch)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = load_config(args.config, [])
    ds = Dataset.open(args.data)
    model = build_model(cfg.model, ds.input_size, ds.num_labels)
    cost = cost_model_for(model)
    payload = {}
    for k in range(len(ds.chunks)):
        payload.update(ds.load_chunk(k))
    tpw = cfg.compute.tasks_per_worker
    print("| batch_frames | steps | tasks per batch, 1 / 2 workers | predicted 2 / 1 | "
          "measured 2 / 1 (ceiling) | 2 workers' balance | 1 worker, CPU us per frame |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for bf in args.batch_frames:
        plan = make_plan(ds, ds.feasible(), bf, cfg.train.seed, 0)
        if args.steps:
            plan = plan[: args.steps]
        batches = [b.seqs for b in plan]
        settings = {f"{w}x1": ceiling.thread_steps(batches, ds.lengths, w, tpw, cost)
                    for w in (1, 2)}
        pred = (ceiling.predicted_fps(settings["2x1"], ds.lengths, cost)
                / ceiling.predicted_fps(settings["1x1"], ds.lengths, cost))
        c = ceiling.measure(TaskComputer(model, torch.device("cpu")), payload, ds.targets,
                            ds.lengths, settings, args.rounds, cfg.train.seed,
                            clock=time.thread_time)
        one, two = c["1x1"], c["2x1"]
        print(f"| {bf} | {len(batches)} | {one.tasks / len(batches):.2f} / "
              f"{two.tasks / len(batches):.2f} | {pred:.3f} | {two.fps / one.fps:.3f} | "
              f"{100 * two.balance:.1f} % | {1e6 * one.busy_s / one.frames:.2f} |", flush=True)


if __name__ == "__main__":
    main()
