"""The torch.distributed engine: launcher detection, N ranks train like one under
torchrun with gloo (both modes, every wire), failures end the job naming the rank, misuse
is one clean error, the overlapped bucketed exchange, resume across engines.

Multi-rank tests launch real ``torchrun --standalone --nproc_per_node N`` jobs (no mocks)
of the same helpers as the MPI tests (tests/mpi_train.py, tests/mpi_fault.py).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from rnntrain.errors import UserError
from rnntrain.parallel.launch import choose, world_from_env

from tests.conftest import ROOT, mpiexec
from tests.test_mpi import TINY, rel_diff

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@pytest.fixture(scope="module")
def tiny_config(synth_pair, tmp_path_factory):
    p = tmp_path_factory.mktemp("torchdist") / "tiny.toml"
    p.write_text(TINY.format(train=synth_pair[0]))
    return p


def launch(n, *args, timeout=180, env=None):
    """``python ARGS`` under torchrun with n processes (n = 0: plain python); ARGS may
    start with "-m". → (CompletedProcess, seconds)."""
    cmd = [*TORCHRUN, "--nproc_per_node", str(n)] if n else [sys.executable]
    cmd += list(map(str, args))
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=e)
    return r, time.monotonic() - t0


# ---- no processes: which engine an environment asks for

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
MPICH_ENV = {"PMI_RANK": "0", "PMI_SIZE": "2"}
SRUN_ENV = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"}


def test_auto_recognises_the_launcher():
    assert choose("auto", {}) == "local"
    assert choose("auto", TORCHRUN_ENV) == "torch"
    assert choose("auto", MPICH_ENV) == "mpi"
    assert choose("auto", {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}) == "mpi"
    assert choose("auto", SRUN_ENV) == "mpi"
    # srun starts one torchrun per node; its workers carry both: torchrun's is the truth
    assert choose("auto", {**SRUN_ENV, **TORCHRUN_ENV}) == "torch"
    assert world_from_env({**SRUN_ENV, **TORCHRUN_ENV}) == ("torchrun", 2)
    # one process of either kind: nothing to join
    assert choose("auto", {**TORCHRUN_ENV, "WORLD_SIZE": "1"}) == "local"
    assert choose("torch", {}) == "local" and choose("mpi", {}) == "local"
    assert choose("torch", TORCHRUN_ENV) == "torch" and choose("mpi", MPICH_ENV) == "mpi"


@pytest.mark.parametrize("backend, env, words", [
    ("mpi", TORCHRUN_ENV, "MPI cannot join a torchrun job"),
    ("torch", MPICH_ENV, "PMI_SIZE=2"),
    ("auto", {"RANK": "0", "WORLD_SIZE": "3"}, "MASTER_ADDR, MASTER_PORT is not set"),
    ("auto", {**TORCHRUN_ENV, "WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a number"),
])
def test_n_processes_without_a_usable_engine_is_an_error(backend, env, words):
    with pytest.raises(UserError, match=re.escape(words)):
        choose(backend, env)


# ---- real torchrun jobs

@pytest.mark.torchrun
def test_misuse_is_one_clean_error_not_n_trainings(tiny_config, tmp_path):
    """torchrun with 2 processes and dist.backend = "mpi": before this engine existed,
    two independent trainings wrote one run folder and exited 0."""
    run = tmp_path / "run"
    r, _ = launch(2, "-m", "rnntrain", "train", tiny_config, f"run.dir={run}",
                  "dist.backend=mpi")
    assert r.returncode != 0
    # one line for the job: the other process exits quietly with the same status
    assert r.stderr.count("rnntrain train: error: dist.backend = \"mpi\" but torchrun "
                          "started this process as one of 2") == 1, r.stderr[-2000:]
    assert f'File "{ROOT / "rnntrain"}' not in r.stderr  # (torchrun prints its own)
    assert not (run / "metrics.jsonl").exists()
    # the same environment without torchrun's rendezvous variables: no hang, one line
    r, secs = launch(0, "-m", "rnntrain", "train", tiny_config, f"run.dir={run}",
                     env={"WORLD_SIZE": "2", "RANK": "0"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "rnntrain train: error: WORLD_SIZE=2 says this is one of 2 processes, but "
        "MASTER_ADDR, MASTER_PORT is not set: start with torchrun (python -m "
        "torch.distributed.run), which sets them"]


@pytest.fixture(scope="module")
def serial_weights(tiny_config, tmp_path_factory):
    """One rank's weights with the global batches of n ranks (batch.batch_multiple = n),
    by n."""
    out = tmp_path_factory.mktemp("serial")
    r, _ = launch(0, "tests/mpi_train.py", out, tiny_config, "serial2=batch.batch_multiple=2",
                  "serial3=batch.batch_multiple=3")
    assert r.returncode == 0, r.stderr[-3000:]
    return {n: dict(np.load(out / f"serial{n}.npz")) for n in (2, 3)}


def check_n_ranks(n, out, tiny_config, serial, runs, env=None):
    serial = serial[n]
    r, _ = launch(n, "tests/mpi_train.py", out, tiny_config,
                  *(f"{name}={ov}" for name, ov in runs.items()), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    w = {name: dict(np.load(out / f"{name}.npz")) for name in runs}
    for name, ov in runs.items():
        d = rel_diff(serial, w[name])
        if "wire" not in ov or "fp32" in ov:
            # the same batches summed in another order (n partial sums, and each
            # process's BLAS blocks its sums by its own thread count and CPU): rounding
            # only, a few fp32 epsilons after the run's Adam steps (2.1e-7 on an Intel
            # Xeon, under 1e-7 on an AMD EPYC). Batches cut differently (batch_multiple 2
            # against 3 or 1) differ by 1.3e-2 to 2.6e-2: four orders of magnitude more.
            assert d <= 1e-6, (name, d)
        else:  # a 16-bit wire: close to the serial run, and master == allreduce exactly
            assert 0 < d <= 5e-3, (name, d)
    # start-up: rank 0's weights, Adam state and loop state reached every rank
    s = [np.load(out / f"sync-rank{k}.npy") for k in range(n)]
    assert len({x[0] for x in s}) == n
    assert all(x[1] == s[0][0] and x[2] == s[0][2] and x[3] == 10 and x[4] == 1.0 for x in s)
    return w


@pytest.mark.torchrun
def test_two_ranks_train_like_one_every_mode_and_wire(tiny_config, serial_weights, tmp_path):
    runs = {f"{m}{w}": f"dist.mode={m},dist.wire={w}"
            for m in ("allreduce", "master") for w in ("fp32", "bf16", "fp16")}
    # gloo bound to the loopback interface by name, as ranks on different machines talk
    # (gloo has no shared-memory path on the CPU: always TCP)
    w = check_n_ranks(2, tmp_path, tiny_config, serial_weights, runs,
                      env={"GLOO_SOCKET_IFNAME": "lo"})
    for wire in ("fp32", "bf16", "fp16"):  # same combined bytes in both modes
        assert rel_diff(w[f"allreduce{wire}"], w[f"master{wire}"]) == 0, wire
    recs = [json.loads(x) for x in (tmp_path / "allreducefp32" / "metrics.jsonl")
            .read_text().splitlines()]
    assert recs and all(x["straggler_gap_s"] >= 0 and x["slowest_rank"] in (0, 1)
                        and len(x["ranks"]) == 2 for x in recs)
    log = (tmp_path / "allreducefp32" / "train.log").read_text()
    assert "2 torch.distributed ranks (gloo): rank 0 = pid" in log


@pytest.mark.torchrun
# slow (left out of the default run): by default, the 2-rank case above, every mode and wire
@pytest.mark.slow
def test_three_ranks_train_like_one(tiny_config, serial_weights, tmp_path):
    runs = {"ar3": "dist.mode=allreduce", "ms3": "dist.mode=master",
            "bf3": "dist.wire=bf16", "fp16m3": "dist.mode=master,dist.wire=fp16"}
    check_n_ranks(3, tmp_path, tiny_config, serial_weights, runs,
                  env={"GLOO_SOCKET_IFNAME": "lo"})


def fault(n, tiny_config, tmp_path, rank, kind, step=3, extra=()):
    return launch(n, "tests/mpi_fault.py", rank, kind, step, tiny_config,
                  f"run.dir={tmp_path / 'run'}", *extra)


@pytest.mark.torchrun
def test_rank_that_raises_or_dies_ends_the_job_naming_it(tiny_config, tmp_path):
    r, secs = fault(2, tiny_config, tmp_path, 1, "raise")
    assert r.returncode != 0
    assert re.search(r"\[rank 1/2\] rnntrain train: internal error: .*RuntimeError: "
                     r"injected fault at step 3", r.stderr), r.stderr[-3000:]
    assert secs < 90  # start-up included; a hang would take dist.timeout_s = 120 s
    r, secs = fault(2, tiny_config, tmp_path, 1, "kill", extra=["dist.timeout_s=30"])
    assert r.returncode != 0
    assert re.search(r"\[rank 0/2\] error: rank\(s\) 1 of 2 left the job during the gradient "
                     r"exchange of step 4 \(process died or raised", r.stderr), r.stderr[-3000:]
    assert secs < 90  # well before dist.timeout_s of the exchange after start-up


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux's /proc")
def test_process_watch_tells_a_live_process_from_an_exited_one():
    """The watch a waiting rank keeps on its node's peers (``_started``): a live process
    has a start time, the same on every look; a zombie (exited, not yet reaped by its
    parent, as a dead rank is until torchrun notices) and a reaped one have none."""
    from rnntrain.parallel.torchdist import _started
    assert isinstance(_started(os.getpid()), int)
    p = subprocess.Popen(["sleep", "30"])
    try:
        first = _started(p.pid)
        assert isinstance(first, int) and _started(p.pid) == first
        assert first >= _started(os.getpid())  # started after this process
        os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _started(p.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _started(p.pid) is None  # a zombie: exited, not reaped
        assert os.path.exists(f"/proc/{p.pid}")
    finally:
        p.kill()
        p.wait()
    assert _started(p.pid) is None  # reaped


@pytest.mark.torchrun
def test_rank_dying_while_a_child_holds_its_sockets_is_named_at_once(tiny_config, tmp_path):
    """Rank 1 forks a child that keeps its connections open, then dies: gloo sees no
    close, so only rank 0's watch on its process (the same host) names it, long before
    dist.timeout_s (and before torchrun's SIGKILL of rank 0, 30 s after rank 1 died)."""
    pid_file = tmp_path / "held.pid"
    r, secs = launch(2, "tests/mpi_fault.py", 1, "kill-keep-sockets", 3, tiny_config,
                     f"run.dir={tmp_path / 'run'}", "dist.timeout_s=120",
                     env={"FAULT_PID_FILE": str(pid_file)})
    try:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    except (OSError, ValueError):
        pass
    assert r.returncode != 0
    assert re.search(r"\[rank 0/2\] error: rank\(s\) 1 of 2 left the job during the gradient "
                     r"exchange of step 4 \(process died or raised; rank 1's process \d+ has "
                     r"exited\)", r.stderr), r.stderr[-3000:]
    assert secs < 60  # start-up included: named at once, not at dist.timeout_s = 120 s


@pytest.mark.torchrun
# slow (left out of the default run): by default, test_misuse_is_one_clean_error_not_n_trainings
@pytest.mark.slow
def test_user_error_on_one_rank_is_one_line(tiny_config, tmp_path):
    r, secs = fault(2, tiny_config, tmp_path, 1, "baddata")
    assert r.returncode != 0
    assert re.search(r"\[rank 1/2\] rnntrain train: error: /nonexistent/train.nc", r.stderr)
    assert f'File "{ROOT / "rnntrain"}' not in r.stderr


def check_stuck(n, stuck, reporter, tiny_config, tmp_path):
    r, secs = fault(n, tiny_config, tmp_path, stuck, "stop", extra=["dist.timeout_s=3"])
    assert r.returncode != 0
    assert re.search(rf"\[rank {reporter}/{n}\] error: rank\(s\) {stuck} of {n} did not "
                     r"arrive at the gradient exchange of step 4 within dist.timeout_s = 3 s",
                     r.stderr), r.stderr[-3000:]
    assert secs < 90  # torchrun's own teardown of a stopped process takes 30 s more


@pytest.mark.torchrun
def test_stuck_rank_is_named_within_the_timeout(tiny_config, tmp_path):
    """SIGSTOP at step 3: after dist.timeout_s and a roll call through the rendezvous
    store, the lowest live rank names it and the job ends."""
    check_stuck(2, 1, 0, tiny_config, tmp_path)


@pytest.mark.torchrun
# slow (left out of the default run): by default, test_stuck_rank_is_named_within_the_timeout
@pytest.mark.slow
def test_stuck_rank_zero_is_named_by_the_next(tiny_config, tmp_path):
    """Rank 0 stuck among 3: the store lives in torchrun's agent, so rank 1 calls the roll
    and names rank 0; rank 2, merely waiting behind it, is not blamed."""
    check_stuck(3, 0, 1, tiny_config, tmp_path)


@pytest.mark.torchrun
def test_sigterm_to_torchrun_stops_every_rank_after_one_step(tiny_config, tmp_path):
    """torchrun forwards SIGTERM to its workers (Slurm preemption, scancel): the ranks agree
    on the step (the stop flag rides a collective), rank 0 checkpoints it, the run is
    marked stopped. (torchrun itself then exits non-zero: it was signalled.)"""
    run = tmp_path / "run"
    cmd = [*TORCHRUN, "--nproc_per_node", "2", "-m", "rnntrain", "train", str(tiny_config),
           f"run.dir={run}", "train.epochs=50"]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    for line in p.stderr:
        if "step/s" in line:  # stepping
            p.send_signal(signal.SIGTERM)
            break
    p.communicate(timeout=120)
    log = (run / "train.log").read_text()
    m = re.search(r"stopped by SIGTERM after step (\d+); checkpoint saved", log)
    assert m, log[-2000:]
    assert (run / "checkpoints" / f"step-{int(m.group(1)):08d}.pt").exists()
    assert json.loads((run / "status.json").read_text())["status"] == "stopped"


@pytest.mark.torchrun
def test_overlapped_bucket_exchange_on_gloo(tmp_path):
    r, _ = launch(2, "tests/torch_buckets.py", tmp_path, "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    check_buckets(json.loads((tmp_path / "buckets.json").read_text()))


def check_buckets(res: dict):
    assert res["err"] <= 1e-6                       # every rank holds the summed gradient
    assert len(res["buckets"]) >= 3
    assert res["launched"] == list(range(len(res["buckets"])))  # in bucket order
    assert res["buckets"][0][1] == res["numel"]      # bucket 0 holds the LAST parameters
    starts = [s for s, _ in res["buckets"]]
    assert starts == sorted(starts, reverse=True) and starts[-1] == 0
    assert res["during_backward"] >= 1               # started while backward still ran


@pytest.mark.cuda
@pytest.mark.torchrun
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_overlapped_bucket_exchange_on_nccl(tmp_path):
    """One process per GPU (up to 2): the buckets travel over NCCL on its stream."""
    n = min(2, torch.cuda.device_count())
    r, _ = launch(n, "tests/torch_buckets.py", tmp_path, "cuda")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "buckets.json").read_text())
    assert res["size"] == n
    check_buckets(res)


@pytest.mark.torchrun
@pytest.mark.mpi
@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found")
def test_resume_across_engines(tiny_config, tmp_path):
    """Epoch 1 under one engine, epoch 2 resumed under the other: the same final weights
    and optimizer state as 2 epochs in one go (2 ranks each time)."""
    def train(engine, run, epochs, *extra):
        args = ["-m", "rnntrain", "train", tiny_config, f"run.dir={run}",
                f"train.epochs={epochs}", *extra]
        if engine == "torch":
            r, _ = launch(2, *args)
        else:
            r = subprocess.run([mpiexec(), "-n", "2", sys.executable, *map(str, args)],
                               cwd=ROOT, capture_output=True, text=True, timeout=180,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert r.returncode == 0, r.stderr[-3000:]
        return r
    train("torch", tmp_path / "straight", 2)
    for first, second in (("mpi", "torch"), ("torch", "mpi")):
        run = tmp_path / f"{first}-{second}"
        train(first, run, 1)
        r = train(second, run, 2, "--resume")
        assert "resumed from" in r.stderr
        a = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=True)
        b = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
        assert a["state"] == b["state"]
        for k, v in a["model"].items():
            assert torch.equal(v, b["model"][k]), (first, second, k)
        for i, s in a["optim"]["state"].items():
            for k, v in s.items():
                assert torch.equal(v, b["optim"]["state"][i][k]), (first, second, i, k)

