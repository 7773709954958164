"""The package outside the repository: a wheel built from this tree, installed into a fresh
virtual environment, every subcommand used from an empty folder, and the checks that keep
the wheel (and that test) complete as the tree changes."""
from __future__ import annotations

import os
import re
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
    # the printed data commands work as written in this (empty but for the config) folder
    hints = [ln.strip() for ln in r.stdout.split("its data:\n")[1].split("then:")[0].splitlines()]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for h in hints:
        h = h.replace("--seqs 3000", "--seqs 30")  # the same command, a smaller file
        done = subprocess.run(h, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (h, done.stderr)
    assert (tmp_path / "data/synth_train.nc").is_file() and (tmp_path / "data/synth_val.nc").is_file()
    r = run_cli("rnntrain", "init", cwd=tmp_path)
    assert r.returncode == 2 and "default.toml exists; pass --force" in r.stderr
    r = run_cli("rnntrain", "init", "yesno", "--out", tmp_path / "y.toml", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "y.toml").read_text().startswith("# YesNo")
    r = run_cli("rnntrain", "init", "nope", cwd=tmp_path)
    names = ", ".join(sorted(p.stem for p in (ROOT / "configs").glob("*.toml")))
    assert r.returncode == 2 and f"examples: {names}" in r.stderr, r.stderr


def test_run_train_sh_from_a_fresh_checkout(tmp_path):
    """README's first command, ``./run_train.sh``, in a copy of the repository's layout with
    no data/ folder (a fresh clone has none), using this test's virtual environment."""
    venv = Path(sys.prefix)
    # scripts/env.sh installs unless this stamp (its own formula) is there; an install from
    # the copy would repoint this very environment at a temporary folder, so never let it
    cksum = subprocess.run("cat pyproject.toml constraints.txt | cksum", shell=True, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()[0]
    if not (venv / f".rnntrain-installed-{cksum}-dev,mpi").is_file():
        pytest.skip("this virtual environment is not scripts/env.sh's, up to date (it would "
                    "reinstall): run ./run_tests.sh")
    shutil.copy2(ROOT / "run_train.sh", tmp_path / "run_train.sh")
    for name in ("scripts", "configs", "data_tools", "rnntrain", "pyproject.toml",
                 "constraints.txt"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(venv)
    env = {k: v for k, v in os.environ.items() if k not in ("VENV", "EXTRAS", "PYTHONPATH")}
    done = subprocess.run(["./run_train.sh", "train.epochs=1", "run.dir=runs/fresh",
                           "compute.threads=1"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "data/synth_train.nc").is_file()
    assert (tmp_path / "runs/fresh/checkpoints/last.pt").is_file()


def test_init_writes_a_recipe_with_what_it_runs(tmp_path):
    """``rnntrain init --recipe``: the script, the recipes it calls and the configs they
    train with, in the repository's layout, byte for byte; run from there, the script uses
    the installed data tools (``rnntrain_data``). The wheel test runs one installed."""
    import re as re_
    # the recipes ship as package data through the link, as the configs do
    assert (ROOT / "rnntrain" / "recipes").resolve() == (ROOT / "recipes").resolve()
    # every file a recipe names is shipped (init copies by these names)
    for f in (ROOT / "recipes").glob("*.sh"):
        for rel in re_.findall(r"\b(recipes/[\w.-]+\.(?:sh|py)|configs/[\w.-]+\.toml)\b",
                               f.read_text()):
            assert (ROOT / rel).is_file(), f"{f.name} names {rel}, which is not shipped"
    # --list: every example and recipe with its whole first sentence (not cut mid-way)
    flat = " ".join(run_cli("rnntrain", "init", "--list").stdout.split())
    assert ("yesno YesNo: recordings → seeded 40/5/15 train/val/test lists → log-mel NetCDF → "
            "trained BLSTM-CTC → word errors on the 15 held-out recordings (best path and "
            "beam search) yesno_lm") in flat
    assert "default The embedded default: a synthetic CTC task (run_train.sh generates the " \
           "data) fsdd_digits" in flat
    r = run_cli("rnntrain", "init", "--recipe", "printed_lines_lm", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["configs/printed_lines.toml", "recipes/printed_lines.sh",
                       "recipes/printed_lines_lm.sh"]
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes()
    assert os.access(tmp_path / "recipes/printed_lines.sh", os.X_OK)
    assert "Printed text lines with a language model" in r.stdout  # its own header
    r = run_cli("rnntrain", "init", "--recipe", "printed_lines", cwd=tmp_path)
    assert r.returncode == 2 and "configs/printed_lines.toml exists; pass --force" in r.stderr
    assert run_cli("rnntrain", "init", "--recipe", "printed_lines", "--force",
                   cwd=tmp_path).returncode == 0
    r = run_cli("rnntrain", "init", "--recipe", "nope", cwd=tmp_path)
    names = ", ".join(sorted(p.stem for p in (ROOT / "recipes").glob("*.sh")))
    assert r.returncode == 2 and f"recipes: {names}" in r.stderr, r.stderr
    r = run_cli("rnntrain", "init", "yesno", "--recipe", "yesno", cwd=tmp_path)
    assert r.returncode == 2 and "not both" in r.stderr
    # run outside the repository: no scripts/env.sh, the data tools as rnntrain_data
    r = run_cli("rnntrain", "init", "--recipe", "yesno", "--out", tmp_path, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    (tmp_path / "rec" / "yesno" / "waves_yesno").mkdir(parents=True)
    p = subprocess.run([str(tmp_path / "recipes/yesno.sh"), str(tmp_path / "rec")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=dict({k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                                PYTHON=sys.executable))
    assert p.returncode == 2, p.stderr
    assert "rnntrain-data yesno-lists: error:" in p.stderr and "0 YesNo recordings" in p.stderr


# Every subcommand of the two command lines, each run installed by the wheel test below
# (which checks that it ran exactly these); test_the_wheel_test_runs_every_subcommand keeps
# this list equal to the argparse subcommands, so a new subcommand fails the default suite
# until the wheel test runs it from an empty folder too (an installed-only crash, such as
# `rnntrain-data images` importing data_tools.audio, cannot come back unseen).
WHEEL_COVERS = {
    "rnntrain": {"init", "train", "eval", "decode", "tune-decoder", "transcribe", "export",
                 "runs", "sweep", "report", "crossfold", "calibrate", "average", "models",
                 "finetune", "rank-lines"},
    "rnntrain-data": {"synth", "inspect", "shard", "audio", "kaldi", "lhotse", "convert",
                      "fsdd-strings", "yesno-lists", "ngram", "images", "render-lines",
                      "perplexity", "faker-text", "rnnlib-config", "pagexml"},
}

# prints {tool: [subcommand, ...]} from the parsers of the installed (or this) package
LIST_SUBCOMMANDS = """
import argparse, json, sys
from rnntrain.cli import build_parser as a
data = __import__(sys.argv[1] + ".cli", fromlist=["build_parser"]).build_parser
print(json.dumps({tool: sorted(n for act in build()._actions
                               if isinstance(act, argparse._SubParsersAction)
                               for n in act.choices)
                  for tool, build in (("rnntrain", a), ("rnntrain-data", data))}))
"""


def test_the_wheel_test_runs_every_subcommand():
    import json
    r = subprocess.run([sys.executable, "-c", LIST_SUBCOMMANDS, "data_tools"], cwd=ROOT,
                       capture_output=True, text=True, env=dict(os.environ,
                                                                PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    found = {tool: set(names) for tool, names in json.loads(r.stdout).items()}
    for tool in found:
        missing, stale = found[tool] - WHEEL_COVERS[tool], WHEEL_COVERS[tool] - found[tool]
        assert not missing, (f"{tool} {sorted(missing)}: run it in "
                             f"test_wheel_in_a_fresh_venv_from_another_folder and add it "
                             f"to WHEEL_COVERS")
        assert not stale, f"{tool} {sorted(stale)}: no such subcommand any more"


def _run(cmd, cwd, env, timeout=600):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


class Installed:
    """Runs the installed commands in the work folder, as a user would, and records which
    subcommands ran. ``rc``: the exit status expected (2 = a clean one-line refusal)."""

    def __init__(self, work: Path, env: dict):
        self.work, self.env = work, env
        self.ran: dict[str, set[str]] = {tool: set() for tool in WHEEL_COVERS}

    def __call__(self, *cmd, rc: int = 0, timeout: int = 600, env=None):
        cmd = [str(c) for c in cmd]
        r = subprocess.run(cmd, cwd=self.work, env=dict(self.env, **(env or {})),
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == rc, (f"{' '.join(cmd)}: exit {r.returncode}, expected {rc}\n"
                                    f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
        sub = next((c for c in cmd[1:] if not c.startswith("-")), None)
        if cmd[0] in self.ran and sub is not None:
            self.ran[cmd[0]].add(sub)
        return r


def _tone_wav(path, hz: float, seconds: float, seed: int, rate: int = 8000):
    import numpy as np
    from scipy.io import wavfile
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * hz * t) + 0.02 * np.random.default_rng(seed).normal(size=t.size)
    wavfile.write(path, rate, (x * 32767).astype(np.int16))


def _inputs(work: Path):
    """The users' files the wheel test converts, made here with the test's own numpy, scipy
    and kaldiio: FSDD-named and YesNo-named recordings, a Kaldi data folder (compressed
    archive, utt2spk), .npy arrays with a list, an RNNLIB config."""
    import numpy as np
    import kaldiio
    rec = work / "fsdd_recordings"
    rec.mkdir()
    for d in range(10):
        for take in range(5):
            _tone_wav(rec / f"{d}_tester_{take}.wav", 300 + 60 * d, 0.2, 10 * d + take)
    yn = work / "waves_yesno"
    yn.mkdir()
    for i in range(8):
        _tone_wav(yn / ("_".join(f"{(i >> b) & 1}" for b in range(8)) + ".wav"), 400, 0.3, i)
    kd = work / "kaldi"
    kd.mkdir()
    rng = np.random.default_rng(0)
    feats = {f"spk{u % 2}-utt{u}": rng.normal(size=(24 + u, 13)).astype(np.float32)
             for u in range(6)}
    kaldiio.save_ark(str(kd / "feats.ark"), feats, scp=str(kd / "feats.scp"),
                     compression_method=2)
    (kd / "text").write_text("".join(f"{u} {'a b c'[:1 + 2 * (i % 3)]}\n"
                                     for i, u in enumerate(feats)))
    (kd / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in feats))
    arr = work / "arrays"
    arr.mkdir()
    for i in range(4):
        np.save(arr / f"x{i}.npy", rng.normal(size=(20 + i, 6)).astype(np.float32))
    (arr / "list.tsv").write_text("".join(f"x{i}.npy\t{'a b'[:1 + 2 * (i % 2)]}\n"
                                          for i in range(4)))
    (work / "old.config").write_text("task transcription\nhiddenType lstm\ntrainFile "
                                     "data/synth_train.nc\nvalFile data/synth_val.nc\n"
                                     "hiddenSize 100\nlearnRate 1e-4\nmomentum 0.9\n")


def _ocr_ground_truth(work: Path) -> int:
    """From the rendered lines in data/lines: a .gt.txt folder (0001.png + 0001.gt.txt, as
    OCR-D, Calamari and kraken keep them) and a PAGE-XML page (the lines pasted onto one
    page image, each line's box as its TextLine polygon, its text as TextEquiv/Unicode).
    Returns the number of lines."""
    from xml.sax.saxutils import escape
    from PIL import Image
    rows = [ln.split("\t", 1) for ln in (work / "data/lines/list.tsv").read_text().splitlines()
            if "\t" in ln]
    gt = work / "data/gt"
    gt.mkdir()
    for n, (p, text) in enumerate(rows, 1):
        shutil.copy(work / "data/lines" / p, gt / f"{n:04d}.png")
        (gt / f"{n:04d}.gt.txt").write_text(text + "\n")
    imgs = [Image.open(work / "data/lines" / p).convert("L") for p, _ in rows]
    page = Image.new("L", (max(i.width for i in imgs) + 40,
                           sum(i.height + 20 for i in imgs) + 20), 255)
    lines, y = [], 20
    for n, (im, (_, text)) in enumerate(zip(imgs, rows)):
        page.paste(im, (20, y))
        x0, y0, x1, y1 = 20, y, 20 + im.width, y + im.height
        lines.append(f'<TextLine id="l{n}"><Coords points="{x0},{y0} {x1},{y0} {x1},{y1} '
                     f'{x0},{y1}"/><TextEquiv><Unicode>{escape(text)}</Unicode></TextEquiv>'
                     f'</TextLine>')
        y = y1 + 20
    (work / "page").mkdir()
    page.save(work / "page/page.png")
    w, h = page.size
    ns = "http://schema.primaresearch.org/PAGE/gts/pagecontent/2019-07-15"
    (work / "page/page.xml").write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<PcGts xmlns="{ns}"><Page imageFilename='
        f'"page.png" imageWidth="{w}" imageHeight="{h}"><TextRegion id="r0"><Coords '
        f'points="0,0 {w},0 {w},{h} 0,{h}"/>{"".join(lines)}</TextRegion></Page></PcGts>\n')
    return len(rows)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RNNTRAIN_TEST_WHEEL"),
                    reason="a CI step (.ci/run): RNNTRAIN_TEST_WHEEL=1 builds the wheel and "
                           "installs it with torch into a new venv (minutes)")
def test_wheel_in_a_fresh_venv_from_another_folder(tmp_path):
    """Build the wheel (no build isolation: offline), install it with its dependencies and
    the ``images`` and ``export`` extras into a new venv (pip's configured index;
    constraints.txt pins the CPU torch), then work in an empty folder that is not the
    repository, with no PYTHONPATH: every subcommand of ``rnntrain`` and ``rnntrain-data``
    runs at least once (WHEEL_COVERS, checked against the installed parsers), each output
    checked: synthetic data, audio (FSDD-style strings), a Kaldi archive, arrays and
    rendered text lines are converted, a tiny model is trained one epoch on each, and
    transcribes, evaluates, decodes with a language model and exports. The default suite's
    test_the_wheel_test_runs_every_subcommand keeps the list complete; the commands' own
    behaviour is covered by their faster tests (test_corpora, test_kaldi, test_ocr, ...)."""
    import json
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
          f"{wheel}[images,export]"], tmp_path, env, timeout=900)
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    work = tmp_path / "work"
    work.mkdir()
    run = Installed(work, env)
    r = run("rnntrain", "--version")
    assert r.stdout.strip() == f"rnntrain {wheel.name.split('-')[1]}"
    # the installed modules, not the repository's; the data tools under their own name
    r = _run([str(bin_ / "python"), "-c", "import rnntrain, rnntrain_data, importlib.util; "
              "print(rnntrain.__file__); print(importlib.util.find_spec('data_tools'))"],
             work, env)
    where, data_tools = r.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "venv") and data_tools == "None"
    r = _run([str(bin_ / "python"), "-c", LIST_SUBCOMMANDS, "rnntrain_data"], work, env)
    installed = {tool: set(names) for tool, names in json.loads(r.stdout).items()}
    assert installed == WHEEL_COVERS
    _inputs(work)
    small = ["model.layers=1", "model.hidden=8", "train.epochs=1", "compute.threads=1"]

    # ---- init: an example config, and a recipe with what it runs
    assert "recipes (rnntrain init --recipe NAME" in run("rnntrain", "init", "--list").stdout
    run("rnntrain", "init")
    assert (work / "default.toml").read_text() == (ROOT / "configs/default.toml").read_text()
    run("rnntrain", "init", "printed_lines")
    run("rnntrain", "init", "--recipe", "yesno_lm", "--out", work)
    for rel in ("recipes/yesno_lm.sh", "recipes/yesno.sh", "configs/yesno.toml"):
        assert (work / rel).read_text() == (ROOT / rel).read_text(), rel
    assert os.access(work / "recipes/yesno.sh", os.X_OK)
    shared = next((p for p in (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" /
                               "data") if (p / "yesno" / "waves_yesno").is_dir()), None)
    if shared is not None:  # the recipe's data part, run as written, installed
        _run(["recipes/yesno.sh", str(shared)], work, dict(env, DATA_ONLY="1"))
        assert all((work / f"data/yesno/{s}.nc").is_file() for s in ("train", "val", "test"))

    # ---- synthetic data: synth, inspect, shard, train, runs, report, sweep, eval, decode
    for name, n, seed in (("synth_train", 80, 1), ("synth_val", 20, 2)):
        run("rnntrain-data", "synth", f"data/{name}.nc", "--seqs", n, "--seed", seed,
            "--labels", "5", "--inputs", "6")
    assert re.search(r"sequences +20\n", run("rnntrain-data", "inspect",
                                             "data/synth_val.nc").stdout)
    run("rnntrain-data", "shard", "data/synth_train.nc", "--shards", "2", "--out", "data/shards")
    assert re.search(r"sequences +80\n", run("rnntrain-data", "inspect", "data/shards").stdout)
    run("rnntrain", "train", "default.toml", *small)
    assert (work / "runs/default/checkpoints/last.pt").is_file()
    # only overrides: the built-in defaults, here on the sharded copy
    # ... under the capped allocator: its C++ cache, shipped as package data, compiles on
    # first use against the venv's torch (into an empty cache folder) and goes in; so does
    # the LSTM recurrence (compute.lstm = "scan", the default)
    run("rnntrain", "train", "data.train=data/shards", "data.val=data/synth_val.nc",
        "run.dir=runs/bare", "compute.allocator=capped", *small,
        env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert (work / "runs/bare/checkpoints/last.pt").is_file()
    if shutil.which("c++") or shutil.which("g++"):
        assert "cached by size" in (work / "runs/bare/train.log").read_text()
        assert list((tmp_path / "xdg" / "rnntrain").glob("_cpucache-*.so"))
        assert "lstm: rnntrain's compiled recurrence" in (work / "runs/bare/train.log").read_text()
        assert list((tmp_path / "xdg" / "rnntrain").glob("_lstmscan-*.so"))
    runs_out = run("rnntrain", "runs").stdout
    assert "default" in runs_out and "bare" in runs_out
    run("rnntrain", "report", "runs/default")
    assert (work / "runs/default/report/report.md").is_file()
    run("rnntrain", "sweep", "default.toml", "model.hidden=4,8", "model.layers=1",
        "train.epochs=1", "compute.threads=1", "--out", "sweeps/s")
    assert len((work / "sweeps/s/results.csv").read_text().strip().splitlines()) == 3
    ev = json.loads(run("rnntrain", "eval", "runs/default", "data/synth_val.nc",
                        "--json").stdout)
    assert 0 <= ev["best"]["ler"]
    # two folds of the training file, then the pair as one model (an ensemble)
    run("rnntrain", "crossfold", "default.toml", "--folds", "2", "--out", "runs/cv", *small)
    assert all((work / f"runs/cv/fold-{i}/checkpoints/last.pt").is_file() for i in (0, 1))
    ev = json.loads(run("rnntrain", "eval", "runs/cv", "data/synth_val.nc", "--json").stdout)
    assert 0 <= ev["best"]["ler"]
    # the two folds' weights averaged into one model (one architecture and alphabet)
    run("rnntrain", "average", "runs/cv/fold-0", "runs/cv/fold-1", "--out", "avg.pt")
    assert (work / "avg.pt").is_file()
    run("rnntrain", "decode", "runs/default", "data/synth_val.nc", "--out", "hyps.txt")
    assert len((work / "hyps.txt").read_text().splitlines()) == 20
    toml = run("rnntrain-data", "rnnlib-config", "old.config").stdout
    assert 'train = "data/synth_train.nc"' in toml and "hidden = 100" in toml

    # ---- printed text lines: render-lines, images, train (conv), transcribe, export,
    # a character LM (ngram, perplexity, faker-text), LM decoding and tuning
    run("rnntrain-data", "render-lines", "--out", "data/lines", "--count", "10", "--sizes",
        "16-18", "--max-chars", "8")
    run("rnntrain-data", "images", "--list", "data/lines/list.tsv", "--out", "data/lines.nc",
        "--chars", "--height", "32", "--alphabet", "ascii")
    lines = ["data.train=data/lines.nc", "data.val=data/lines.nc", "data.test=data/lines.nc",
             "model.conv_channels=[4,4,4,4]", "run.dir=runs/lines", *small]
    run("rnntrain", "train", "printed_lines.toml", *lines)
    img = sorted((work / "data/lines").rglob("*.png"))[0]
    out = run("rnntrain", "transcribe", "runs/lines", img).stdout
    assert out.startswith(str(img)), out
    run("rnntrain", "export", "runs/lines", "--format", "onnx", "--out", "lines.onnx")
    assert run("rnntrain", "transcribe", "lines.onnx", img).stdout.startswith(str(img))
    (work / "lines.txt").write_text("".join(ln.split("\t", 1)[1] + "\n" for ln in
                                            (work / "data/lines/list.tsv").read_text()
                                            .splitlines() if "\t" in ln))
    run("rnntrain-data", "ngram", "lines.txt", "--chars", "--order", "2", "--discount-fallback",
        "--out", "chars.arpa")
    ppl = json.loads(run("rnntrain-data", "perplexity", "chars.arpa", "lines.txt", "--chars",
                         "--json").stdout)
    assert ppl["sentences"] == 10 and ppl["perplexity"] > 1
    run("rnntrain-data", "faker-text", "--out", "lm.txt", "--count", "5", "--exclude",
        "data/lines/list.tsv")
    assert len((work / "lm.txt").read_text().splitlines()) == 5
    lm = ["--lm", "chars.arpa", "--space", "<space>"]
    ev = json.loads(run("rnntrain", "eval", "runs/lines", "data/lines.nc", "--beam", "2", *lm,
                        "--json").stdout)
    assert 0 <= ev["beam"]["ler"]
    tuned = json.loads(run("rnntrain", "tune-decoder", "runs/lines", "data/lines.nc", *lm,
                           "--lm-weights", "0,0.5", "--word-bonuses", "0", "--label-bonuses",
                           "0", "--select", "ler", "--json").stdout)
    assert tuned["best"]["lm_weight"] in (0, 0.5)
    cal = json.loads(run("rnntrain", "calibrate", "runs/lines", "data/lines.nc", "--out",
                         "calibrated.pt", "--json").stdout)
    assert cal["temperature"] > 0 and (cal["stored"] is None) == (cal["labels"] == 0)
    # OCR ground truth as it comes: a .gt.txt folder and a PAGE-XML page, each converted
    # with the same settings and trained on one epoch from the lines model's config
    n = _ocr_ground_truth(work)
    out = run("rnntrain-data", "images", "data/gt", "--out", "data/gt.nc", "--height", "32",
              "--alphabet", "ascii").stdout
    assert f"wrote data/gt.nc: {n} lines" in out, out
    out = run("rnntrain-data", "pagexml", "page/page.xml", "--out", "data/page.nc",
              "--height", "32", "--alphabet", "ascii").stdout
    assert f"wrote data/page.nc: {n} lines" in out, out
    for name in ("gt", "page"):
        run("rnntrain", "train", "printed_lines.toml", *lines, f"data.train=data/{name}.nc",
            f"data.val=data/{name}.nc", f"run.dir=runs/{name}")
        assert (work / f"runs/{name}/checkpoints/last.pt").is_file()
    # ---- base models: the zoo inside the installed package, a name wherever a path goes:
    # transcribe, fine-tune on the .gt.txt folder, rank lines, pack a model of one's own
    assert "de19-small" in run("rnntrain", "models").stdout
    card = json.loads(run("rnntrain", "models", "de19-small", "--json").stdout)
    assert card["name"] == "de19-small" and card["scores"]
    assert run("rnntrain", "transcribe", "de19-small", img).stdout.startswith(str(img))
    run("rnntrain", "finetune", "de19-small", "data/gt", "--out", "runs/ft", "--steps", "2",
        "compute.threads=1")
    assert (work / "runs/ft/checkpoints/best.pt").is_file()
    ranked = run("rnntrain", "rank-lines", "de19-small,runs/ft", "data/lines/img", "--top",
                 "3").stdout.splitlines()
    assert len(ranked) == 3
    (work / "info.json").write_text(json.dumps({
        "title": "mine", "summary": "a fine-tuned model", "licenses": ["CC0"],
        "data": [{"corpus": "rendered", "lines": n, "license": "CC0"}],
        "training": {"command": "rnntrain finetune", "date": "today", "cpu": "this one",
                     "cpu_seconds": 1, "commit": "none"}}))
    run("rnntrain", "models", "mine", "--pack", "runs/ft", "--info", "info.json", "--out",
        "myzoo", "--score", "gt=runs/ft/data/val.nc")
    assert "mine" in run("rnntrain", "models", env={"RNNTRAIN_MODELS": str(work / "myzoo")}).stdout

    # ---- speech: fsdd-strings → audio → train → transcribe a recording; yesno-lists
    run("rnntrain-data", "fsdd-strings", "--recordings", "fsdd_recordings", "--split", "test",
        "--count", "6", "--digits", "1-2", "--out", "data/fsdd")
    run("rnntrain-data", "audio", "--list", "data/fsdd/list.tsv", "--out", "data/fsdd.nc")
    run("rnntrain", "train", "data.train=data/fsdd.nc", "data.val=data/fsdd.nc",
        "run.dir=runs/fsdd", *small)
    wav = sorted((work / "data/fsdd").rglob("*.wav"))[0]
    assert run("rnntrain", "transcribe", "runs/fsdd", wav).stdout.startswith(str(wav))
    run("rnntrain-data", "yesno-lists", "--recordings", "waves_yesno", "--out", "data/yn",
        "--test", "2", "--val", "1")
    assert [len((work / f"data/yn/{s}.tsv").read_text().splitlines())
            for s in ("train", "val", "test")] == [5, 1, 2]

    # ---- Kaldi features (compressed archive, CMVN per speaker) and .npy arrays
    out = run("rnntrain-data", "kaldi", "kaldi", "--out", "data/kaldi.nc", "--cmvn",
              "speaker").stdout
    assert "6 utterances, 2 speakers; 13 Kaldi features per frame" in out
    run("rnntrain", "train", "data.train=data/kaldi.nc", "data.val=data/kaldi.nc",
        "run.dir=runs/kaldi", *small)
    assert len(run("rnntrain", "transcribe", "runs/kaldi", "data/kaldi.nc").stdout
               .strip().splitlines()) == 6
    run("rnntrain-data", "convert", "--list", "arrays/list.tsv", "--out", "data/arrays.nc")
    assert re.search(r"sequences +4\n", run("rnntrain-data", "inspect", "data/arrays.nc").stdout)
    # lhotse is an extra not installed here: one clean line saying how to get it
    (work / "cuts.jsonl.gz").write_bytes(b"")
    r = run("rnntrain-data", "lhotse", "cuts.jsonl.gz", "--out", "data/l.nc", rc=2)
    assert "pip install 'rnntrain[lhotse]'" in r.stderr

    assert run.ran == WHEEL_COVERS, {t: WHEEL_COVERS[t] - run.ran[t] for t in WHEEL_COVERS}


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
