"""The MPI layer: N ranks train like one, start-up sync, failures end the job, wires.

MPI tests launch real ``mpiexec -n 2`` / ``-n 3`` jobs (no mocks) of tests/mpi_*.py.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import pytest

from rnntrain.parallel.mpi import launched_by_mpi
from rnntrain.parallel.exchange import WireCodec

from rnntrain.run.metrics import SPLIT_KEYS
from tests.conftest import ROOT, mpiexec

TINY = """[data]
train = "{train}"
[model]
layers = 1
hidden = 16
[train]
epochs = 1
seed = 3

[batch]
batch_frames = 600

[compute]
threads = 1

[log]
every_steps = 4
"""

needs_mpi = pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found")


@pytest.fixture(scope="module")
def tiny_config(synth_pair, tmp_path_factory):
    p = tmp_path_factory.mktemp("mpi") / "tiny.toml"
    p.write_text(TINY.format(train=synth_pair[0]))
    return p


def launch(n, *args, timeout=120, mpi_args=(), env=None):
    """Run ``python ARGS`` (n > 1: under mpiexec -n n); → (CompletedProcess, seconds)."""
    cmd = [sys.executable, *map(str, args)]
    if n > 1:
        cmd = [mpiexec(), *mpi_args, "-n", str(n), *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    return r, time.monotonic() - t0


def rel_diff(a: dict, b: dict) -> float:
    num = sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in a)
    den = sum(float(np.sum(a[k].astype(np.float64) ** 2)) for k in a)
    return (num / den) ** 0.5


# ---- no MPI needed

def test_launcher_detection_covers_mpich_openmpi_slurm_pmix():
    assert not launched_by_mpi({})
    assert launched_by_mpi({"PMI_RANK": "0", "PMI_SIZE": "2"})           # MPICH Hydra
    assert launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "4"})                # Open MPI
    assert launched_by_mpi({"PMIX_RANK": "1", "PMIX_NAMESPACE": "x"})    # PMIx
    srun = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "8"}
    assert launched_by_mpi(srun)
    # a plain python inside an sbatch allocation is not an MPI job
    assert not launched_by_mpi({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "8"})
    assert not launched_by_mpi({**srun, "SLURM_STEP_NUM_TASKS": "1"})


@pytest.mark.parametrize("wire", ["bf16", "fp16"])
def test_wire_codec_sums_like_fp32(wire):
    rng = np.random.default_rng(0)
    n = 5000
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-7, 6, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-7, 6, n)).astype(np.float32)
    # the message tail: loss, seqs, frames, errors, ref labels, then the stop flag
    sa = np.array([1.5, 2, 300, 4, 5, 0], np.float32)
    sb = np.array([2.25, 3, 7000, 1, 1, 1], np.float32)
    c = WireCodec(wire, n)
    ma, mb = np.zeros(c.nbytes, np.uint8), np.zeros(c.nbytes, np.uint8)
    c.encode_into(ma, a, sa, 0.0)
    c.encode_into(mb, b, sb, 0.0)
    c.combine(ma, mb)                    # mb <- a + b
    g, stats, flag = c.decode(mb)
    np.testing.assert_array_equal(stats, sa + sb)    # counts and stop flags exact in fp32
    assert flag == 0
    ref = a.astype(np.float64) + b
    # relative error of each value: at most a few 16-bit roundings (bf16 8 bits, fp16 11
    # bits of mantissa, and fp16's scaling keeps values ~1e-7 to 1e5 apart representable)
    tol = {"bf16": 3 * 2.0 ** -8, "fp16": 3 * 2.0 ** -11}[wire]
    # each operand and the sum are rounded once: error <= tol x (|a| + |b|)
    mag = np.abs(a).astype(np.float64) + np.abs(b)
    big = mag > mag.max() * 1e-4   # below this fp16's subnormals take over
    assert np.all(np.abs(g[big] - ref[big]) <= tol * mag[big])
    assert np.isfinite(g).all()


@pytest.mark.parametrize("wire", ["bf16", "fp16"])
def test_wire_combine_is_commutative_and_flags_nonfinite(wire):
    rng = np.random.default_rng(1)
    n = 1000
    c = WireCodec(wire, n)
    x, y = (rng.standard_normal(n).astype(np.float32) * 1e3 for _ in range(2))
    st = np.ones(6, np.float32)  # stats and stop flag
    mx, my = np.zeros(c.nbytes, np.uint8), np.zeros(c.nbytes, np.uint8)
    c.encode_into(mx, x, st, 0.0)
    c.encode_into(my, y, st, 1.0)        # y's rank had an Inf/NaN
    xy, yx = my.copy(), mx.copy()
    c.combine(mx, xy)
    c.combine(my, yx)
    np.testing.assert_array_equal(xy, yx)  # every rank ends with the same bytes
    assert c.decode(xy)[2] == 1.0
    # fp16 without scaling would overflow here (sum 2e5 > 65504)
    big = np.full(n, 1e5, np.float32)
    c.encode_into(mx, big, st, 0.0)
    c.encode_into(my, big, st, 0.0)
    c.combine(mx, my)
    np.testing.assert_allclose(c.decode(my)[0], 2e5, rtol=1e-2)


# ---- real MPI jobs

@needs_mpi
@pytest.mark.mpi
def test_n_ranks_train_like_one_rank_in_both_modes(tiny_config, tmp_path):
    """After one epoch (10 steps, Adam), 2 and 3 ranks with global batch B hold the same
    weights as 1 rank with batch B cut as N ranks cut it (batch.batch_multiple = N), in
    allreduce and master mode; 16-bit wires stay close."""
    out = tmp_path
    r, _ = launch(1, "tests/mpi_train.py", out, tiny_config, "serial=batch.batch_multiple=2",
                  "serial3=batch.batch_multiple=3")
    assert r.returncode == 0, r.stderr[-3000:]
    runs2 = ["ar2=dist.mode=allreduce", "ms2=dist.mode=master", "bf2=dist.wire=bf16",
             "fp16m2=dist.mode=master,dist.wire=fp16"]
    r, _ = launch(2, "tests/mpi_train.py", out, tiny_config, *runs2)
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = launch(3, "tests/mpi_train.py", out, tiny_config, "ar3=dist.mode=allreduce",
                  "ms3=dist.mode=master", "bf3=dist.wire=bf16")
    assert r.returncode == 0, r.stderr[-3000:]
    w = {n: dict(np.load(out / f"{n}.npz")) for n in
         ("serial", "serial3", "ar2", "ms2", "bf2", "fp16m2", "ar3", "ms3", "bf3")}
    one = {n: w["serial3" if n.endswith("3") else "serial"] for n in w}
    for name in ("ar2", "ms2", "ar3", "ms3"):
        assert rel_diff(one[name], w[name]) <= 1e-5, name
    assert rel_diff(w["ar2"], w["ms2"]) <= 1e-5
    assert rel_diff(w["ar3"], w["ms3"]) <= 1e-5
    for name in ("bf2", "fp16m2", "bf3"):  # compressed wire: close, not equal
        assert 0 < rel_diff(one[name], w[name]) <= 5e-3, name
    # start-up: rank 0's weights, optimizer state and loop state reached every rank
    s = [np.load(out / f"sync-rank{r}.npy") for r in range(3)]
    assert len({x[0] for x in s}) == 3                 # they really started different
    for x in s:
        assert x[1] == s[0][0]                         # everyone holds rank 0's weights
        assert x[2] == s[0][2] and x[3] == 10          # and its Adam state and step
        assert x[4] == 1.0                             # a disagreement raised everywhere
    # the straggler gap is reported at each log interval, on rank 0 only, with every
    # rank's step-time split
    lines = (out / "ar3" / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert recs and all(x["straggler_gap_s"] >= 0 and 0 <= x["slowest_rank"] < 3
                        for x in recs)
    assert all(len(x["ranks"]) == 3 and all(set(r) == set(SPLIT_KEYS) for r in x["ranks"])
               for x in recs)
    check_collective_schedule(out)


def check_collective_schedule(out):
    """The collectives each rank issued match docs/scaling.md ("Which collectives run
    when"): per step, allreduce mode one allreduce (stop flag inside), master mode one
    reduce + one weight broadcast; per log step one buffer allgather; the object
    collectives (pickled) at start-up only. No validation set here, so nothing else."""
    for name, mode in (("ar2", "allreduce"), ("ms2", "master"), ("ar3", "allreduce"),
                       ("ms3", "master")):
        ranks = 2 if name.endswith("2") else 3
        steps = torch.load(out / name / "checkpoints" / "last.pt",
                           weights_only=True)["state"]["step"]
        logs = sum(json.loads(x)["split"] == "train" for x in
                   (out / name / "metrics.jsonl").read_text().splitlines())
        assert steps >= 10 and logs >= 3
        for r in range(ranks):
            c = json.loads((out / f"{name}.calls-rank{r}.json").read_text())
            per_step = {"allreduce_": steps, "reduce_": 0, "bcast_": 1} if mode == "allreduce" \
                else {"allreduce_": 0, "reduce_": steps, "bcast_": steps + 1}
            for k, v in {**per_step, "allgather_": logs}.items():  # bcast_ + 1: start-up
                assert c.get(k, 0) == v, (name, r, k, c)
            start_up = sum(c.get(k, 0) for k in ("bcast_obj", "allgather", "check_same",
                                                 "barrier", "roster"))
            # a fixed few, not per step: the config agreement's allgather, the run-folder
            # and resume bcast_obj, the roster, steps per epoch, sync_start's 2 bcast_obj
            # and checksum
            assert start_up <= 7, (name, r, c)


@needs_mpi
@pytest.mark.mpi
def test_evaluation_on_two_ranks_counts_like_one(synth_pair, tmp_path):
    """Validation/eval under MPI: each rank scores its share of every batch on its own
    worker threads; the summed counts equal one process's (the loss to float rounding)."""
    r, _ = launch(1, "tests/mpi_eval.py", tmp_path / "one.json", synth_pair[1])
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = launch(2, "tests/mpi_eval.py", tmp_path / "two.json", synth_pair[1])
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    from rnntrain.decode.score import ErrorCounts
    assert (one["ranks"], two["ranks"]) == (1, 2)
    a, b = ErrorCounts.from_array(one["counts"]), ErrorCounts.from_array(two["counts"])
    assert a.seqs == 28 and a.skipped == 2 and a.sub + a.dels + a.ins > 0
    assert a.loss_sum == pytest.approx(b.loss_sum, rel=1e-5)
    b.loss_sum = a.loss_sum
    assert a == b


@needs_mpi
@pytest.mark.mpi
def test_two_ranks_over_the_network_path(tiny_config, tmp_path):
    """Shared memory off (MPICH: every rank treated as on another node; UCX over TCP),
    as ranks on different machines talk: still the serial run's weights."""
    r, _ = launch(1, "tests/mpi_train.py", tmp_path, tiny_config,
                  "serial=batch.batch_multiple=2")
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = launch(2, "tests/mpi_train.py", tmp_path, tiny_config, "ar=dist.mode=allreduce",
                  "bfm=dist.mode=master,dist.wire=bf16",
                  env={"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"})
    assert r.returncode == 0, r.stderr[-3000:]
    w = {n: dict(np.load(tmp_path / f"{n}.npz")) for n in ("serial", "ar", "bfm")}
    assert rel_diff(w["serial"], w["ar"]) <= 1e-6  # rounding only (test_torchdist's check_n_ranks)
    assert 0 < rel_diff(w["serial"], w["bfm"]) <= 5e-3


def fault(n, tiny_config, tmp_path, rank, kind, step=3, extra=(), mpi_args=()):
    return launch(n, "tests/mpi_fault.py", rank, kind, step, tiny_config,
                  f"run.dir={tmp_path / 'run'}", *extra, mpi_args=mpi_args)


@needs_mpi
@pytest.mark.mpi
def test_rank_that_raises_aborts_the_job_naming_it(tiny_config, tmp_path):
    r, secs = fault(2, tiny_config, tmp_path, 1, "raise")
    assert r.returncode != 0
    assert "[rank 1/2]" in r.stderr and "injected fault at step 3" in r.stderr
    assert secs < 60  # start-up included; a hang would take dist.timeout_s = 120 s
    r, secs = fault(3, tiny_config, tmp_path, 2, "baddata")
    assert r.returncode != 0
    assert re.search(r"\[rank 2/3\] rnntrain train: error: /nonexistent/train.nc", r.stderr)
    assert "Traceback" not in r.stderr


@needs_mpi
@pytest.mark.mpi
def test_stuck_rank_is_named_within_the_timeout(tiny_config, tmp_path):
    """A rank that stops answering (SIGSTOP) at step 3: rank 0 names it after
    dist.timeout_s + a short roll call, and the launcher ends the job."""
    r, secs = fault(3, tiny_config, tmp_path, 1, "stop", extra=["dist.timeout_s=3"])
    assert r.returncode != 0
    assert re.search(r"\[rank 0/3\] error: rank\(s\) 1 of 3 did not arrive at the gradient "
                     r"exchange of step 4 within dist.timeout_s = 3 s", r.stderr), r.stderr[-2000:]
    stamp = (tmp_path / "run" / "train.log").read_text()
    assert "rank 1 = pid" in stamp
    # rank 0 itself stuck: the next rank names it after the deadline and a grace period
    r, secs = fault(3, tiny_config, tmp_path, 0, "stop", extra=["dist.timeout_s=3"])
    assert r.returncode != 0
    assert re.search(r"\[rank 1/3\] error: rank 0 did not arrive at the gradient exchange "
                     r"of step 4 within dist.timeout_s = 3 s", r.stderr), r.stderr[-2000:]


@needs_mpi
@pytest.mark.mpi
def test_killed_rank_ends_the_job_and_is_named(tiny_config, tmp_path):
    """SIGKILL: the launcher ends the job at once and reports the pid, which the
    start-up roster in train.log maps to the rank."""
    r, secs = fault(2, tiny_config, tmp_path, 1, "kill", extra=["dist.timeout_s=5"])
    assert r.returncode != 0
    roster = (tmp_path / "run" / "train.log").read_text()
    pid = re.search(r"rank 1 = pid (\d+)", roster).group(1)
    assert re.search(rf"PID {pid}\b", r.stdout + r.stderr), (r.stdout + r.stderr)[-2000:]
    assert secs < 60


@needs_mpi
@pytest.mark.mpi
def test_unequal_steps_are_an_error_before_step_one(tiny_config, tmp_path, synth_pair):
    from data_tools.synth import write_synth
    small = tmp_path / "small.nc"
    write_synth(str(small), num_seqs=50, num_labels=6, input_size=8, seed=1)
    r, secs = fault(2, tiny_config, tmp_path, 1, f"data={small}")
    assert r.returncode == 2, r.stderr[-2000:]
    m = re.search(r"ranks disagree on steps per epoch: rank 0: (\d+), rank 1: (\d+)", r.stderr)
    assert m and m.group(1) != m.group(2), r.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or \
        not (tmp_path / "run" / "metrics.jsonl").read_text()
