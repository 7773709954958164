"""Helper of tests/test_torchdist.py, run under ``torchrun --nproc_per_node N``.

    python tests/torch_buckets.py OUT DEVICE

Checks ``torchdist.GradBuckets`` (the exchange overlapped with backward): a small model
(BLSTM + linear output, the trainer's shape of network) gets rank-specific inputs; one
backward with the buckets armed must leave every rank holding the SUM over ranks of the
plain per-rank gradients (computed first, without hooks, and gathered); buckets must start
in reverse parameter order, some of them while backward is still running. Rank 0 writes
OUT/buckets.json.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch

from rnntrain.parallel import launch
from rnntrain.parallel.torchdist import GradBuckets


def main():
    out, device = Path(sys.argv[1]), torch.device(sys.argv[2])
    comm = launch.init(None, device.type)
    if device.type == "cuda":
        torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)  # same weights everywhere
    lstm = torch.nn.LSTM(6, 12, num_layers=2, bidirectional=True).to(device)
    head = torch.nn.Linear(24, 5).to(device)
    params = list(lstm.parameters()) + list(head.parameters())
    numel = sum(p.numel() for p in params)
    grads = torch.zeros(numel, device=device)
    torch.manual_seed(100 + comm.rank)  # different data per rank
    x = torch.randn(7, 3, 6, device=device)

    def backward():
        for p in params:
            p.grad = None
        y, _ = lstm(x)
        (head(y) ** 2).mean().backward()

    backward()  # the plain per-rank gradient
    mine = torch.cat([p.grad.reshape(-1) for p in params]).cpu().numpy()
    ref = comm.allgather_(mine).astype(np.float64).sum(0)

    off = 0  # the trainer's layout: every .grad a view of one flat buffer
    for p in params:
        p.grad = grads[off: off + p.numel()].view_as(p)
        off += p.numel()
    # ~4 KB buckets: several buckets for this ~10k-parameter model
    b = GradBuckets(comm, params, grads, bucket_bytes=4096)
    b.arm()
    y, _ = lstm(x)
    (head(y) ** 2).mean().backward()
    b.finish()
    got = grads.cpu().numpy().astype(np.float64)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    if comm.rank == 0:
        (out / "buckets.json").write_text(json.dumps({
            "err": err, "buckets": b.buckets, "launched": b.launched,
            "during_backward": b.launched_during_backward, "numel": numel,
            "last_param_numel": params[-1].numel(), "size": comm.size}))
    comm.barrier()


if __name__ == "__main__":
    main()
