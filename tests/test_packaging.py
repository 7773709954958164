"""The package outside the repository: a wheel built from this tree, installed into a fresh
virtual environment, used from a temporary folder (init, synth, train, report), and the
checks that keep the wheel complete as the tree changes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli


def test_every_package_folder_is_in_the_wheel_list():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(meta["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("rnntrain/**/__init__.py")}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {found - listed}"
    assert meta["package-dir"] == {"rnntrain_data": "data_tools"}
    # the examples shipped as package data are the repository's configs/, not copies
    shipped = sorted(p.name for p in (ROOT / "rnntrain" / "configs").glob("*.toml"))
    assert shipped == sorted(p.name for p in (ROOT / "configs").glob("*.toml")) != []
    assert (ROOT / "rnntrain" / "configs").resolve() == (ROOT / "configs").resolve()


def test_init_writes_an_example_and_keeps_existing_files(tmp_path):
    r = run_cli("rnntrain", "init", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "default.toml").read_text() == (ROOT / "configs/default.toml").read_text()
    assert "rnntrain-data synth data/synth_train.nc" in r.stdout
    r = run_cli("rnntrain", "init", cwd=tmp_path)
    assert r.returncode == 2 and "default.toml exists; pass --force" in r.stderr
    r = run_cli("rnntrain", "init", "yesno", "--out", tmp_path / "y.toml", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "y.toml").read_text().startswith("# YesNo")
    r = run_cli("rnntrain", "init", "nope", cwd=tmp_path)
    names = ", ".join(sorted(p.stem for p in (ROOT / "configs").glob("*.toml")))
    assert r.returncode == 2 and f"examples: {names}" in r.stderr, r.stderr


def _run(cmd, cwd, env, timeout=600):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RNNTRAIN_TEST_WHEEL"),
                    reason="a CI step (.ci/run): RNNTRAIN_TEST_WHEEL=1 builds the wheel and "
                           "installs it with torch into a new venv (minutes)")
def test_wheel_in_a_fresh_venv_from_another_folder(tmp_path):
    """Build the wheel (no build isolation: offline), install it with its dependencies into
    a new venv (pip's configured index; constraints.txt pins the CPU torch), then work
    in a folder that is not the repository, with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # build from a copy: setuptools leaves build/ and *.egg-info next to the sources, and a
    # stale build/lib would put deleted modules into the next wheel
    top = {".git", ".venv", "build", "dist", "runs", "data", "sweeps", ".pytest_cache"}
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=lambda d, names: [
        n for n in names if (Path(d) == ROOT and n in top) or n == "__pycache__"
        or n.endswith(".egg-info")])
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(tmp_path / "dist"), str(src)], tmp_path, env)
    wheel = next((tmp_path / "dist").glob("rnntrain-*.whl"))
    _run([sys.executable, "-m", "venv", str(tmp_path / "venv")], tmp_path, env)
    bin_ = tmp_path / "venv" / "bin"
    _run([str(bin_ / "python"), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"),
          f"{wheel}"], tmp_path, env, timeout=900)
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    work = tmp_path / "work"
    work.mkdir()
    r = _run(["rnntrain", "--version"], work, env)
    assert r.stdout.strip() == f"rnntrain {wheel.name.split('-')[1]}"
    # the installed modules, not the repository's; the data tools under their own name
    r = _run([str(bin_ / "python"), "-c", "import rnntrain, rnntrain_data, importlib.util; "
              "print(rnntrain.__file__); print(importlib.util.find_spec('data_tools'))"],
             work, env)
    where, data_tools = r.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "venv") and data_tools == "None"
    _run(["rnntrain", "init"], work, env)
    for name, n, seed in (("synth_train", 80, 1), ("synth_val", 20, 2)):
        _run(["rnntrain-data", "synth", f"data/{name}.nc", "--seqs", str(n), "--seed",
              str(seed), "--labels", "5", "--inputs", "6"], work, env)
    small = ["model.layers=1", "model.hidden=8", "train.epochs=1", "train.threads=1"]
    _run(["rnntrain", "train", "default.toml", *small], work, env)
    assert (work / "runs/default/checkpoints/last.pt").is_file()
    # only overrides: the built-in defaults
    _run(["rnntrain", "train", "data.train=data/synth_val.nc", "run.dir=runs/bare", *small],
         work, env)
    assert (work / "runs/bare/checkpoints/last.pt").is_file()
    _run(["rnntrain", "report", "runs/default"], work, env)
    assert (work / "runs/default/report/report.md").is_file()
    _run(["rnntrain-data", "inspect", "data/synth_val.nc"], work, env)


def test_data_tools_never_import_their_repository_name():
    """Installed, the data tools are the package rnntrain_data: an absolute import of
    ``data_tools`` works in the repository and crashes for every pip user (it did:
    ``rnntrain-data images`` imported data_tools.audio). Relative imports only."""
    import ast
    bad = []
    for f in sorted((ROOT / "data_tools").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            bad += [f"{f.name}:{node.lineno} {n}" for n in names if n.split(".")[0] == "data_tools"]
    assert not bad, f"import the data tools relatively (installed they are rnntrain_data): {bad}"
