"""Shared fixtures: small real NetCDF files written with our writer (no mocks)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def synth_pair(tmp_path_factory):
    """A small synthetic train/val pair (paths)."""
    from data_tools.synth import write_synth
    d = tmp_path_factory.mktemp("synth")
    write_synth(str(d / "train.nc"), num_seqs=120, num_labels=6, input_size=8, seed=1)
    write_synth(str(d / "val.nc"), num_seqs=30, num_labels=6, input_size=8, seed=2)
    return d / "train.nc", d / "val.nc"


def train_here(config_path, *overrides):
    """Train in this process (``rnntrain.run.train.train``, as the CLI calls it; config_path
    None: the overrides alone) → the run
    folder. For runs that only set up a test (checkpoints to corrupt, resume or evaluate):
    a subprocess would add the torch import and nothing the test checks."""
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    over = [str(o) for o in overrides]
    path = None if config_path is None else str(config_path)
    return train(load_config(path, over), path, over)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished tiny run on 3-feature, 3-label data (tests/badinput.py's good file), read
    by the bad-input and edge cases: (data file, config, run folder). Tests that change it
    copy it first."""
    from tests.badinput import good_parts, write_nc
    from tests.test_bad_input import config
    d = tmp_path_factory.mktemp("tiny")
    data = write_nc(d / "good.nc", good_parts())
    cfg = config(d, data)
    return data, cfg, train_here(cfg, f"run.dir={d / 'run'}")


def run_cli(*args, cwd=None, timeout=300, env=None):
    """Run ``python -m <module> args`` as a user would; returns CompletedProcess."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=e)


def run_cli_batch(cases, timeout=300, env=None):
    """Run several ``(module, *args)`` command lines in ONE fresh process (tests/cli_batch.py)
    → a CompletedProcess per case, as ``run_cli`` would give it. For cases that end before
    training (bad input, refused options): each would otherwise pay the torch import. A
    case that leaves a non-daemon thread running fails here: a process would not exit."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "cases.json", Path(d) / "out.json"
        src.write_text(json.dumps([[str(a) for a in c] for c in cases]))
        e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
        p = subprocess.run([sys.executable, str(ROOT / "tests" / "cli_batch.py"), str(src),
                            str(dst)], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout, env=e)
        assert p.returncode == 0 and dst.exists(), p.stderr[-3000:]
        results = json.loads(dst.read_text())
    out = []
    for case, r in zip(cases, results):
        assert not r["threads_left"], (case, r["threads_left"])
        out.append(subprocess.CompletedProcess([sys.executable, "-m", *map(str, case)],
                                               r["returncode"], r["stdout"], r["stderr"]))
    return out


def mpiexec():
    """Path of mpiexec next to this Python (pip's mpich) or on PATH; None if absent."""
    cand = Path(sys.executable).with_name("mpiexec")
    return str(cand) if cand.exists() else shutil.which("mpiexec")
