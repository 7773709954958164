"""The CUDA path (skipped without a GPU; the same logic on CPU: test_device.py).

- a training step on CUDA (worker thread with its own stream, pinned copies on the side
  stream) gives the CPU step's gradient and figures within fp32 tolerance;
- bf16 training lowers the loss; an fp16 run of the real loop trains with loss scaling;
- no per-step synchronisation: PyTorch's sync debug mode reports every synchronising call
  (blocking copies, .item(), stream syncs); a step may contain only those that the native
  CUDA CTC loss makes itself, counted here on the CTC alone.
"""
from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

from rnntrain.data.dataset import Dataset
from rnntrain.compute.device import NanGuard, masked_step, worker_start
from rnntrain.compute.model import CTCModel, ctc_loss_sum
from rnntrain.compute.pool import Task, WorkerPool
from rnntrain.compute.tasks import FlatGrad, TaskComputer

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def strict_fp32():
    """fp32 means fp32 here: TF32 matmuls would exceed an fp32 tolerance."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def batch(synth_pair, n=8):
    ds = Dataset.open(str(synth_pair[0]))
    payload = ds.load_chunk(0)
    ids = [i for i in sorted(payload) if ds.feasible()[i]][:n]
    return [payload[i] for i in ids], [ds.targets[i] for i in ids]


def tasks_of(frames, targets, splits):
    return [Task(j, tuple(g), ([frames[s] for s in g], [targets[s] for s in g]))
            for j, g in enumerate(splits)]


def one_step(model, device, frames, targets, splits, threaded=False, precision="fp32"):
    """Task compute (on a pool worker with its own stream if threaded) and reduce."""
    computer = TaskComputer(model, device, precision=precision)
    computer.ensure_buffers(len(splits))
    computer.begin_step()
    tasks = tasks_of(frames, targets, splits)
    if not threaded:
        fences = [computer(0, t) for t in tasks]
    else:
        with WorkerPool(computer, 1, on_start=lambda w: worker_start(device)) as pool:
            fences, _ = pool.run(tasks)
    flat = FlatGrad(list(model.parameters()), device)
    flat.reduce_tasks(computer.buffers[: len(splits)], fences)
    return flat


def test_cuda_step_matches_cpu_step(synth_pair):
    frames, targets = batch(synth_pair)
    torch.manual_seed(0)
    cpu_model = CTCModel(frames[0].shape[1], 6, layers=2, hidden=32)
    gpu_model = copy.deepcopy(cpu_model).to(CUDA)
    splits = [[0, 1, 2], [3, 4, 5], [6, 7]]
    ref = one_step(cpu_model, CPU, frames, targets, splits)
    got = one_step(gpu_model, CUDA, frames, targets, splits, threaded=True)
    torch.cuda.synchronize()
    a, b = ref.stats, got.stats
    assert b[1:3] == a[1:3] and b[4] == a[4]
    assert b[0] == pytest.approx(a[0], rel=1e-4)
    torch.testing.assert_close(got.grad.cpu(), ref.grad, rtol=1e-3, atol=1e-4)
    n1, f1 = ref.normalize_and_clip("sequences", 1.0)
    n2, f2 = got.normalize_and_clip("sequences", 1.0)
    assert n2.item() == pytest.approx(n1.item(), rel=1e-3) and f1.item() and f2.item()


def test_bf16_training_lowers_the_loss(synth_pair):
    frames, targets = batch(synth_pair)
    torch.manual_seed(0)
    model = CTCModel(frames[0].shape[1], 6, layers=2, hidden=64).to(CUDA)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    losses = []
    for _ in range(30):
        flat = one_step(model, CUDA, frames, targets, [[0, 1, 2, 3], [4, 5, 6, 7]],
                        precision="bf16")
        losses.append(flat.stats.loss)
        _, finite = flat.normalize_and_clip("sequences", 1.0)
        masked_step(opt, finite)
    assert all(l == l for l in losses) and losses[-1] < 0.5 * losses[0]


def count_syncs(fn) -> int:
    """Synchronising CUDA calls made by fn(), as reported by the sync debug mode."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def test_no_per_step_synchronisation(synth_pair):
    frames, targets = batch(synth_pair)
    splits = [[0, 1, 2, 3], [4, 5, 6, 7]]
    torch.manual_seed(0)
    model = CTCModel(frames[0].shape[1], 6, layers=2, hidden=32, dropout=0.2).to(CUDA)
    params = list(model.parameters())
    computer = TaskComputer(model, CUDA, input_noise=0.1, precision="fp16")
    computer.want_errors = False  # the host-read LER is for logging steps only
    computer.ensure_buffers(len(splits))
    flat = FlatGrad(params, CUDA)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    guard = NanGuard(CUDA)
    acc = torch.zeros(5, dtype=torch.float64, device=CUDA)
    tasks = tasks_of(frames, targets, splits)

    # what the native CTC loss itself costs per task (forward + backward), measured alone
    lp = torch.randn(60, 4, 7, device=CUDA).log_softmax(-1).requires_grad_()
    lengths = torch.tensor([60, 50, 40, 30])
    ctc_syncs = count_syncs(lambda: ctc_loss_sum(lp, lengths, targets[:4], 6).backward())

    def steps(pool, n):
        nonlocal acc
        for _ in range(n):
            computer.begin_step()
            fences, _ = pool.run(tasks)
            flat.reduce_tasks(computer.buffers[: len(tasks)], fences)
            norm, finite = flat.normalize_and_clip("sequences", 1.0, computer.scaler.scale)
            masked_step(opt, finite)
            guard.add(finite | computer.scaler.update(finite, flat.stats_tensor[0]))
            acc = acc + flat.stats_tensor

    with WorkerPool(computer, 1, on_start=lambda w: worker_start(CUDA)) as pool:
        steps(pool, 2)  # warm-up: cuDNN plans, optimizer state, allocator
        torch.cuda.synchronize()
        n = 4
        got = count_syncs(lambda: steps(pool, n))
    assert got <= n * len(tasks) * ctc_syncs, (got, ctc_syncs)
    assert acc[1].item() == 6 * len(frames) and guard.read()[1] == 0


def test_fp16_training_run_on_cuda(synth_pair, tmp_path):
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    train_nc, val_nc = synth_pair
    cfg = load_config(None, [f"data.train={json.dumps(str(train_nc))}",
                             f"data.val={json.dumps(str(val_nc))}", "model.hidden=32",
                             "train.epochs=4", "batch.batch_frames=2000", "optim.lr=0.01",
                             "compute.precision=fp16", "compute.device=cuda", "log.every_steps=5",
                             f"run.dir={json.dumps(str(tmp_path))}"])
    train(cfg)
    recs = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    tr = [r for r in recs if r["split"] == "train"]
    assert all(r["loss"] == r["loss"] for r in tr) and tr[-1]["loss"] < tr[0]["loss"]


def test_repeated_runs_in_one_process_leave_no_device_memory(synth_pair, tmp_path):
    """cuBLAS keeps a workspace per stream for the life of the process: a run that made
    fresh worker streams left 65 MiB more allocated after every in-process ``train()``
    (measured on an H100). Each worker now keeps its streams for the life of the process:
    every run uses the same stream objects, and with cuBLAS's workspaces released (they
    come back on first use, and which worker stream first runs a matmul in which run
    depends on thread timing: 66 MiB more after the second run than after the first on an
    H200) every run leaves exactly what the first left."""
    import gc
    from rnntrain.compute import device as dev
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    train_nc, _ = synth_pair
    after, streams = [], []
    for k in range(3):
        cfg = load_config(None, [f"data.train={json.dumps(str(train_nc))}", "model.hidden=32",
                                 "train.epochs=1", "batch.batch_frames=2000",
                                 "compute.device=cuda", "compute.threads=2",
                                 f"run.dir={json.dumps(str(tmp_path / str(k)))}"])
        train(cfg)
        gc.collect()
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        after.append(torch.cuda.memory_allocated())
        streams.append({key: tuple(s.cuda_stream for s in pair)
                        for key, pair in dev._streams.items()})
    assert streams[0] and streams[1] == streams[0] and streams[2] == streams[0], streams
    assert after[1] == after[0] and after[2] == after[0], after
