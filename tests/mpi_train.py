"""Helper of tests/test_mpi.py and tests/test_torchdist.py, run alone or under
``mpiexec -n N`` or ``torchrun --nproc_per_node N`` (the engine is picked as in training).

    python tests/mpi_train.py OUT CONFIG NAME=OVERRIDES... 

Phase 1 (only with more than one rank): start-up synchronisation with deliberately
different weights and optimizer state per rank; writes OUT/sync-rank<r>.npy (the checksum
before and after) and checks that a disagreement raises UserError on every rank.
Phase 2: one training run per NAME (overrides separated by commas, in one process so the
interpreter starts once); rank 0 writes OUT/<NAME>.npz with the final weights, every rank
OUT/<NAME>.calls-rank<r>.json with the collectives the run issued (by method).
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch

from rnntrain.parallel import launch as dist
from rnntrain.config import load_config
from rnntrain.errors import UserError
from rnntrain.parallel.exchange import Exchange
from rnntrain.compute.tasks import FlatGrad
from rnntrain.run.train import train


def sync_phase(out: Path, comm):
    torch.manual_seed(100 + comm.rank)  # different weights on purpose
    model = torch.nn.LSTM(4, 8)
    params = list(model.parameters())
    opt = torch.optim.Adam(params)
    model(torch.randn(3, 2, 4))[0].sum().backward()
    opt.step()                         # non-empty, rank-specific optimizer state

    class D:
        mode, wire = "allreduce", "fp32"
    ex = Exchange(comm, D(), FlatGrad(params, torch.device("cpu")), params)
    before = float(sum(p.double().sum() for p in params))
    state = ex.sync_start(model, opt, {"step": 10 + comm.rank})
    after = float(sum(p.double().sum() for p in params))
    adam = float(sum(v.double().sum() for s in opt.state_dict()["state"].values()
                     for v in s.values() if torch.is_tensor(v)))
    try:
        comm.check_same(comm.rank, "a value that differs")
        raised = 0.0
    except UserError as e:
        raised = 1.0 if "rank 1: 1" in str(e) else 0.5
    np.save(out / f"sync-rank{comm.rank}.npy",
            np.array([before, after, adam, state["step"], raised]))


def main():
    out, config, *runs = sys.argv[1:]
    out = Path(out)
    comm = dist.init()
    if comm.size > 1:
        sync_phase(out, comm)
    for spec in runs:
        name, _, ov = spec.partition("=")
        overrides = [o for o in ov.split(",") if o] + [f"run.dir={out / name}"]
        before = dict(comm.calls)
        train(load_config(config, overrides), config, overrides)
        calls = {k: v - before.get(k, 0) for k, v in comm.calls.items()}
        (out / f"{name}.calls-rank{comm.rank}.json").write_text(json.dumps(calls))
        if comm.rank == 0:
            ck = torch.load(out / name / "checkpoints" / "last.pt", weights_only=True)
            np.savez(out / f"{name}.npz", **{k: v.numpy() for k, v in ck["model"].items()})


if __name__ == "__main__":
    main()
