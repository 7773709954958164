"""rnntrain against a plain PyTorch training loop, side by side in one run.

The plain loop is what one writes from the PyTorch docs: a ``torch.utils.data.Dataset``
over the sequences (all in memory), a standard ``DataLoader`` with random batches of 32
padded by ``pad_sequence``, the same model (rnntrain's ``CTCModel``: the same nn.LSTM
stack, including rnntrain's dense-batch CPU LSTM path, several times faster than nn.LSTM
over a PackedSequence: the baseline gets the same kernels), the same CTC loss and
optimizer, and the faster of torch's default intra-op threads (one per core) and one thread.
rnntrain runs as a user runs it (``rnntrain train CONFIG``, a fresh process).
Frames are real frames (padding not counted); padding is padded frames / real frames
(1.00 = none).

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
        from rnntrain.ncdata import read_file
        from rnntrain.model import min_frames
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


def plain_loop(path, model_cfg, optim_cfg, seed: int = 1, max_s: float = 60.0,
               threads: int = 1) -> dict:
    """One epoch (or ``max_s`` seconds) of the plain loop → frames/s and padding."""
    from rnntrain.model import build_model, ctc_loss_sum
    from rnntrain.optim import build_optimizer
    torch.set_num_threads(threads)
    data = Sequences(path)
    torch.manual_seed(seed)
    model = build_model(model_cfg, data.input_size, data.num_labels).train()
    opt = build_optimizer(optim_cfg, model.parameters())
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                         collate_fn=collate,
                                         generator=torch.Generator().manual_seed(seed))
    real = padded = batches = seqs = 0
    t0 = time.perf_counter()
    for x, lengths, targets in loader:
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


def best_plain_loop(path, model_cfg, optim_cfg, seed: int, max_s: float) -> dict:
    """The plain loop with torch's default (one intra-op thread per core) and with one
    thread: the faster one is the baseline (on a busy machine, intra-op threads can be
    many times slower than one)."""
    cores = os.cpu_count() or 1
    runs = [plain_loop(path, model_cfg, optim_cfg, seed, max_s / 2, t)
            for t in sorted({cores, 1}, reverse=True)]
    best = max(runs, key=lambda r: r["frames_per_s"])
    best["other"] = [r for r in runs if r is not best]
    return best


def rnntrain_padding(path, batch_frames: int, seed: int = 1) -> float:
    """Padding of rnntrain's epoch-0 plan (the same function the trainer calls)."""
    from rnntrain.dataset import Dataset
    from rnntrain.plan import make_plan, padding_ratio
    ds = Dataset.open(str(path))
    plan = make_plan(ds, ds.feasible(1), batch_frames, seed, 0)
    return padding_ratio(plan, ds.lengths)


def compare(name: str, data, config, overrides: list[str], folder, max_s: float) -> dict:
    from rnntrain.config import load_config
    cfg = load_config(config, overrides)
    ours = wl.run_rnntrain(config, overrides, folder / f"run_{name}")
    plain = best_plain_loop(data, cfg.model, cfg.optim, cfg.train.seed, max_s)
    return {"name": name, "cfg": cfg, "ours": ours, "plain": plain,
            "ours_pad": rnntrain_padding(data, cfg.train.batch_frames, cfg.train.seed)}


def _others(row) -> str:
    return ", ".join(f"{o['frames_per_s']:,.0f}" for o in row["plain"]["other"]) or "-"


def run(quick: bool = False) -> str:
    folder = wl.workdir()
    max_s = 15.0 if quick else 90.0
    rows = []
    default = wl.default_data(folder, quick)
    rows.append(compare("default", default, wl.ROOT / "configs" / "default.toml",
                        [f"data.train={default}", 'data.val=""', "train.epochs=1"], folder, max_s))
    ref = wl.reference_data(folder, 60 if quick else 240)
    rows.append(compare("reference", ref, wl.reference_config(folder, ref), [], folder, max_s))

    m = wl.machine()
    out = ["## rnntrain vs a plain PyTorch loop", "",
           f"`python -m bench.plain_loop{' --quick' if quick else ''}` on {m['cpu']}, "
           f"{m['cores']} cores, torch {m['torch']}. Both sides train the same model "
           "(rnntrain's `CTCModel`: nn.LSTM layers run over the dense padded batch, linear, CTC; "
           "the baseline thus gets rnntrain's LSTM kernels, not PyTorch's slower packed path) on "
           "the same file with the same optimizer, one after the other in one run. The plain "
           f"loop: `DataLoader(batch_size={BATCH}, shuffle=True)` with `pad_sequence`, "
           f"the faster of {m['cores']} intra-op threads (torch's default) and 1 thread, "
           "data preloaded in memory (not timed). rnntrain: "
           "`rnntrain train` in a fresh process, length-grouped batches, one worker thread "
           "per core, the reader thread loading from the .nc file (timed).", "",
           "| workload | model | rnntrain frames/s | rnntrain padding | plain frames/s | "
           "plain padding | speed-up |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        mc = r["cfg"].model
        model = (f"{mc.layers}x{'B' if mc.bidirectional else ''}LSTM {mc.hidden}, "
                 f"batch_frames {r['cfg'].train.batch_frames}")
        ratio = r["ours"]["frames_per_s"] / r["plain"]["frames_per_s"]
        out.append(f"| {r['name']} | {model} | {r['ours']['frames_per_s']:,.0f} | "
                   f"{r['ours_pad']:.2f} | {r['plain']['frames_per_s']:,.0f} | "
                   f"{r['plain']['padding']:.2f} | **{ratio:.2f}x** |")
    d, rf = rows
    out += ["",
            f"- default: `configs/default.toml` on `rnntrain-data synth` data "
            f"({'500' if quick else '2000'} sequences, 20 inputs, 20 labels), one epoch. "
            "Goal (issue 2): >= 2x from length grouping.",
            f"- reference: 3-layer BLSTM, 256 per direction, 40 inputs, 30 labels + blank, "
            f"{'60' if quick else '240'} sequences with speech-like log-normal lengths "
            "(median 300 frames). Goal (issue 8): >= 3.5x the plain loop.",
            f"- plain loop threads used: {d['plain']['threads']} (default) and "
            f"{rf['plain']['threads']} (reference); the other setting gave "
            f"{_others(d)} and {_others(rf)} frames/s.",
            f"- the plain loop ran {d['plain']['batches']} and {rf['plain']['batches']} batches "
            f"({d['plain']['epoch_share']:.0%} and {rf['plain']['epoch_share']:.0%} of an "
            f"epoch; capped at {max_s / 2:.0f} s per thread setting); peak RSS of rnntrain: "
            f"{d['ours']['maxrss_mb']:.0f} MB and {rf['ours']['maxrss_mb']:.0f} MB.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
