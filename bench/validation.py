"""Validation and ``eval`` throughput against training throughput of the same model.

For the default workload (configs/default.toml on ``rnntrain-data synth`` data) and the
reference model (3-layer BLSTM, 256 per direction, speech-like lengths), one
``rnntrain train`` process trains an epoch with a validation set and the default thread
setting (all cores); its metrics give the training frames/s and, from the ``val`` record,
the validation frames/s. Then the checkpoint is scored the way ``rnntrain eval`` scores it
(``rnntrain.cli``'s loader and ``evaluate`` with its defaults), in a fresh process, best
of three passes over the validation set. The goal (issue 20): eval and validation at
least 2.5x the training frames/s.

    python -m bench validation [--quick]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.workloads import (ROOT, cpu_flags, default_data, reference_config, reference_data,
                             run_rnntrain, workdir)

GOAL = 2.5

# scores a checkpoint as `rnntrain eval` does (its loader, evaluate with its defaults),
# three times; prints frames/s of each pass and the counts of the last
_EVAL = """
import json, sys, time
from rnntrain.cli import _load_for_eval
from rnntrain.compute.model import total_subsample
from rnntrain.run.evaluate import evaluate
cfg, ds, model, dev = _load_for_eval(sys.argv[1], sys.argv[2], "cpu")
keep = ds.feasible(total_subsample(cfg.model))
fps = []
for _ in range(3):
    t0 = time.perf_counter()
    c = evaluate(model, ds, keep, cfg.batch.batch_frames, dev)["best"]
    fps.append(c.frames / (time.perf_counter() - t0))
print(json.dumps({"fps": fps, "summary": c.summary()}))
"""


def _eval_fps(ckpt: Path, data: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _EVAL, str(ckpt), str(data)], capture_output=True,
                       text=True, timeout=600, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"eval failed ({r.returncode}): {r.stderr[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _val_fps(run_dir: Path) -> float | None:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [x for x in recs if x["split"] == "val"]
    return val[-1].get("frames_per_s") if val else None


def _workload(name: str, config: Path, overrides: list[str], val: Path, folder: Path) -> dict:
    run_dir = folder / f"run-{name}"
    tr = run_rnntrain(config, [*overrides, f"data.val={val}", "train.epochs=1"], run_dir)
    from rnntrain.artifact.runfolder import RunFolder
    ev = _eval_fps(RunFolder(run_dir).last, val)
    return {"name": name, "train": tr["frames_per_s"], "val": _val_fps(run_dir),
            "eval": max(ev["fps"]), "command": tr["command"]}


def run(quick: bool = False) -> str:
    from data_tools.synth import write_synth
    folder = workdir()
    rows = []
    train = default_data(folder, quick)
    val = folder / "synth_val.nc"
    write_synth(str(val), num_seqs=200 if quick else 600, num_labels=20, input_size=20, seed=2)
    rows.append(_workload("default (2x128 BLSTM, configs/default.toml)",
                          ROOT / "configs" / "default.toml", [f"data.train={train}"], val,
                          folder))
    rtrain = reference_data(folder, 120 if quick else 400)
    rval = reference_data(folder, 60 if quick else 200, seed=8)
    rows.append(_workload("reference (3x256 BLSTM, 40 inputs, 31 classes)",
                          reference_config(folder, rtrain), [], rval, folder))
    lines = ["## Validation and eval throughput", "",
             f"CPU: {_cpu()} [{cpu_flags()}], {os.cpu_count()} cores. Training: one epoch of "
             "`rnntrain train` with the default threads (all cores) and a validation set; "
             "validation frames/s from its `val` metrics record; eval: the checkpoint scored "
             "as `rnntrain eval` does (best of 3 passes, fresh process). Goal: eval and "
             f"validation >= {GOAL}x training frames/s. Reproduce: "
             f"`python -m bench validation{' --quick' if quick else ''}`.", "",
             "| workload | training frames/s | validation frames/s | eval frames/s | "
             "validation / training | eval / training |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        v = f"{r['val']:,.0f}" if r["val"] else "n/a"
        vr = f"{r['val'] / r['train']:.2f}x" if r["val"] else "n/a"
        lines.append(f"| {r['name']} | {r['train']:,.0f} | {v} | {r['eval']:,.0f} | {vr} | "
                     f"{r['eval'] / r['train']:.2f}x |")
    lines += ["", "Training commands: " + "; ".join(f"`{r['command']}`" for r in rows), ""]
    return "\n".join(lines)


def _cpu() -> str:
    from bench.workloads import machine
    return machine()["cpu"].split(" [")[0]


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
