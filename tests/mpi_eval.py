"""Run by tests/test_mpi.py (under mpiexec or alone): ``evaluate`` of a fixed model on
DATA, with the counts summed over the ranks; rank 0 writes them to OUT (JSON).

    python tests/mpi_eval.py OUT DATA
"""
from __future__ import annotations

import json
import sys

import torch

from rnntrain.compute.model import CTCModel, init_uniform
from rnntrain.config import Config
from rnntrain.data.dataset import Dataset
from rnntrain.parallel import launch as dist
from rnntrain.run.evaluate import evaluate


def main(out: str, data: str):
    comm = dist.init(Config().dist, "cpu")
    ds = Dataset.open(data)
    torch.manual_seed(0)
    model = CTCModel(ds.input_size, ds.num_labels, layers=1, hidden=16)
    init_uniform(model, 0.5, torch.Generator().manual_seed(1))  # varied hypotheses
    keep = ds.feasible(1)
    keep[:2] = False  # skipped sequences are counted once, not once per rank
    c = evaluate(model, ds, keep, 150, torch.device("cpu"), comm, space=0, workers=2)["best"]
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump({"ranks": comm.size, "counts": c.as_array().tolist()}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
