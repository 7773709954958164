"""Exact resume, atomic checkpoints and stop signals, against real training subprocesses.

A run is SIGKILLed at chosen steps (one of them inside a checkpoint write, using the
``RNNTRAIN_TEST_PAUSE`` hook of ``rnntrain.run.faults``), resumed with ``--resume auto`` each
time, and its final weights and optimizer state are compared with an uninterrupted run:
bit-identical in deterministic mode, alone, with two worker threads and with 2 MPI ranks.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, mpiexec

EPOCHS = 2
EVERY = 3             # checkpoint.every_steps


def write_config(tmp: Path, synth_pair, threads: int | None = None, **train) -> Path:
    train_nc, val_nc = synth_pair
    extra = "".join(f"{k} = {v}\n" for k, v in train.items())
    threads_line = f"threads = {threads}\n" if threads is not None else ""
    cfg = tmp / "exp.toml"
    cfg.write_text(f'[data]\ntrain = "{train_nc}"\nval = "{val_nc}"\n'
                   f"[model]\nlayers = 1\nhidden = 16\ndropout = 0.0\n"
                   f"[optim]\nname = \"adam\"\nlr = 0.01\n"
                   "[batch]\nbatch_frames = 600\n[log]\nevery_steps = 1\n"
                   f"[compute]\ndeterministic = true\n{threads_line}"
                   f"[train]\nepochs = {EPOCHS}\ninput_noise = 0.1\n{extra}"
                   f"[checkpoint]\nevery_steps = {EVERY}\nkeep_last = 2\n")
    return cfg


def launch(cmd: list[str], pause: str | None = None, timeout: float = 240, env=None):
    """Run cmd in its own process group. With ``pause``, wait until the run reports that it
    is paused there, SIGKILL the whole group and return (None, stderr); with pause="term",
    send SIGTERM once it is stepping. Otherwise (and then) wait for the exit and return
    (returncode, stderr)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    e.pop("RNNTRAIN_TEST_PAUSE", None)
    if pause and pause != "term":
        e["RNNTRAIN_TEST_PAUSE"] = pause
    p = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    # a hung run fails the test instead of hanging it
    watchdog = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
    watchdog.start()
    err = []
    try:
        for line in p.stderr:
            err.append(line)
            if pause == "term" and "step/s" in line:  # training has started stepping
                p.send_signal(signal.SIGTERM)  # to mpiexec too: it forwards it to the ranks
                pause = None
            elif pause and "rnntrain: paused at" in line:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return None, "".join(err)
        p.wait()
    finally:
        watchdog.cancel()
        p.stderr.close()
    text = "".join(err)
    assert not pause, f"the run ended (rc {p.returncode}) before {pause}:\n{text[-3000:]}"
    return p.returncode, text


def train_cmd(cfg: Path, run_dir: Path, *extra, ranks: int = 1) -> list[str]:
    cmd = [sys.executable, "-m", "rnntrain", "train", str(cfg), f"run.dir={run_dir}", *extra]
    return [mpiexec(), "-n", str(ranks), *cmd] if ranks > 1 else cmd


def assert_same_final(a: Path, b: Path):
    ca = torch.load(a / "checkpoints" / "last.pt", weights_only=True)
    cb = torch.load(b / "checkpoints" / "last.pt", weights_only=True)
    assert ca["state"] == cb["state"]
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), f"weights {k} differ"
    sa, sb = ca["optim"]["state"], cb["optim"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for k in sa[i]:
            assert torch.equal(sa[i][k], sb[i][k]), f"optimizer state {i}.{k} differs"


def steps_per_epoch(log: str) -> int:
    """The plan's step count, as the trainer reports it at start-up."""
    m = re.search(r"(\d+) steps/epoch", log)
    assert m, log[-3000:]
    return int(m.group(1))


def kill_points(seed: int, steps_per_epoch: int, n: int = 3) -> list[str]:
    """The last n of: after a step, inside a checkpoint write, after a step of epoch 2."""
    assert steps_per_epoch >= 8, "the kill points need a few checkpoints per epoch"
    r = random.Random(seed)
    total = steps_per_epoch * EPOCHS
    a = r.randint(EVERY + 1, 2 * EVERY + 1)
    b = EVERY * r.randint(a // EVERY + 1, (total - 6) // EVERY)
    c = r.randint(max(b + 2, steps_per_epoch + 1), total - 1)
    return [f"step:{a}", f"ckpt:{b}", f"step:{c}"][3 - n:]


def killed_and_resumed(tmp: Path, cfg: Path, points: list[str], ranks: int = 1) -> Path:
    run = tmp / "killed"
    for k, point in enumerate(points):
        rc, err = launch(train_cmd(cfg, run, *(["--resume", "auto"] if k else []), ranks=ranks),
                         pause=point)
        if point == "term":  # stopped cleanly (or, if the signal came at the very end, done)
            assert rc == 0, err[-3000:]
            assert "stopped by SIGTERM" in err or f"epoch {EPOCHS} val" in err, err[-3000:]
        if point.startswith("ckpt:"):
            # killed inside the write: the temp file exists, the checkpoint does not
            n = int(point[5:])
            assert list((run / "checkpoints").glob(f".step-{n:08d}.pt.tmp*")), point
            assert not (run / "checkpoints" / f"step-{n:08d}.pt").exists()
    rc, err = launch(train_cmd(cfg, run, "--resume", "auto", ranks=ranks))
    assert rc == 0, err[-3000:]
    assert "resumed from" in err
    assert not list((run / "checkpoints").glob(".*tmp*")), "stale temp file left behind"
    return run


def check_kill_resume(tmp_path, synth_pair, seed: int, ranks: int = 1, term=False, kills=3,
                      **train):
    cfg = write_config(tmp_path, synth_pair, **train)
    rc, err = launch(train_cmd(cfg, tmp_path / "straight", ranks=ranks))
    assert rc == 0, err[-3000:]
    points = kill_points(seed, steps_per_epoch(err), kills) + (["term"] if term else [])
    run = killed_and_resumed(tmp_path, cfg, points, ranks)
    assert_same_final(tmp_path / "straight", run)


def test_sigkill_resume_bit_identical(tmp_path, synth_pair):
    check_kill_resume(tmp_path, synth_pair, seed=1, threads=1)


def test_sigkill_resume_bit_identical_threads(tmp_path, synth_pair):
    check_kill_resume(tmp_path, synth_pair, seed=2, kills=2, threads=2)


@pytest.mark.mpi
@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not available")
def test_sigkill_resume_bit_identical_mpi(tmp_path, synth_pair):
    """2 ranks: SIGKILL of the whole job at two points (one inside a checkpoint write),
    then SIGTERM to mpiexec (which forwards it: every rank must stop after the same step),
    resumed each time."""
    check_kill_resume(tmp_path, synth_pair, seed=3, ranks=2, term=True, kills=2, threads=1)


def test_sigterm_and_sigint_stop_with_checkpoint(tmp_path, synth_pair):
    """SIGTERM/SIGINT: the current step finishes, a checkpoint of that step is written,
    exit 0 with a resume hint; the resumed run completes (exactness of resume from a step
    checkpoint is checked by the kill tests above)."""
    cfg = write_config(tmp_path, synth_pair, threads=1)
    run = tmp_path / "stopped"
    for k, sig in enumerate((signal.SIGTERM, signal.SIGINT)):
        e = dict(os.environ, PYTHONPATH=str(ROOT), RNNTRAIN_TEST_PAUSE="")
        p = subprocess.Popen(train_cmd(cfg, run, *(["--resume"] if k else [])), cwd=ROOT,
                             env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = []
        for line in p.stderr:  # signal once training has started stepping
            lines.append(line)
            if "epoch" in line and "step/s" in line:
                p.send_signal(sig)
                break
        rest = p.communicate(timeout=120)[1]
        err = "".join(lines) + rest
        assert p.returncode == 0, err[-3000:]
        assert f"stopped by {sig.name}" in err and "--resume" in err, err[-2000:]
        step = int(err.split(f"stopped by {sig.name} after step ")[1].split(";")[0])
        ck = torch.load(run / "checkpoints" / f"step-{step:08d}.pt", weights_only=True)
        assert ck["state"]["step"] == step
    rc, err = launch(train_cmd(cfg, run, "--resume"))
    assert rc == 0, err[-3000:]
    assert f"resumed from {run / 'checkpoints' / f'step-{step:08d}.pt'}" in err
    final = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["state"]
    assert (final["epoch"], final["step"]) == (EPOCHS, EPOCHS * steps_per_epoch(err))
