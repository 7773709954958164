"""Shared benchmark workloads: the default synthetic task, the reference speech-like task,
and running rnntrain on them as a user does (a subprocess with a TOML config).

Not a section itself (no ``run``): bench sections import it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# The reference model of issue 8: 3-layer BLSTM, 256 per direction, 40 inputs, 30 labels.
REF_INPUTS, REF_LABELS, REF_LAYERS, REF_HIDDEN = 40, 30, 3, 256
REF_BATCH_FRAMES, REF_SEED = 12000, 1  # the reference config's batch.batch_frames, train.seed


def workdir() -> Path:
    """A scratch folder for one bench run (removed by the OS tmp cleaner, not by us:
    runs are small)."""
    return Path(tempfile.mkdtemp(prefix="rnntrain-bench-"))


def default_data(folder: Path, quick: bool = False) -> Path:
    """The embedded default task (``rnntrain-data synth`` defaults: 20 labels, 20 inputs)."""
    from data_tools.synth import write_synth
    path = folder / "synth_train.nc"
    write_synth(str(path), num_seqs=500 if quick else 2000, num_labels=20, input_size=20, seed=1)
    return path


def reference_data(folder: Path, num_seqs: int, seed: int = 7) -> Path:
    """Speech-like lengths for the reference model: log-normal around 300 frames (100 fps,
    ~3 s utterances; 5% over 2x the median), 40 random features, one label per ~10 frames.

    Throughput does not depend on what the features mean, so they are random; the lengths
    and the label rate are what matter (padding, CTC lattice size).
    """
    from rnntrain.data.ncdata import NcWriter
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(300), 0.5, num_seqs), 60, 1500).astype(int)
    labels = [f"p{i:02d}" for i in range(REF_LABELS)]
    targets = [" ".join(labels[j] for j in rng.integers(REF_LABELS, size=max(1, n // 10)))
               for n in lengths]
    path = folder / f"ref_{num_seqs}.nc"
    with NcWriter(str(path), labels, REF_INPUTS, lengths.tolist(), targets,
                  [f"ref_{i:05d}" for i in range(num_seqs)]) as w:
        for n in lengths:
            w.append(rng.standard_normal((n, REF_INPUTS), dtype=np.float32))
    return path


# The peak resident memory of this process image alone: /proc/self/status VmHWM. Not
# ru_maxrss: Linux carries the parent's peak over a vfork + exec (subprocess uses vfork),
# so a child started from a bench process that had held 2 GB reported 2 GB itself; that
# is why two sections once disagreed 2x on the same workload's bf16 memory.
PEAK_RSS_CODE = ("def _peak_rss_kb():\n"
                 "    for ln in open('/proc/self/status'):\n"
                 "        if ln.startswith('VmHWM:'):\n"
                 "            return int(ln.split()[1])\n"
                 "    import resource\n"
                 "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n")

_RUNNER = (PEAK_RSS_CODE +
           "import resource, sys\n"
           "from rnntrain.cli import main\n"
           "rc = main(sys.argv[1:])\n"
           "ru = resource.getrusage(resource.RUSAGE_SELF)\n"
           "print('BENCH_MAXRSS_KB', _peak_rss_kb(), ru.ru_utime + ru.ru_stime, file=sys.stderr)\n"
           "sys.exit(rc)\n")


def run_rnntrain(config: Path, overrides: list[str], run_dir: Path,
                 timeout: float = 600) -> dict:
    """``rnntrain train CONFIG overrides`` in a fresh process, one metrics line per epoch.

    Returns frames_per_s (real frames over the epoch's loop time, as rnntrain reports it,
    of the last epoch), maxrss_mb (peak resident memory of the process), cpu_s (its user +
    system CPU seconds: what the run cost, whatever else the machine ran) and the command.
    """
    args = ["train", str(config), *overrides, f"run.dir={run_dir}", "log.every_steps=1000000"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", _RUNNER, *args], capture_output=True,
                       text=True, timeout=timeout, env=env, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"rnntrain train failed ({r.returncode}): {r.stderr[-1500:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in recs if x["split"] == "train"]
    peak = [ln.split() for ln in r.stderr.splitlines() if ln.startswith("BENCH_MAXRSS_KB")]
    return {"frames_per_s": train[-1]["frames_per_s"],
            "maxrss_mb": int(peak[0][1]) / 1024 if peak else float("nan"),
            "cpu_s": float(peak[0][2]) if peak else float("nan"), "records": train,
            "command": "rnntrain " + " ".join(args[:-2] + args[-1:])}


def write_toml(path: Path, table: dict) -> Path:
    lines = []
    for sec, values in table.items():
        lines.append(f"[{sec}]")
        for k, v in values.items():
            s = ("true" if v else "false") if isinstance(v, bool) else \
                (f'"{v}"' if isinstance(v, str) else repr(v))
            lines.append(f"{k} = {s}")
    path.write_text("\n".join(lines) + "\n")
    return path


def reference_config(folder: Path, train: Path, cell: str = "lstm",
                     batch_frames: int = REF_BATCH_FRAMES) -> Path:
    return write_toml(folder / f"ref_{cell}.toml", {
        "data": {"train": str(train)},
        "model": {"layers": REF_LAYERS, "hidden": REF_HIDDEN, "bidirectional": True,
                  "cell": cell},
        "optim": {"name": "adam", "lr": 1e-3, "clip_norm": 5.0},
        "train": {"epochs": 1, "seed": REF_SEED},
        "batch": {"batch_frames": batch_frames},
    })


def machine() -> dict:
    """CPU model, cores, versions: printed with every figure."""
    import platform

    import torch
    cpu = platform.processor() or "unknown CPU"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": f"{cpu} [{cpu_flags()}]", "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(),
            "numpy": np.__version__}


def cpu_flags() -> str:
    """The CPU features that change our figures: AMX (Intel) and AVX-512 bf16 (both)."""
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("flags")), [])
    except OSError:
        return "flags unknown"
    amx = any(f.startswith("amx") for f in flags)
    return ", ".join([("AMX" if amx else "no AMX"),
                      ("avx512_bf16" if "avx512_bf16" in flags else "no avx512_bf16"),
                      ("avx512f" if "avx512f" in flags else "no avx512f")])

