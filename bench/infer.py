"""Inference speed of the FSDD recipe's model: real-time factor and utterances/s.

The model is the one configs/fsdd_digits.toml trains (2-layer BLSTM, 96 units per
direction, 40 log-mel bands at 8 kHz, 4 frames stacked). ``runs/fsdd_digits`` is used
when recipes/fsdd_digits.sh has trained it; otherwise a checkpoint of that architecture
with untrained weights (the time does not depend on the weights' values). Utterances are
strings of 5 FSDD recordings from ../shared/data or $RNNTRAIN_DATA (about 2-3 s each, as the recipe's test
set); without the recordings, noise of the same length.

Real-time factor (RTF) = seconds of compute / seconds of audio, one utterance at a time:
the network alone (eager PyTorch, TorchScript, ONNX Runtime) on 1 and 2 threads, and the
whole path (read, resample if needed, features, network, best path, peak times). Then
``transcribe`` over a folder of WAV files (in process, so without the ~2 s interpreter
and torch start), utterances/s with 1 and 2 worker threads.

    python -m bench infer [--quick]
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# $RNNTRAIN_DATA as the recipes read it, else ../shared/data beside the checkout (or beside
# the folder of worktrees)
RECORDINGS = next((p / "fsdd" / "recordings" for p in
                   [Path(os.environ.get("RNNTRAIN_DATA", ROOT / "missing")),
                    ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data"]
                   if (p / "fsdd" / "recordings").is_dir()), ROOT / "missing")
RATE = 8000


def utterances(n: int, seed: int = 0) -> tuple[list[np.ndarray], str]:
    """n signals at 8 kHz (float64) and where they came from."""
    rng = np.random.default_rng(seed)
    recs = sorted(RECORDINGS.glob("*.wav")) if RECORDINGS.is_dir() else []
    if not recs:
        return [0.05 * rng.standard_normal(int(RATE * rng.uniform(2, 3))) for _ in range(n)], \
            "noise (no FSDD recordings found)"
    from rnntrain.frontend.audio import load_signal
    out = []
    for _ in range(n):
        parts = []
        for p in rng.choice(len(recs), 5):
            parts += [0.001 * rng.standard_normal(int(RATE * 0.1)), load_signal(recs[p], RATE)]
        out.append(np.concatenate(parts))
    return out, f"strings of 5 FSDD recordings ({RECORDINGS})"


def model_checkpoint(folder: Path, signals: list[np.ndarray]) -> tuple[Path, str]:
    from rnntrain.artifact.runfolder import RunFolder
    trained = RunFolder(ROOT / "runs" / "fsdd_digits").best
    if trained.is_file():
        return trained, f"trained by recipes/fsdd_digits.sh ({trained})"
    import torch
    from rnntrain.compute.model import build_model
    from rnntrain.config import load_config, to_dict
    from rnntrain.frontend import FrontEnd
    from rnntrain.frontend import features as feat
    from rnntrain.run.checkpoint import FORMAT_VERSION, save_atomic
    cfg = load_config(ROOT / "configs" / "fsdd_digits.toml")
    fc = feat.FeatureConfig(kind="fbank", rate=RATE, n_mels=40)
    frames = np.concatenate([feat.compute(s, fc) for s in signals]).astype(np.float64)
    fe = FrontEnd("audio", 40, frames.mean(0), frames.std(0) + 1e-6, fc)
    torch.manual_seed(0)
    net = build_model(cfg.model, 40, 10)
    path = folder / "fsdd_arch.pt"
    save_atomic({"format": FORMAT_VERSION, "model": net.state_dict(), "config": to_dict(cfg),
                 "labels": [str(d) for d in range(10)], "input_size": 40,
                 "frontend": fe.to_dict()}, path)
    return path, "configs/fsdd_digits.toml's architecture, untrained weights (no trained " \
                 "runs/fsdd_digits here; speed does not depend on the weights)"


def _rtf(fn, items, durations, budget_s: float) -> float:
    """Compute seconds per audio second of fn over items in order, for up to budget_s of
    wall time (at least 3 items), after one warm-up call (first-call allocations, oneDNN
    primitive creation, TorchScript's profiling runs)."""
    fn(items[0])
    fn(items[1])
    spent = audio = 0.0
    for it, d in zip(items, durations):
        t0 = time.perf_counter()
        fn(it)
        spent += time.perf_counter() - t0
        audio += d
        if spent > budget_s and audio >= 3 * durations[0]:
            break
    return spent / audio


def run(quick: bool = False) -> str:
    import torch
    import rnntrain
    from rnntrain.infer.model import OnnxEngine
    from rnntrain.infer.transcribe import transcribe
    n = 6 if quick else 24
    budget = 1.0 if quick else 2.5    # seconds of compute per figure
    signals, where = utterances(n)
    durations = [len(s) / RATE for s in signals]
    tmp = Path(tempfile.mkdtemp(prefix="bench_infer_"))
    ck, what = model_checkpoint(tmp, signals)
    m = rnntrain.load(ck)
    frames = [m.frames(s) for s in signals]
    ts = rnntrain.load(m.export(tmp / "m.ts", "torchscript", frames[:3]))
    ox = rnntrain.load(m.export(tmp / "m.onnx", "onnx", frames[:3]))
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ox.engine = OnnxEngine(tmp / "m.onnx", threads)
        r = {name: _rtf(eng.log_probs, frames, durations, budget)
             for name, eng in (("eager", m), ("TorchScript", ts), ("ONNX Runtime", ox))}
        e2e = _rtf(lambda s: m.transcribe(s), signals, durations, budget)
        rows.append((threads, r, e2e))
    # transcribe over a folder of WAV files
    import soundfile as sf
    wav = tmp / "wav"
    wav.mkdir()
    for i, s in enumerate(signals):
        sf.write(wav / f"u{i:03d}.wav", np.round(s * 32767).astype(np.int16), RATE)
    torch.set_num_threads(1)
    folder = []
    for name, path in (("eager", ck), ("ONNX Runtime", tmp / "m.onnx")):
        for workers in (1, 2):
            mm = rnntrain.load(path, threads=1)
            mm.transcribe(signals[0])  # warm up
            t0 = time.perf_counter()
            k = transcribe(mm, [str(wav)], threads=workers, out=io.StringIO(), progress=False)
            folder.append((name, workers, k / (time.perf_counter() - t0)))
    audio_s = sum(durations)

    def best_of(r):
        return min(r.values())
    lines = ["## Inference", "",
             f"`python -m bench infer{' --quick' if quick else ''}`: model {what}; up to {n} "
             f"utterances ({audio_s:.0f} s of audio): {where}. RTF = compute seconds / audio "
             f"seconds, one utterance at a time, over about {budget:g} s of compute per "
             f"figure; lower is better, 0.01 = 100x faster than real time.", "",
             "| threads | eager RTF | TorchScript RTF | ONNX Runtime RTF | ONNX vs best | "
             "whole path RTF (eager: audio → features → network → labels) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for threads, r, e2e in rows:
        lines.append(f"| {threads} | {r['eager']:.4f} | {r['TorchScript']:.4f} | "
                     f"{r['ONNX Runtime']:.4f} | {r['ONNX Runtime'] / best_of(r) - 1:+.0%} | "
                     f"{e2e:.4f} |")
    lines += ["", f"`transcribe` over a folder of {n} WAV files (in process; one intra-op "
                  f"thread per worker):", "", "| engine | workers | utterances/s |",
              "|---|---:|---:|"]
    lines += [f"| {name} | {w} | {u:.1f} |" for name, w, u in folder]
    goal = rows[0][1]
    lines += ["", f"Goal (issue 15): RTF <= 0.01 on one core — "
                  f"{'met' if best_of(goal) <= 0.01 else 'NOT met'} "
                  f"(best {best_of(goal):.4f}); ONNX within 10 % of the best — "
                  f"{'met' if goal['ONNX Runtime'] <= 1.1 * best_of(goal) else 'NOT met'}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(run("--quick" in sys.argv))
