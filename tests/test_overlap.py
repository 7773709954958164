"""The gradient exchange overlapped with backward (``dist.overlap``), in the training step.

- the last task's ``backward()`` into the flat buffer gives the same bytes as the
  fixed-order reduce of ``autograd.grad`` task buffers, with the figures final before the
  exchange is armed (CPU; CUDA where present);
- what cannot overlap is refused with one line naming the key;
- real ``torchrun --standalone --nproc_per_node 2`` jobs over gloo: overlapped training
  ends with the weights of the plain 2-rank run (bit for bit: a 2-rank sum is one
  addition) and of one rank (1e-6: rounding only); exact resume; one rank's stop request stops all after
  the same step; a rank that dies inside the overlapped exchange, or hangs, is named; on
  two or more GPUs the same over NCCL.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from rnntrain.compute.device import worker_start
from rnntrain.compute.model import CTCModel
from rnntrain.compute.pool import Task, WorkerPool
from rnntrain.compute.tasks import FlatGrad, TaskComputer
from rnntrain.config import DistConfig, load_config
from rnntrain.data.dataset import Dataset
from rnntrain.errors import ConfigError
from rnntrain.parallel.exchange import overlap_wanted
from rnntrain.parallel.comm import LocalComm

from tests.conftest import ROOT, mpiexec
from tests.test_mpi import rel_diff
from tests.test_torchdist import (check_n_ranks, fault, launch, serial_weights,  # noqa: F401
                                  tiny_config)

# ~500 floats a bucket: the tiny model (3.6k parameters) travels in 4 buckets
OVERLAP = "dist.overlap=on,dist.bucket_mb=0.002"
DEVICES = [torch.device("cpu"),
           pytest.param(torch.device("cuda", 0), marks=[pytest.mark.cuda, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="needs CUDA")])]


# ---- the compute side, one process

def tasks_for(synth_pair, splits):
    ds = Dataset.open(str(synth_pair[0]))
    payload = ds.load_chunk(0)
    ids = [i for i in sorted(payload) if ds.feasible()[i]]
    return [Task(j, tuple(g), ([payload[ids[s]] for s in g], [ds.targets[ids[s]] for s in g]))
            for j, g in enumerate(splits)], ds.frame_size


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [[[0, 1, 2], [3, 4, 5], [6, 7]], [[0, 1, 2, 3]]])
def test_last_task_backward_gives_the_reduce_bytes(synth_pair, device, splits):
    tasks, frame_size = tasks_for(synth_pair, splits)
    torch.manual_seed(0)
    model = CTCModel(frame_size, 6, layers=2, hidden=16).to(device)
    params = list(model.parameters())

    def step(overlap: bool):
        computer = TaskComputer(model, device)
        flat = FlatGrad(params, device)
        flat.msg.fill_(7.0)  # stale values from a previous step must not leak in
        seen = []

        def arm():  # what the exchange would send first: the figures, final by now
            seen.append(flat.stats_tensor.clone())
            flat.msg[flat.numel + flat.STOP] = 1.0
        computer.begin_step(len(tasks), (1, 0, 0), True, (flat, arm) if overlap else None)
        with WorkerPool(computer, 1, on_start=lambda w: worker_start(device),
                        inline=device.type == "cpu") as pool:
            fences, _ = pool.run(tasks)
        if not overlap:
            flat.reduce_tasks(computer.buffers[: len(tasks)], fences)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return flat, seen

    ref, _ = step(False)
    got, seen = step(True)
    assert len(seen) == 1 and torch.equal(seen[0], ref.stats_tensor)
    assert ref.stats.seqs == sum(len(s) for s in splits) and ref.stats.refs > 0
    if device.type == "cpu":  # the same additions in the same order: the same bytes
        assert torch.equal(got.buf, ref.buf)
    else:  # cuDNN's backward kernels may differ between runs in the last bits
        torch.testing.assert_close(got.buf, ref.buf, rtol=1e-5, atol=1e-6)
    assert got.msg[-1].item() == 1.0  # the stop flag, set by arm()
    assert float(got.grad.abs().sum()) > 0


# ---- refusals

@pytest.mark.parametrize("ov, words", [
    ("dist.mode=master", 'dist.overlap = "on" needs dist.mode = "allreduce" (got "master"'),
    ("dist.wire=bf16", 'dist.overlap = "on" needs dist.wire = "fp32" (got "bf16"'),
    ("dist.wire=fp16", 'dist.overlap = "on" needs dist.wire = "fp32" (got "fp16"'),
    ("dist.backend=mpi", 'dist.overlap = "on" needs dist.backend = "torch"'),
])
def test_what_cannot_overlap_is_a_config_error(tiny_config, ov, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_config(tiny_config, ["dist.overlap=on", ov])
    load_config(tiny_config, ["dist.overlap=auto", ov])  # auto: simply off there


def test_auto_is_off_alone_and_on_is_checked_alone_too():
    cpu, alone = torch.device("cpu"), LocalComm()
    assert not overlap_wanted(DistConfig(), alone, cpu, 1)
    assert not overlap_wanted(DistConfig(overlap="on"), alone, cpu, 1)  # nothing to exchange
    with pytest.raises(ConfigError, match=r"needs one worker per rank \(compute.threads = 1; "
                                          r"this rank runs 2\)"):
        overlap_wanted(DistConfig(overlap="on"), alone, cpu, 2)


@pytest.mark.torchrun
# slow (left out of the default run): by default, test_what_cannot_overlap_is_a_config_error
@pytest.mark.slow
def test_two_workers_per_rank_are_refused_in_one_line(tiny_config, tmp_path):
    r, _ = launch(2, "-m", "rnntrain", "train", tiny_config, f"run.dir={tmp_path / 'run'}",
                  "dist.overlap=on", "compute.threads=2")
    assert r.returncode != 0
    assert r.stderr.count('error: dist.overlap = "on" needs one worker per rank') == 1, \
        r.stderr[-2000:]
    assert f'File "{ROOT / "rnntrain"}' not in r.stderr


@pytest.mark.mpi
# slow (left out of the default run): by default, test_auto_is_off_alone_and_on_is_checked_alone_too
@pytest.mark.slow
@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found")
def test_mpi_ranks_are_refused(tiny_config, tmp_path):
    r = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "rnntrain", "train",
                        str(tiny_config), f"run.dir={tmp_path / 'run'}", "dist.overlap=on"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode != 0
    assert 'dist.overlap = "on" needs the torch.distributed engine (torchrun); this job ' \
           'runs on mpi' in r.stderr, r.stderr[-2000:]


# ---- real torchrun jobs over gloo

def metrics(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.torchrun
def test_overlapped_training_matches_plain_and_one_rank(tiny_config, serial_weights, tmp_path):
    """Two tasks per step (the last task's backward overlaps; the first is summed before)
    and one task per step (the whole backward overlaps), each beside its plain run."""
    runs = {"plain": "dist.overlap=auto", "overlap": OVERLAP,
            "overlap1": f"{OVERLAP},compute.tasks_per_worker=1"}
    # each within 1e-6 of one rank (check_n_ranks)
    w = check_n_ranks(2, tmp_path, tiny_config, serial_weights, runs,
                      env={"GLOO_SOCKET_IFNAME": "lo"})
    # a 2-rank sum is one addition whatever the bucketing: the same bytes
    assert rel_diff(w["plain"], w["overlap"]) == 0
    for name in ("overlap", "overlap1"):
        log = (tmp_path / name / "train.log").read_text()
        assert 'gradient exchange overlapped with backward: 4 bucket(s) of about 0.002 MB ' \
               '(dist.overlap = "on")' in log
        recs = [r for r in metrics(tmp_path / name) if r["split"] == "train"]
        # bucket 0 always starts during backward, the last one only once it has ended
        assert recs and all(0 < r["buckets_in_backward"] < 1 for r in recs), recs
    log = (tmp_path / "plain" / "train.log").read_text()
    assert "exchange overlapped" not in log  # auto: off on the CPU
    assert "buckets_in_backward" not in metrics(tmp_path / "plain")[0]


@pytest.mark.torchrun
# slow (left out of the default run): by default,
# test_overlapped_training_matches_plain_and_one_rank and test_resume.py
@pytest.mark.slow
def test_resume_with_overlap_is_exact(tiny_config, tmp_path):
    """Epoch 1, then epoch 2 resumed (both overlapped), vs 2 epochs in one go."""
    def train(run, epochs, *extra):
        r, _ = launch(2, "-m", "rnntrain", "train", tiny_config, f"run.dir={run}",
                      f"train.epochs={epochs}", "dist.overlap=on", "dist.bucket_mb=0.002",
                      *extra)
        assert r.returncode == 0, r.stderr[-3000:]
        return r
    train(tmp_path / "straight", 2)
    train(tmp_path / "resumed", 1)
    assert "resumed from" in train(tmp_path / "resumed", 2, "--resume").stderr
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)
    assert a["state"] == b["state"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for i, s in a["optim"]["state"].items():
        for k, v in s.items():
            assert torch.equal(v, b["optim"]["state"][i][k]), (i, k)


@pytest.mark.torchrun
def test_one_rank_asking_to_stop_stops_every_rank_after_the_same_step(tiny_config, tmp_path):
    """Rank 1 alone gets SIGTERM: its stop request rides bucket 0 with the figures, so
    rank 0 stops after the same step, checkpoints it, and the job ends cleanly."""
    r, _ = fault(2, tiny_config, tmp_path, 1, "term", extra=[*OVERLAP.split(",")])
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "run"
    m = re.search(r"stopped by a signal on another rank after step (\d+); checkpoint saved",
                  (run / "train.log").read_text())
    assert m, (run / "train.log").read_text()[-2000:]
    assert (run / "checkpoints" / f"step-{int(m.group(1)):08d}.pt").exists()
    assert json.loads((run / "status.json").read_text())["status"] == "stopped"


@pytest.mark.torchrun
def test_rank_dying_inside_the_overlapped_exchange_is_named(tiny_config, tmp_path):
    """SIGKILL right after rank 1's first bucket started, during its backward."""
    r, secs = fault(2, tiny_config, tmp_path, 1, "kill-in-backward",
                    extra=[*OVERLAP.split(","), "dist.timeout_s=10"])
    assert r.returncode != 0
    assert re.search(r"\[rank 0/2\] error: rank\(s\) 1 of 2 left the job during the gradient "
                     r"exchange of step 4 \(bucket \d of 4\) \(process died or raised",
                     r.stderr), r.stderr[-3000:]
    assert secs < 10 + 60  # start-up included: the dead peer is seen at once


@pytest.mark.torchrun
# slow (left out of the default run): by default,
# test_rank_dying_inside_the_overlapped_exchange_is_named and test_torchdist.py's stuck rank
@pytest.mark.slow
def test_rank_hanging_while_the_buckets_wait_is_named(tiny_config, tmp_path):
    """SIGSTOP on rank 1 at step 4: rank 0's buckets miss dist.timeout_s, the roll call
    names rank 1."""
    r, secs = fault(2, tiny_config, tmp_path, 1, "stop",
                    extra=[*OVERLAP.split(","), "dist.timeout_s=3"])
    assert r.returncode != 0
    assert re.search(r"\[rank 0/2\] error: rank\(s\) 1 of 2 did not arrive at the gradient "
                     r"exchange of step 4 \(bucket 1 of 4\) within dist.timeout_s = 3 s",
                     r.stderr), r.stderr[-3000:]
    assert secs < 90  # torchrun's own teardown of a stopped process takes 30 s more


# ---- CUDA: the same over NCCL, one rank per GPU

@pytest.mark.cuda
@pytest.mark.torchrun
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL "
                    "runs one rank per GPU)")
def test_overlapped_training_on_nccl(tiny_config, tmp_path):
    """dist.overlap = auto turns it on for CUDA ranks with one worker; the result matches
    the plain exchange within fp32 tolerance (cuDNN's kernels need not be bitwise stable)."""
    runs = {"plain": "compute.device=cuda,dist.overlap=off",
            "auto": "compute.device=cuda,dist.bucket_mb=0.002"}
    r, _ = launch(2, "tests/mpi_train.py", tmp_path, tiny_config,
                  *(f"{k}={v}" for k, v in runs.items()))
    assert r.returncode == 0, r.stderr[-3000:]
    w = {k: dict(np.load(tmp_path / f"{k}.npz")) for k in runs}
    assert rel_diff(w["plain"], w["auto"]) <= 1e-4
    assert "gradient exchange overlapped with backward" in \
        (tmp_path / "auto" / "train.log").read_text()
    assert "(gloo)" not in (tmp_path / "auto" / "train.log").read_text()  # NCCL's group
