"""What reliability costs: checkpoint write/load time and the per-step stop-flag agreement.

Measured on the reference model (3-layer BLSTM, 256 per direction, 40 inputs, 30 labels)
with its Adam state: the size of a checkpoint, the time to write it (temp file, fsync,
rename: ``checkpoint.save``), to load it, and to choose among three files for
``--resume auto``; the write time is set against the default interval
(``checkpoint.every_minutes = 10``). Under MPI, SIGINT/SIGTERM are agreed over ranks
through one more float in the step's gradient message; what a separate 4-byte allreduce
per step (the design before) would cost at 2 ranks is measured next to the gradient
allreduce of the same model.

    python -m bench.checkpoint [--quick]
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
INPUTS, LABELS, LAYERS, HIDDEN = 40, 30, 3, 256

_MPI_PROBE = r"""
import sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
n, reps = int(sys.argv[1]), int(sys.argv[2])
for size, label in ((1, "flag"), (n, "grad")):
    buf = np.ones(size, dtype=np.int32 if size == 1 else np.float32)
    k = reps if size == 1 else max(3, reps // 200)
    for _ in range(3):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    dt = (time.perf_counter() - t0) / k
    if comm.rank == 0:
        print(label, dt, flush=True)
"""


def _dataset():
    """A real (small) dataset of the benchmark model's shape: what a checkpoint records
    from it (labels, input size, frame geometry) comes from the reader itself."""
    from data_tools.synth import write_synth
    from rnntrain.data.dataset import Dataset
    path = Path(tempfile.mkdtemp(prefix="rnntrain-bench-ckpt-data-")) / "d.nc"
    write_synth(str(path), num_seqs=4, num_labels=LABELS, input_size=INPUTS, seed=1)
    return Dataset.open(str(path))


def _model_and_optimizer():
    from rnntrain.config import Config
    from rnntrain.compute.model import build_model
    from rnntrain.compute.optim import build_optimizer
    cfg = Config()
    cfg.data.train = "bench.nc"
    cfg.model.layers, cfg.model.hidden = LAYERS, HIDDEN
    torch.manual_seed(0)
    model = build_model(cfg.model, INPUTS, LABELS)
    opt = build_optimizer(cfg.optim, list(model.parameters()))
    for p in model.parameters():  # one update, so that Adam's moments exist
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    return cfg, model, opt


def measure_files(reps: int) -> dict:
    from rnntrain.run import checkpoint as ckpt
    from rnntrain.artifact.runfolder import RunFolder
    from rnntrain.run.state import TrainState
    from rnntrain.config import to_dict
    cfg, model, opt = _model_and_optimizer()
    ds = _dataset()
    state = TrainState(epoch=0, pos=5, step=5, best_ler=1.0)
    card = ckpt.ModelCard.of_data(ds, to_dict(cfg))
    run = RunFolder(Path(tempfile.mkdtemp(prefix="rnntrain-bench-ckpt-")))
    run.make()
    run_dir = run.root
    try:
        writes = []
        for i in range(reps):
            state.step = i + 1
            t0 = time.perf_counter()  # what the training loop does: write, then prune
            ckpt.save(run.step(i + 1), card, {"model": model, "optim": opt, "state": state})
            run.prune(3)
            writes.append(time.perf_counter() - t0)
        newest = run.step_checkpoints()[-1]
        loads = []
        for _ in range(reps):
            t0 = time.perf_counter()
            ckpt.read(newest)
            loads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ck = ckpt.load_for_resume("auto", run, ds, {"model": model, "optim": opt},
                                  to_dict(cfg)["model"])
        choose = time.perf_counter() - t0
        assert ck.state().step == reps
        return {"params": sum(p.numel() for p in model.parameters()),
                "mb": newest.stat().st_size / 2**20, "write_s": float(np.median(writes)),
                "load_s": float(np.median(loads)), "auto_s": choose}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def measure_mpi(numel: int, reps: int) -> dict | None:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    mpiexec = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        return None
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", _MPI_PROBE, str(numel),
                        str(reps)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return None
    out = dict(line.split() for line in r.stdout.splitlines() if line.strip())
    return {"flag_s": float(out["flag"]), "grad_s": float(out["grad"])}


def run(quick: bool = False) -> str:
    f = measure_files(reps=3 if quick else 10)
    m = measure_mpi(f["params"], reps=500 if quick else 5000)
    interval = 600.0
    lines = [
        "## Reliability costs: checkpoints and stop signals",
        "",
        f"Reference model: {LAYERS}-layer BLSTM, {HIDDEN} per direction, {INPUTS} inputs, "
        f"{LABELS} labels ({f['params']:,} parameters) with its Adam state.",
        "",
        "| what | measured |",
        "|---|---|",
        f"| checkpoint size | {f['mb']:.1f} MiB |",
        f"| write (temp file, fsync, rename, prune), median | {f['write_s'] * 1e3:.0f} ms |",
        f"| load (`weights_only=True`), median | {f['load_s'] * 1e3:.0f} ms |",
        f"| `--resume auto` among 3 files (reads each, loads the newest) | "
        f"{f['auto_s'] * 1e3:.0f} ms |",
        f"| write time / default interval (`every_minutes = 10`) | "
        f"{100 * f['write_s'] / interval:.3f} % of training time |",
    ]
    if m is not None:
        lines += [
            f"| a separate stop-flag allreduce (4 bytes, 2 ranks; not used: the flag rides "
            f"in the gradient message), per step | "
            f"{m['flag_s'] * 1e6:.1f} us |",
            f"| gradient allreduce of the same model (fp32, 2 ranks), per step | "
            f"{m['grad_s'] * 1e3:.2f} ms |",
            f"| that separate flag / gradient allreduce | "
            f"{100 * m['flag_s'] / m['grad_s']:.2f} % |",
        ]
    lines += [
        "",
        "At most the steps since the last checkpoint are lost to a crash: with the defaults "
        "that is 10 minutes of training, for the write cost above.",
        "",
        "Reproduce: `python -m bench.checkpoint" + (" --quick" if quick else "") + "`",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
