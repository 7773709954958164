"""Shared fixtures: small real NetCDF files written with our writer (no mocks)."""
from __future__ import annotations

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


def run_cli(*args, cwd=None, timeout=300, env=None):
    """Run ``python -m <module> args`` as a user would; returns CompletedProcess."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=e)


def mpiexec():
    """Path of mpiexec next to this Python (pip's mpich) or on PATH; None if absent."""
    cand = Path(sys.executable).with_name("mpiexec")
    return str(cand) if cand.exists() else shutil.which("mpiexec")
