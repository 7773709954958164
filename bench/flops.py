"""Useful-FLOP rate of training against the machine's measured fp32 matmul peak.

Peak: ``torch.mm`` on large square fp32 matrices with 1 thread and with all cores (best of
several). Useful FLOPs: ``rnntrain.model.training_flops_per_frame`` (the model's matmul
multiply-adds x 2 x 3 for forward + backward) times real (unpadded) frames per second of
``rnntrain train`` on the reference model. Also: peak resident memory of that run, and the
peephole cell (RNNLIB's LSTM) against the built-in cell on the same data.

Run alone: ``python -m bench.flops [--quick]``.
"""
from __future__ import annotations

import os
import sys
import time

import torch

from bench import workloads as wl


def matmul_gflops(threads: int, n: int, reps: int) -> float:
    """Best-of-``reps`` fp32 GFLOP/s of an n x n @ n x n product on ``threads`` threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        c = torch.empty(n, n)
        torch.mm(a, b, out=c)  # warm-up (page faults, thread pool start)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n ** 3 / best / 1e9
    finally:
        torch.set_num_threads(old)


def run(quick: bool = False) -> str:
    from rnntrain.model import training_flops_per_frame
    cores = os.cpu_count() or 1
    n, reps = (1024, 3) if quick else (3072, 5)
    peak1 = matmul_gflops(1, n, reps)
    peakn = matmul_gflops(cores, n, reps)
    fpf = training_flops_per_frame(wl.REF_INPUTS, wl.REF_HIDDEN, wl.REF_LAYERS, True,
                                   wl.REF_LABELS + 1)
    cap_gflops = cores * peak1          # the goal's yardstick: cores x one thread's peak
    cap_fps = cap_gflops * 1e9 / fpf

    folder = wl.workdir()
    ref = wl.reference_data(folder, 60 if quick else 240)
    lstm = wl.run_rnntrain(wl.reference_config(folder, ref, "lstm"), [], folder / "run_lstm")
    small = wl.reference_data(folder, 30 if quick else 80, seed=8)
    peep_lstm = wl.run_rnntrain(wl.reference_config(folder, small, "lstm"), [],
                                folder / "run_small_lstm")
    peep = wl.run_rnntrain(wl.reference_config(folder, small, "peephole"), [],
                           folder / "run_small_peep")
    useful = lstm["frames_per_s"] * fpf / 1e9
    m = wl.machine()
    q = " --quick" if quick else ""
    return "\n".join([
        "## Useful-FLOP rate and memory (reference model)", "",
        f"`python -m bench.flops{q}` on {m['cpu']}, {cores} cores, torch {m['torch']}.", "",
        "| figure | value |", "|---|---:|",
        f"| fp32 matmul peak, 1 thread (`torch.mm` {n}x{n}) | {peak1:.1f} GFLOP/s |",
        f"| fp32 matmul peak, {cores} threads | {peakn:.1f} GFLOP/s "
        f"({peakn / peak1:.2f}x one thread) |",
        f"| training FLOPs per frame (`training_flops_per_frame`) | {fpf / 1e6:.2f} MFLOP |",
        f"| cap: {cores} x one-thread peak / FLOPs per frame | {cap_fps:,.0f} frames/s |",
        f"| rnntrain, reference model | {lstm['frames_per_s']:,.0f} frames/s = "
        f"{useful:.1f} useful GFLOP/s |",
        f"| **share of the cap** (goal >= 85%) | **{useful / cap_gflops:.0%}** |",
        f"| peak RSS of `rnntrain train` (whole process) | {lstm['maxrss_mb']:,.0f} MB |",
        f"| peephole cell (RNNLIB's LSTM) vs built-in nn.LSTM, same data | "
        f"{peep['frames_per_s']:,.0f} vs {peep_lstm['frames_per_s']:,.0f} frames/s = "
        f"**{peep['frames_per_s'] / peep_lstm['frames_per_s']:.2f}x** (goal >= 0.5x) |", "",
        "- reference model: 3-layer BLSTM, 256 per direction, 40 inputs, 30 labels + blank; "
        f"{'60' if quick else '240'} sequences of speech-like lengths (median 300 frames), "
        "`train.batch_frames = 12000`, one epoch, Adam. Useful FLOPs count only the "
        "matmuls of the model on real frames (no padding, no elementwise gate math), "
        "forward + backward = 3 x forward; the issue quotes 22.4 MFLOP per frame, this "
        f"formula gives {fpf / 1e6:.2f} ({(fpf - 6 * 2 * wl.REF_HIDDEN * (wl.REF_LABELS + 1)) / 1e6:.2f} "
        "without the output layer).",
        f"- peephole row: {'30' if quick else '80'} sequences, both cells in rnntrain with "
        "the same config; the peephole cell runs a Python-level time loop with a "
        "hand-written backward (`rnntrain/peephole.py`).", ""])


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
