"""GPU section: the reference model end to end against its bare step on the device.

The reference model is 3 x BLSTM-256 with 40 inputs and 30 labels + blank. For fp32 and
bf16 at several padded-frame budgets it measures, side by side on the same synthetic
speech-like data (written as an RNNLIB .nc file):

- end to end: ``rnntrain.run.train.train`` itself (reader thread, worker, pinned copies on a
  side stream, reduce, fused update), frames/s of its second epoch from metrics.jsonl;
- the ceiling: the same model and the same micro-batches of the same epoch plan, already
  collated on the device, stepped in a bare loop (forward, CTC, backward, fused Adam);
- the share of the ceiling reached end to end (goal >= 95%) and the GPU memory peak.

Without CUDA it returns a section saying it was not run and how to run it. Within about
3 minutes on an H200: ``python -m bench.gpu`` (``--quick``: one budget, less data).
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

COMMAND = "python -m bench.gpu"
REF = {"input_size": 40, "labels": 30, "layers": 3, "hidden": 256}


def write_data(path: str, num_seqs: int, input_size: int, labels: int) -> str:
    from data_tools.synth import write_synth
    # about 170 frames per sequence with a long tail (speech-like spread)
    write_synth(path, num_seqs=num_seqs, num_labels=labels, input_size=input_size, seed=7,
                mean_labels=25.0)
    return path


def end_to_end(path: str, device: str, precision: str, budget: int, layers: int,
               hidden: int, run_dir: str) -> dict:
    """Train two epochs with the real loop; → frames/s of epoch 2 and the memory peak."""
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    cfg = load_config(None, [f"data.train={json.dumps(path)}", f"model.layers={layers}",
                             f"model.hidden={hidden}", "train.epochs=2",
                             f"batch.batch_frames={budget}", f"compute.precision={precision}",
                             f"compute.device={device}", "log.every_steps=1000000",
                             f"run.dir={json.dumps(run_dir)}", "checkpoint.every_minutes=1e6"])
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    train(cfg)
    recs = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    last = [r for r in recs if r.get("split") == "train" and r.get("epoch") == 1][-1]
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else 0
    return {"fps": last["frames_per_s"], "peak": peak, "padding": last["padding"]}


def ceiling(path: str, device: str, precision: str, budget: int, layers: int,
            hidden: int) -> float:
    """The bare step on batches already on the device: the same epoch-2 plan and task
    split as the trainer's, no reader, no copies, no reduce; the second pass over them
    is timed. → frames/s."""
    from rnntrain.data.dataset import Dataset
    from rnntrain.compute.device import autocast_dtype
    from rnntrain.compute.model import CTCModel
    from rnntrain.data.plan import make_plan
    from rnntrain.compute.pool import split_tasks
    from rnntrain.compute.tasks import collate
    dev = torch.device(device)
    ds = Dataset.open(path)
    keep = ds.feasible()
    plan = make_plan(ds, keep, budget, seed=1, epoch=1)
    frames = {}
    for k in range(len(ds.chunks)):
        frames.update(ds.load_chunk(k))
    steps, real = [], 0
    for step in plan:  # one worker, compute.tasks_per_worker = 2: the trainer's split
        batches = []
        steps.append(batches)
        for g in split_tasks(step.seqs, ds.lengths, 2):
            g = sorted(g, key=lambda s: -int(ds.lengths[s]))
            x, lengths = collate([frames[s] for s in g])
            tg = torch.cat([torch.as_tensor(ds.targets[s], dtype=torch.long) for s in g])
            tl = torch.tensor([len(ds.targets[s]) for s in g])
            batches.append((x.to(dev), lengths, tg.to(dev), tl))
            real += int(lengths.sum())
    model = CTCModel(ds.input_size, ds.num_labels, layers, hidden).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    dtype = autocast_dtype(precision, dev)

    def step(batches):  # the trainer's step: every micro-batch's gradient, one update
        for x, lengths, tg, tl in batches:
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                lp, out_len = model(x, lengths)
            loss = F.ctc_loss(lp.float(), tg, out_len, tl, blank=model.blank,
                              reduction="sum")
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    # Warm-up: one whole untimed pass. Every distinct (N, T) shape costs cuDNN a plan
    # the first time it is seen; the trainer's epoch 2 (what end to end times) has seen
    # them all in epoch 1, so the ceiling must too, or it counts plan building as compute.
    for b in steps:
        step(b)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for b in steps:
        step(b)
    sync()
    return real / (time.perf_counter() - t0)


def measure(path: str, device: str, precision: str, budget: int, layers: int, hidden: int,
            run_dir: str) -> dict:
    c = ceiling(path, device, precision, budget, layers, hidden)
    e = end_to_end(path, device, precision, budget, layers, hidden, run_dir)
    return {**e, "ceiling": c, "share": e["fps"] / c}


def not_run() -> str:
    """The section on a machine without CUDA: says so, and points at the figures recorded
    on a GPU (docs/benchmarks-gpu.md, written by this module's ``__main__`` there)."""
    return ("## GPU: LSTM-CTC on CUDA\n\n"
            "Not measured in this run: no CUDA device was available where this section was "
            "generated. The figures recorded on GPUs (an NVIDIA H200, 2026-11-27; an H100 and an H200, 2026-11-26) and what "
            "they do and do not show are in docs/benchmarks-gpu.md. On a machine with one GPU "
            f"run `{COMMAND} --repeat 2` (about 5-8 minutes on an H200, 7 on an H100; `--quick` for a short check): it "
            "reports frames/s of the reference model (3 x BLSTM-256, 40 inputs, 30 labels + "
            "blank) end to end and on tensors already on the device (the bare loop), the share "
            "of the bare loop reached (goal >= 95%) and the GPU memory peak, for fp32 and bf16 "
            "at several batch budgets.\n")


def summarise(runs: list[dict]) -> dict:
    """Repeated measurements of one row → the (lower) median of each rate, the share of the
    ceiling as their ratio, and the range of both rates across the repeats (min, max)."""
    assert runs
    ordered = sorted(runs, key=lambda r: r["fps"])
    mid = dict(ordered[(len(ordered) - 1) // 2])  # the lower median: a run that happened
    mid["fps_range"] = (ordered[0]["fps"], ordered[-1]["fps"])
    ceilings = [r["ceiling"] for r in runs]
    mid["ceiling"] = statistics.median_low(ceilings)  # each rate's own median
    mid["share"] = mid["fps"] / mid["ceiling"]
    mid["ceiling_range"] = (min(ceilings), max(ceilings))
    mid["repeats"] = len(runs)
    return mid


def run(quick: bool = False, num_seqs: int | None = None, repeat: int = 1,
        budgets: list[int] | None = None) -> str:
    """num_seqs: sequences of synthetic data (default 6000, 1500 quick); more gives
    longer, less noisy epochs. repeat: measurements per row (the table gives the median
    run and the range); budgets: batch_frames to try (default 8000, 24000, 64000)."""
    if not torch.cuda.is_available():
        return not_run()
    default = [16000] if quick else [8000, 24000, 64000]
    budgets = budgets or default
    num_seqs = num_seqs or (1500 if quick else 6000)
    name = torch.cuda.get_device_name()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = write_data(str(Path(d) / "train.nc"), num_seqs, REF["input_size"], REF["labels"])
        for precision in ("fp32", "bf16"):
            for budget in budgets:
                runs = []
                for k in range(repeat):
                    r = measure(path, "cuda", precision, budget, REF["layers"], REF["hidden"],
                                str(Path(d) / f"run-{precision}-{budget}-{k}"))
                    runs.append(r)
                    print(f"{precision} {budget} #{k + 1}: {r}", file=sys.stderr, flush=True)
                rows.append((precision, budget, summarise(runs)))
    lines = ["## GPU: LSTM-CTC on CUDA", "",
             f"{time.strftime('%Y-%m-%d')}, {name}, torch {torch.__version__}. Reference "
             f"model 3 x BLSTM-256, 40 inputs, 30 labels + blank, on {num_seqs} synthetic "
             "speech-like sequences (about 170 frames each, long tail). End to end = "
             "`rnntrain train` (epoch 2, frames/s of real frames); ceiling = the same "
             "micro-batches already on the device in a bare forward/CTC/backward loop, one Adam update per step."
             + (f" Each rate is the median of {repeat} runs, the share their ratio, with the "
                "range of both rates over the runs." if repeat > 1 else ""),
             "", "| precision | batch_frames | end to end (frames/s) | ceiling (frames/s) | "
             "share of ceiling | padding | GPU memory peak |"
             + (" end to end, range | ceiling, range |" if repeat > 1 else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if repeat > 1 else "")]
    for precision, budget, r in rows:
        spread = (f" {r['fps_range'][0]:,.0f}–{r['fps_range'][1]:,.0f} | "
                  f"{r['ceiling_range'][0]:,.0f}–{r['ceiling_range'][1]:,.0f} |"
                  if repeat > 1 else "")
        lines.append(f"| {precision} | {budget} | {r['fps']:,.0f} | {r['ceiling']:,.0f} | "
                     f"{100 * r['share']:.1f}% | {r['padding']:.2f} | "
                     f"{r['peak'] / 2**30:.2f} GiB |" + spread)
    fp32 = {b: r for p, b, r in rows if p == "fp32"}
    for p, b, r in rows:
        if p == "bf16" and b in fp32:
            lines.append(f"\nbf16 / fp32 end to end at {b} frames: "
                         f"{r['fps'] / fp32[b]['fps']:.2f}x")
    worst = min(r["share"] for _, _, r in rows)
    lines += ["", f"Lowest share of the ceiling: {100 * worst:.1f}% (goal >= 95%).",
              "", f"Reproduce: `{COMMAND}{' --quick' if quick else ''}"
              f"{f' --seqs {num_seqs}' if num_seqs != (1500 if quick else 6000) else ''}"
              f"{f' --repeat {repeat}' if repeat > 1 else ''}"
              f"{' --budgets ' + ','.join(map(str, budgets)) if budgets != default else ''}`",
              ""]
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one budget, 1500 sequences")
    ap.add_argument("--seqs", type=int, default=None,
                    help="sequences of synthetic data (default 6000): longer, steadier epochs")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measurements per row: the table gives the median and the range")
    ap.add_argument("--budgets", type=lambda v: [int(b) for b in v.split(",")], default=None,
                    help="comma-separated batch_frames (default 8000,24000,64000)")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    print(run(quick=a.quick, num_seqs=a.seqs, repeat=a.repeat, budgets=a.budgets))
