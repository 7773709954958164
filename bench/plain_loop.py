"""rnntrain against a plain PyTorch training loop, side by side in one run.

The plain loop is what one writes from the PyTorch docs: a ``torch.utils.data.Dataset``
over the sequences (all in memory), a standard ``DataLoader`` with random batches of 32
padded by ``pad_sequence``, the same CTC loss and optimizer, and the faster of torch's
default intra-op threads (one per core) and one thread. It runs in two variants:

- "same kernels": the same model object as rnntrain (``CTCModel``: per-layer nn.LSTM over
  the dense padded batch, each direction exact for its lengths). This isolates what
  rnntrain's loop adds (length grouping, worker threads) from its LSTM kernel choice.
- "stock": the textbook script: ``nn.LSTM(F, H, num_layers, bidirectional=True)`` fed a
  ``pack_padded_sequence`` (the documented way to get variable lengths right), then
  linear and CTC. On the CPU, the packed backward is a per-time-step loop: slow.

rnntrain runs as a user runs it (``rnntrain train CONFIG``, a fresh process). With
``compute.precision = "bf16"`` both sides run the model under ``torch.autocast`` (bf16
matmuls, CTC in fp32). Frames are real frames (padding not counted); padding is padded
frames / real frames (1.00 = none).

Run alone: ``python -m bench.plain_loop [--quick]``.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

from bench import workloads as wl

BATCH = 32


class Sequences(torch.utils.data.Dataset):
    """Every trainable sequence of an RNNLIB file in memory: (frames (T, F), target)."""

    def __init__(self, path):
        from rnntrain.data.ncdata import read_file
        from rnntrain.data.dataset import min_frames
        h, frames = read_file(str(path))
        keep = [i for i in range(h.num_seqs) if h.lengths[i] >= min_frames(h.targets[i])]
        self.frames = [torch.from_numpy(np.ascontiguousarray(frames[i])) for i in keep]
        self.targets = [h.targets[i] for i in keep]
        self.input_size, self.num_labels = h.input_size, len(h.labels)

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, i):
        return self.frames[i], self.targets[i]


def collate(items):
    xs, targets = zip(*items)
    lengths = torch.tensor([len(x) for x in xs])
    return torch.nn.utils.rnn.pad_sequence(list(xs)), lengths, list(targets)  # (T, N, F)


class StockModel(torch.nn.Module):
    """The textbook model: one multi-layer ``nn.LSTM`` over a PackedSequence, linear,
    log-softmax. x: (T, N, F) zero-padded, lengths: (N,) → ((T, N, C), lengths)."""

    def __init__(self, input_size, num_labels, layers, hidden, bidirectional):
        super().__init__()
        self.blank = num_labels
        self.lstm = torch.nn.LSTM(input_size, hidden, num_layers=layers,
                                  bidirectional=bidirectional)
        self.out = torch.nn.Linear(hidden * (2 if bidirectional else 1), num_labels + 1)

    def forward(self, x, lengths):
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, _ = pad_packed_sequence(self.lstm(packed)[0], total_length=x.shape[0])
        return torch.log_softmax(self.out(y).float(), dim=-1), lengths


def plain_loop(path, model_cfg, optim_cfg, seed: int = 1, max_s: float = 60.0,
               threads: int = 1, precision: str = "fp32", stock: bool = False) -> dict:
    """One epoch (or ``max_s`` seconds, checked after each batch) of the plain loop →
    frames/s and padding. ``stock``: the textbook ``StockModel`` instead of ``CTCModel``."""
    from rnntrain.compute.device import autocast_dtype
    from rnntrain.compute.model import build_model, ctc_loss_sum
    from rnntrain.compute.optim import build_optimizer
    autocast_dtype(precision, torch.device("cpu"))  # a precision this CPU runs, or one line
    torch.set_num_threads(threads)
    data = Sequences(path)
    torch.manual_seed(seed)
    if stock:
        model = StockModel(data.input_size, data.num_labels, model_cfg.layers,
                           model_cfg.hidden, model_cfg.bidirectional).train()
    else:
        model = build_model(model_cfg, data.input_size, data.num_labels).train()
    opt = build_optimizer(optim_cfg, model.parameters())
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                         collate_fn=collate,
                                         generator=torch.Generator().manual_seed(seed))
    real = padded = batches = seqs = 0
    t0 = time.perf_counter()
    for x, lengths, targets in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            log_probs, out_len = model(x, lengths)
        loss = ctc_loss_sum(log_probs, out_len, targets, model.blank) / len(targets)
        opt.zero_grad()
        loss.backward()
        if optim_cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim_cfg.clip_norm)
        opt.step()
        real += int(lengths.sum())
        padded += x.shape[0] * x.shape[1]
        batches += 1
        seqs += len(targets)
        if time.perf_counter() - t0 > max_s:
            break
    dt = time.perf_counter() - t0
    return {"frames_per_s": real / dt, "padding": padded / real, "batches": batches,
            "frames": real,
            "epoch_share": seqs / len(data), "threads": threads}


def best_plain_loop(path, model_cfg, optim_cfg, seed: int, max_s: float,
                    precision: str = "fp32", one_thread_s: float | None = None) -> dict:
    """The plain loop with torch's default (one intra-op thread per core, ``max_s / 2``
    seconds) and with one thread (``one_thread_s``, default the same): the faster one is
    the baseline (on a busy machine, intra-op threads can be many times slower than one)."""
    cores = os.cpu_count() or 1
    one_s = max_s / 2 if one_thread_s is None else one_thread_s
    runs = [plain_loop(path, model_cfg, optim_cfg, seed, max_s / 2 if t > 1 else one_s, t,
                       precision) for t in sorted({cores, 1}, reverse=True)]
    best = max(runs, key=lambda r: r["frames_per_s"])
    best["other"] = [r for r in runs if r is not best]
    return best


def rnntrain_padding(path, batch_frames: int, seed: int = 1) -> float:
    """Padding of rnntrain's epoch-0 plan (the same function the trainer calls)."""
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import make_plan, padding_ratio
    ds = Dataset.open(str(path))
    plan = make_plan(ds, ds.feasible(1), batch_frames, seed, 0)
    return padding_ratio(plan, ds.lengths)


def compare(name: str, data, config, overrides: list[str], folder, max_s: float,
            stock_s: float = 0.0, one_thread_s: float | None = None) -> dict:
    """rnntrain, then the plain loop (same kernels), then (if ``stock_s``) the stock loop
    with torch's default threads for about ``stock_s`` seconds."""
    from rnntrain.config import load_config
    cfg = load_config(config, overrides)
    prec = cfg.compute.precision
    ours = wl.run_rnntrain(config, overrides, folder / f"run_{name}_{prec}")
    plain = best_plain_loop(data, cfg.model, cfg.optim, cfg.train.seed, max_s, prec,
                            one_thread_s)
    stock = plain_loop(data, cfg.model, cfg.optim, cfg.train.seed, stock_s,
                       os.cpu_count() or 1, prec, stock=True) if stock_s else None
    return {"name": name, "cfg": cfg, "ours": ours, "plain": plain, "stock": stock,
            "ours_pad": rnntrain_padding(data, cfg.batch.batch_frames, cfg.train.seed)}


def _others(row) -> str:
    return ", ".join(f"{o['frames_per_s']:,.0f}" for o in row["plain"]["other"]) or "-"


def run(quick: bool = False) -> str:
    from rnntrain.compute.device import cpu_bf16
    folder = wl.workdir()
    max_s = 15.0 if quick else 60.0   # per loop, split over the 2 thread settings
    rows = []
    default = wl.default_data(folder, quick)
    rows.append(compare("default", default, wl.ROOT / "configs" / "default.toml",
                        [f"data.train={default}", 'data.val=""', "train.epochs=1"], folder, max_s))
    ref = wl.reference_data(folder, 60 if quick else 240)
    ref_cfg = wl.reference_config(folder, ref)
    # two epochs, the last one timed: the first pays oneDNN's one-off kernel builds
    # the 1-thread plain loop is the slower one on this model in every run so far (by
    # 35-60%): a short look (checked after each batch) keeps the suite within its time
    one_s = 5.0 if quick else 10.0
    rows.append(compare("reference", ref, ref_cfg, ["train.epochs=2"], folder, max_s,
                        stock_s=5.0 if quick else 30.0, one_thread_s=one_s))
    if cpu_bf16():
        rows.append(compare("reference", ref, ref_cfg,
                            ["train.epochs=2", "compute.precision=bf16"], folder, max_s,
                            one_thread_s=one_s))

    m = wl.machine()
    out = ["## rnntrain vs a plain PyTorch loop", "",
           f"`python -m bench.plain_loop{' --quick' if quick else ''}` on {m['cpu']}, "
           f"{m['cores']} cores, torch {m['torch']}. Same data file, same optimizer, one after "
           "the other in one run. The plain loop: "
           f"`DataLoader(batch_size={BATCH}, shuffle=True)` with `pad_sequence`, data "
           "preloaded in memory (not timed), in two variants: **same kernels** runs "
           "rnntrain's own model object (`CTCModel`: per-layer nn.LSTM over the dense "
           "padded batch, each direction exact for its lengths), so its column isolates what "
           "rnntrain's loop adds (length grouping, worker threads); **stock** is the "
           "textbook script, `nn.LSTM(num_layers=3, bidirectional=True)` over a "
           "`pack_padded_sequence`, whose CPU backward is a per-time-step loop. "
           "rnntrain: `rnntrain train` in a fresh process, length-grouped batches, one worker "
           "thread per core, the reader thread loading from the .nc file (timed). bf16: "
           "`compute.precision = \"bf16\"` for rnntrain, `torch.autocast(\"cpu\", "
           "torch.bfloat16)` around the plain loop's model (both keep CTC in fp32).", "",
           "| workload | precision | rnntrain frames/s | rnntrain padding | plain, same kernels: "
           "frames/s | padding | **speed-up** | plain, stock: frames/s | speed-up |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["ours"]["frames_per_s"] / r["plain"]["frames_per_s"]
        st = r["stock"]
        stock = (f"{st['frames_per_s']:,.0f} | {r['ours']['frames_per_s'] / st['frames_per_s']:.1f}x"
                 if st else "- | -")
        out.append(f"| {r['name']} | {r['cfg'].compute.precision} | "
                   f"{r['ours']['frames_per_s']:,.0f} | {r['ours_pad']:.2f} | "
                   f"{r['plain']['frames_per_s']:,.0f} | {r['plain']['padding']:.2f} | "
                   f"**{ratio:.2f}x** | {stock} |")
    d, rf = rows[:2]
    labels = ["default", "reference", "reference bf16"][:len(rows)]
    st = rf["stock"]
    each = lambda f: ", ".join(f"{f(r)} ({n})" for n, r in zip(labels, rows))  # noqa: E731
    out += ["",
            f"- default: `configs/default.toml` (2x128 BLSTM, batch_frames "
            f"{d['cfg'].batch.batch_frames}) on `rnntrain-data synth` data "
            f"({'500' if quick else '2000'} sequences, 20 inputs, 20 labels), one epoch. "
            "Goal (issue 2): >= 2x from length grouping.",
            f"- reference: 3-layer BLSTM, 256 per direction, 40 inputs, 30 labels + blank, "
            f"batch_frames {rf['cfg'].batch.batch_frames}, "
            f"{'60' if quick else '240'} sequences with speech-like log-normal lengths "
            "(median 300 frames); rnntrain's second epoch is timed. Goal (issue 8): >= 3.5x "
            "the plain loop.",
            f"- plain loop threads used (same kernels): {each(lambda r: r['plain']['threads'])}; "
            f"the other setting gave {each(_others)} frames/s. "
            f"It ran {each(lambda r: r['plain']['batches'])} batches "
            f"({each(lambda r: format(r['plain']['epoch_share'], '.0%'))} of an "
            f"epoch; capped at {max_s / 2:.0f} s per thread setting, {one_s:.0f} s for the "
            "reference rows' 1-thread setting, checked after each batch).",
            f"- stock loop: {st['threads']} threads, {st['batches']} batch(es) "
            f"({st['frames']:,} frames, capped at {5.0 if quick else 30.0:.0f} s, checked "
            f"after each batch), padding {st['padding']:.2f}.",
            f"- peak RSS of rnntrain: {each(lambda r: format(r['ours']['maxrss_mb'], '.0f') + ' MB')}.",
            *([] if len(rows) > 2 else ["- bf16: not run; oneDNN has no bf16 LSTM on this "
                                        "CPU (it needs AVX-512)."]),
            ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
