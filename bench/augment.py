"""The cost of on-the-fly augmentation ([augment]): the image and speech presets.

Two figures per preset: the augmenter alone (one thread, microseconds per input frame
over every sequence of the data set, as a worker spends them before collation) and
training throughput with and without the preset (``rnntrain train``, a fresh process
each, the last epoch's frames/s). Lines: rendered printed lines, 32 pixels high, with
``configs/printed_lines.toml``; speech: speech-like feature sequences (40 features,
~300 frames, ``workloads.reference_data``) with ``configs/fsdd_digits.toml``'s model.

Run alone: ``python -m bench.augment [--quick]``.
"""
from __future__ import annotations

import sys
import time

from bench import workloads as wl


def augmenter_cost(data, preset: str, config) -> tuple[float, int]:
    """→ (microseconds per input frame, frames) of the preset's augmenter over ``data``."""
    from rnntrain.augment import Augmenter
    from rnntrain.compute.model import total_subsample
    from rnntrain.config import load_config
    from rnntrain.data.dataset import Dataset
    cfg = load_config(config, [f"data.train={data}", f"augment.preset={preset}"])
    ds = Dataset.open(str(data))
    aug = Augmenter.for_training(cfg, ds, total_subsample(cfg.model))
    frames = {}
    for k in range(len(ds.chunks)):
        frames.update(ds.load_chunk(k))
    t0 = time.perf_counter()
    for s, f in frames.items():
        aug(0, s, f, ds.targets[s])
    dt = time.perf_counter() - t0
    n = sum(len(f) for f in frames.values())
    return 1e6 * dt / n, n


def run(quick: bool = False) -> str:
    from bench.ocr import line_data
    folder = wl.workdir()
    lines = line_data(folder, 80 if quick else 300)
    speech = wl.reference_data(folder, 60 if quick else 300)
    cases = [("lines", lines, wl.ROOT / "configs" / "printed_lines.toml", "columns"),
             ("speech", speech, wl.ROOT / "configs" / "fsdd_digits.toml", "frames")]
    rows, commands = [], []
    for preset, data, config, unit in cases:
        us, n = augmenter_cost(data, preset, config)
        over = [f"data.train={data}", 'data.val=""', 'data.test=""', "train.epochs=2"]
        fps = {}
        for p in ("none", preset):
            r = wl.run_rnntrain(config, [*over, f"augment.preset={p}"],
                                folder / f"run_{preset}_{p}")
            fps[p] = r["frames_per_s"]
            commands.append(r["command"])
        cost = fps["none"] / fps[preset] - 1  # time per frame, on over off
        rows.append(f"| {preset} | {config.name} | {n:,} {unit} | {us:.1f} | "
                    f"{fps['none']:,.0f} | {fps[preset]:,.0f} | {100 * cost:+.0f} % |")
    m = wl.machine()
    return "\n".join([
        "## Augmentation cost", "",
        f"`python -m bench augment{' --quick' if quick else ''}` on {m['cpu']}, "
        f"{m['cores']} cores, torch {m['torch']}. Augmenter alone: one thread, every "
        "sequence once, per input frame (column or feature frame). Training: `rnntrain "
        "train` with the preset off and on, 2 epochs, the second epoch's throughput "
        "(the augmented widths and lengths count as they are, so speed perturbation's "
        "longer sequences count as more frames).", "",
        "| preset | model | data | augmenter us/frame | train frames/s off | on | "
        "time per frame |", "|---|---|---:|---:|---:|---:|---:|", *rows, "",
        *[f"- `{c}`" for c in commands], ""])


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
