"""Conv + BLSTM on 2-D data (printed text lines): rnntrain against a plain PyTorch loop.

The data: ``rnntrain-data render-lines`` (matplotlib's DejaVu fonts, Faker's text, up to
32 characters) converted by ``rnntrain-data images --chars --height 32`` into an RNNLIB
2-D file. The model: ``configs/printed_lines.toml`` (4 conv blocks, 2 x 128 BLSTM) with
its dropouts set to 0 on both sides.

The plain loop is what one writes from the PyTorch docs: the images in memory as column
frames (W, 32), a ``DataLoader(batch_size=32, shuffle=True)`` padding with
``pad_sequence``, the same model object (``build_model``: rnntrain's conv front end and
LSTM layers), the same CTC loss and optimizer, the faster of torch's default threads and
one thread. rnntrain runs as a user runs it (``rnntrain train``, a fresh process; its
second epoch is timed). Figures are columns per second (image columns, the time axis of
the recurrent layers; padding not counted).

Run alone: ``python -m bench.ocr [--quick]``.
"""
from __future__ import annotations

import os
import sys
import time

import torch

from bench import workloads as wl

BATCH = 32
NO_DROPOUT = ["model.dropout=0.0", "model.conv_dropout=0.0"]


def line_data(folder, count: int):
    from data_tools.images import ImageSettings, ascii_alphabet, convert_images
    from data_tools.render import render_lines
    lst = render_lines(str(folder / "lines"), count, ["DejaVuSans", "DejaVuSerif",
                                                      "DejaVuSansMono"], (18, 30), seed=5,
                       max_chars=32, progress=False)
    path = folder / "lines.nc"
    convert_images(lst, path, ImageSettings(32, "auto"), chars=True,
                   labels=ascii_alphabet(), progress=False)
    return path


def plain_loop_2d(path, cfg, max_s: float, threads: int) -> dict:
    """One epoch (or ``max_s`` seconds, checked after each batch) of the plain loop."""
    from bench.plain_loop import collate
    from rnntrain.compute.model import build_model, ctc_loss_sum, total_subsample
    from rnntrain.compute.optim import build_optimizer
    from rnntrain.data.dataset import Dataset
    torch.set_num_threads(threads)
    ds = Dataset.open(str(path))
    keep = ds.feasible(total_subsample(cfg.model))
    frames = {}
    for k in range(len(ds.chunks)):
        frames.update(ds.load_chunk(k))
    items = [(torch.from_numpy(frames[i]), ds.targets[i]) for i in range(ds.num_seqs) if keep[i]]
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, ds.frame_size, ds.num_labels, ds.frame_height).train()
    opt = build_optimizer(cfg.optim, model.parameters())
    loader = torch.utils.data.DataLoader(items, batch_size=BATCH, shuffle=True,
                                         collate_fn=collate,
                                         generator=torch.Generator().manual_seed(1))
    real = padded = batches = 0
    t0 = time.perf_counter()
    for x, lengths, targets in loader:
        log_probs, out_len = model(x, lengths)
        loss = ctc_loss_sum(log_probs, out_len, targets, model.blank) / len(targets)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_norm or 1e9)
        opt.step()
        real += int(lengths.sum())
        padded += x.shape[0] * x.shape[1]
        batches += 1
        if time.perf_counter() - t0 > max_s:
            break
    dt = time.perf_counter() - t0
    return {"cols_per_s": real / dt, "padding": padded / real, "batches": batches,
            "threads": threads}


def run(quick: bool = False) -> str:
    from rnntrain.config import load_config
    folder = wl.workdir()
    count = 80 if quick else 400
    data = line_data(folder, count)
    config = wl.ROOT / "configs" / "printed_lines.toml"
    over = [f"data.train={data}", 'data.val=""', 'data.test=""', "train.epochs=2", *NO_DROPOUT]
    ours = wl.run_rnntrain(config, over, folder / "run_ocr")
    cfg = load_config(config, over)
    max_s = 10.0 if quick else 40.0
    cores = os.cpu_count() or 1
    runs = [plain_loop_2d(data, cfg, max_s / 2, t) for t in sorted({cores, 1}, reverse=True)]
    best = max(runs, key=lambda r: r["cols_per_s"])
    other = ", ".join(f"{r['cols_per_s']:,.0f} ({r['threads']} thr)" for r in runs if r is not best)
    m = wl.machine()
    ratio = ours["frames_per_s"] / best["cols_per_s"]
    return "\n".join([
        "## Conv + BLSTM on 2-D data (printed lines)", "",
        f"`python -m bench ocr{' --quick' if quick else ''}` on {m['cpu']}, {m['cores']} "
        f"cores, torch {m['torch']}: {count} rendered text lines, 32 pixels high, "
        "`configs/printed_lines.toml` without dropout. Columns/s = image columns (the time "
        "axis) per second of training, padding not counted. The plain loop: the same model "
        f"object, `DataLoader(batch_size={BATCH}, shuffle=True)` over the column frames in "
        "memory, the faster of the thread settings tried.", "",
        "| workload | rnntrain columns/s | plain loop columns/s | plain padding | "
        "**speed-up** |", "|---|---:|---:|---:|---:|",
        f"| printed lines, conv + 2x128 BLSTM | {ours['frames_per_s']:,.0f} | "
        f"{best['cols_per_s']:,.0f} ({best['threads']} thr) | {best['padding']:.2f} | "
        f"**{ratio:.2f}x** |", "",
        f"- plain loop, other thread setting: {other or '-'}; {best['batches']} batches "
        f"(capped at {max_s / 2:.0f} s per setting).",
        f"- rnntrain peak RSS {ours['maxrss_mb']:.0f} MB; command: `{ours['command']}`.", ""])


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
