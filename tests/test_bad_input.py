"""Bad input and numerical faults, as a user meets them: the real CLI in a subprocess.

Every case asserts a non-zero exit, no traceback, and a last stderr line that is the one-line
error naming the file / variable / sequence; no checkpoint is written from bad data.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.badinput import BAD_FILES, good_parts, write_nc
from tests.conftest import ROOT, run_cli, run_cli_batch, train_here


def config(tmp_path, train_file, val=None, name="exp.toml", **sections) -> str:
    text = f'[data]\ntrain = "{train_file}"\n' + (f'val = "{val}"\n' if val else "")
    body = {"model": {"layers": 1, "hidden": 8},
            "train": {"epochs": 1}, "batch": {"batch_frames": 200}, "compute": {"threads": 1}}
    for sec, kv in sections.items():
        body.setdefault(sec, {}).update(kv)
    for sec, kv in body.items():
        text += f"[{sec}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items())
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def assert_clean_error(proc, *fragments):
    err = proc.stderr
    assert proc.returncode == 2, f"rc {proc.returncode}\n{err[-2000:]}"
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    # tqdm may share the line with the error: what counts is what follows "error:"
    assert ": error: " in last, last
    msg = last[last.index("rnntrain "):]
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def train(cfg, *args, **kw):
    return run_cli("rnntrain", "train", cfg, *args, **kw)


@pytest.fixture(scope="module")
def good_nc(tmp_path_factory):
    d = tmp_path_factory.mktemp("good")
    return write_nc(d / "good.nc", good_parts()), write_nc(d / "f4.nc", good_parts(f=4))


@pytest.fixture(scope="module")
def trained(tiny_run):
    """A finished tiny run on good data (its checkpoints are used by several cases)."""
    return tiny_run[1:]


@pytest.fixture(scope="module")
def bad_file_runs(tmp_path_factory):
    """Every BAD_FILES case through ``rnntrain train``, all in one process (run_cli_batch:
    the torch import once, not once per case) → {case: (path, run folder, result)}."""
    d = tmp_path_factory.mktemp("badfiles")
    cases = {}
    for case, (build, _) in sorted(BAD_FILES.items()):
        (d / case).mkdir()
        path = build(d / case / f"{case}.nc")
        cases[case] = (path, d / case / "run", config(d / case, path))
    results = run_cli_batch([("rnntrain", "train", cfg, f"run.dir={run}")
                             for _, run, cfg in cases.values()])
    return {case: (path, run, r) for (case, (path, run, _)), r in zip(cases.items(), results)}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_training_file(bad_file_runs, case):
    path, run, p = bad_file_runs[case]
    msg = assert_clean_error(p, str(path), *BAD_FILES[case][1])
    assert "\n" not in msg
    assert not list(run.glob("checkpoints/*.pt")), "a checkpoint was written from bad data"


@pytest.fixture(scope="module")
def refused(tmp_path_factory, trained, good_nc):
    """Command lines refused before training (each in a folder of its own), all in one
    process (run_cli_batch) → {name: (result, folder)}. test_missing_data_path and
    test_run_dir_not_writable below run theirs as processes of their own."""
    d = tmp_path_factory.mktemp("refused")
    cfg, run = trained
    evil = d / "code" / "evil.pt"
    evil.parent.mkdir()
    torch.save({"format": 1, "model": _Payload(d / "code" / "pwned")}, evil)
    cases = {
        "val_size": lambda t: ("train", config(t, good_nc[0], val=good_nc[1]),
                               f"run.dir={t / 'r'}"),
        "val_nan": lambda t: ("train", config(t, good_nc[0], val=BAD_FILES["nan_inputs"][0](
            t / "val.nc")), f"run.dir={t / 'r'}"),
        "resume_size": lambda t: ("train", cfg, f"run.dir={run}", f"data.train={good_nc[1]}",
                                  "--resume", "auto"),
        "eval_size": lambda t: ("eval", run / "checkpoints" / "last.pt", good_nc[1]),
        "not_set": lambda t: ("train", _write(t / "c.toml", "[model]\nhidden = 8\n")),
        "other_model": lambda t: ("train", cfg, f"run.dir={run}", "model.hidden=9", "--resume",
                                  "auto"),
        "code": lambda t: ("eval", evil, good_nc[0]),
        "no_checkpoint": lambda t: ("train", config(t, good_nc[0]), f"run.dir={t / 'run'}",
                                    "--resume", "auto"),
    }
    argvs = {}
    for name, make in cases.items():
        (d / name).mkdir(exist_ok=True)
        argvs[name] = ("rnntrain", *make(d / name))
    res = run_cli_batch(list(argvs.values()))
    return {name: (r, d / name) for name, r in zip(argvs, res)}


def _write(path, text):
    path.write_text(text)
    return path


def test_val_input_size_differs(refused, good_nc):
    assert_clean_error(refused["val_size"][0], str(good_nc[1]),
                       "inputPattSize 4 differs from training data", str(good_nc[0]), "(3)")


def test_bad_validation_file(refused):
    p, d = refused["val_nan"]
    assert_clean_error(p, str(d / "val.nc"), "sequence 2 ('utt2')", "NaN or Inf")


def test_checkpoint_input_size_differs_on_resume(refused, trained, good_nc):
    _, run = trained
    assert_clean_error(refused["resume_size"][0], str(good_nc[1]),
                       "inputPattSize 4 differs from checkpoint", str(run / "checkpoints"),
                       "(3)")


def test_checkpoint_input_size_differs_on_eval(refused, good_nc):
    assert_clean_error(refused["eval_size"][0], str(good_nc[1]),
                       "inputPattSize 4 differs from the checkpoint's (3)")


BAD_CONFIGS = [
    ("[train]\nepoch = 3\n", ["unknown key train.epoch", "valid keys of [train]", "epochs"]),
    ("[trian]\n", ["unknown section [trian]"]),
    ('[train]\nepochs = "three"\n', ["train.epochs must be int", "str 'three'"]),
    ("[optim]\nlr = -0.1\n", ["optim.lr = -0.1 must be > 0"]),
    ("[model]\nhidden = 0\n", ["model.hidden = 0 must be > 0"]),
    ("[model\n", ["not valid TOML"]),
]


@pytest.fixture(scope="module")
def bad_config_runs(tmp_path_factory, good_nc):
    """Every BAD_CONFIGS case through ``rnntrain train``, in one process (run_cli_batch)."""
    d = tmp_path_factory.mktemp("badconfigs")
    cfgs = []
    for i, (text, _) in enumerate(BAD_CONFIGS):
        cfgs.append(d / f"bad{i}.toml")
        cfgs[-1].write_text(f'[data]\ntrain = "{good_nc[0]}"\n' + text)
    return run_cli_batch([("rnntrain", "train", c) for c in cfgs])


@pytest.mark.parametrize("i", range(len(BAD_CONFIGS)))
def test_bad_config(bad_config_runs, i):
    assert_clean_error(bad_config_runs[i], *BAD_CONFIGS[i][1])


def test_missing_data_path(tmp_path):
    p = train(config(tmp_path, tmp_path / "nowhere.nc"))
    assert_clean_error(p, str(tmp_path / "nowhere.nc"), "not found")


def test_data_path_not_set(refused):
    assert_clean_error(refused["not_set"][0], "data.train is not set")


def test_run_dir_not_writable(tmp_path, good_nc):
    blocker = tmp_path / "afile"
    blocker.write_text("")  # a file where the run folder's parent should be
    p = train(config(tmp_path, good_nc[0]), f"run.dir={blocker / 'run'}")
    assert_clean_error(p, str(blocker / "run"), "not writable")


def test_fresh_run_refuses_a_folder_with_checkpoints(trained):
    """Re-running without --resume must not overwrite (and prune) a run's checkpoints."""
    cfg, run = trained
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    config_toml = (run / "config.toml").read_bytes()
    p = train(cfg, f"run.dir={run}")
    assert_clean_error(p, f"run folder {run} already holds checkpoints", "--resume")
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == before
    assert (run / "config.toml").read_bytes() == config_toml


def test_resume_with_other_model_section(refused):
    assert_clean_error(refused["other_model"][0], "model section differs from the config",
                       "'hidden': (8, 9)")


def test_corrupt_checkpoints_fall_back(tmp_path, trained):
    """--resume auto skips a truncated checkpoint and one of another format version,
    saying so, and resumes from the newest usable one; an explicit bad path is an error."""
    import shutil
    cfg, src = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    ck_dir = run / "checkpoints"
    last = torch.load(ck_dir / "last.pt", weights_only=True)
    steps = last["state"]["step"]
    newer = dict(last, state=dict(last["state"], step=steps + 1))
    torch.save(dict(newer, format=99), ck_dir / f"step-{steps + 2:08d}.pt")
    data = (ck_dir / "last.pt").read_bytes()
    (ck_dir / f"step-{steps + 3:08d}.pt").write_bytes(data[: len(data) // 2])
    p = train(cfg, f"run.dir={run}", "train.epochs=2", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"step-{steps + 2:08d}.pt: checkpoint format 99" in p.stderr
    assert "falling back to" in p.stderr
    assert f"resumed from {ck_dir / 'last.pt'}" in p.stderr
    bad = ck_dir / f"step-{steps + 3:08d}.pt"
    bad.write_bytes(data[: len(data) // 2])
    p = train(cfg, f"run.dir={run}", "--resume", str(bad))
    assert_clean_error(p, str(bad), "not a readable checkpoint")


def _fsize_limit(limit):
    """A preexec_fn: files may not grow beyond ``limit`` bytes (a real EFBIG)."""
    def pre():
        # SIG_IGN survives exec: the write then fails with EFBIG instead of killing
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def test_disk_full_while_checkpointing_keeps_previous(tmp_path, synth_pair):
    """A checkpoint write that fails (file size limit: a real EFBIG from the kernel) stops
    the run with a clear error; the previous checkpoint stays valid and resumable."""
    train_nc, _ = synth_pair
    cfg = config(tmp_path, train_nc, model={"hidden": 8, "bidirectional": "false"},
                 train={"epochs": 2}, batch={"batch_frames": 600}, log={"every_steps": 1000},
                 checkpoint={"every_steps": 4})
    run = tmp_path / "run"
    train_here(cfg, f"run.dir={run}", "train.epochs=1")
    good = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    size = (run / "checkpoints" / "last.pt").stat().st_size
    assert size > 12_000, "the limit must be below one checkpoint"
    before = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "rnntrain", "train", cfg, f"run.dir={run}",
                        "--resume"], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=300, preexec_fn=_fsize_limit(12_000))
    assert_clean_error(p, "cannot write checkpoint", "File too large",
                       "previous checkpoints", "intact")
    after = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    assert after == before, "a failed write changed or left files in checkpoints/"
    again = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert again["state"] == good["state"]
    ok = train(cfg, f"run.dir={run}", "--resume")
    assert ok.returncode == 0, ok.stderr[-2000:]


SAVE_BIG = """
import sys, torch
from pathlib import Path
from rnntrain.run.checkpoint import save_atomic
from rnntrain.errors import UserError
try:
    save_atomic({"w": torch.ones(2_000_000)}, Path(sys.argv[1]))
except UserError as e:
    print(e)
"""


def test_disk_full_large_checkpoint_keeps_previous(tmp_path):
    """torch.save reports a failed write of a large tensor as a RuntimeError, not OSError:
    the same clean error, the old file untouched, no temp file left."""
    target = tmp_path / "last.pt"
    torch.save({"w": torch.zeros(10)}, target)
    before = target.read_bytes()
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", SAVE_BIG, str(target)], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=_fsize_limit(1_000_000))
    assert p.returncode == 0, p.stderr
    assert f"cannot write checkpoint {target}" in p.stdout and "intact" in p.stdout, p.stdout
    assert target.read_bytes() == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["last.pt"]


def test_disk_full_while_logging(tmp_path, synth_pair):
    """The metrics log hits the file size limit before any checkpoint: a clean error."""
    cfg = config(tmp_path, synth_pair[0], batch={"batch_frames": 600}, log={"every_steps": 1},
                 checkpoint={"every_steps": 0})
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "rnntrain", "train", cfg, f"run.dir={run}"],
                       cwd=ROOT, env=e, capture_output=True, text=True, timeout=300,
                       preexec_fn=_fsize_limit(4000))  # config.toml (~1.6 kB) fits
    assert_clean_error(p, "cannot write", "metrics.jsonl", "File too large")
    assert not list(run.glob("checkpoints/*")), "nothing should have been checkpointed"


def _spiky_run(tmp_path, spike_seqs, **train_section):
    """A run folder whose resumable checkpoint ignores input feature 0 (its input weights
    are zero) and a data file where feature 0 is 0 except in ``spike_seqs``, where it is
    1e30: the forward pass stays finite, but the gradient of those weights (1e30 x the
    backpropagated error) has a non-finite norm. Returns (config, run folder)."""
    parts = good_parts(n=12)
    x = parts["inputs"].copy()
    x[:, 0] = 0.0
    good = write_nc(tmp_path / "good.nc", dict(parts, inputs=x.copy()))
    offs = np.concatenate([[0], np.cumsum(parts["lengths"])])
    for s in spike_seqs:
        x[offs[s]:offs[s + 1], 0] = 1e30
    spiky = write_nc(tmp_path / "spiky.nc", dict(parts, inputs=x))
    sections = {"train": {"epochs": 1, **train_section}, "batch": {"batch_frames": 40},
                "checkpoint": {"every_steps": 1, "keep_last": 100}}
    first = train_here(config(tmp_path, good, name="good.toml", **sections),
                       f"run.dir={tmp_path / 'first'}")
    ck = torch.load(first / "checkpoints" / "last.pt", weights_only=True)
    for k, v in ck["model"].items():
        if k.startswith("rnn") and "weight_ih_l0" in k:
            v[:, 0] = 0.0
    ck["state"].update(epoch=0, pos=0, step=0)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save(ck, run / "checkpoints" / "step-00000000.pt")
    return config(tmp_path, spiky, **sections), run


def test_nan_step_skipped_and_counted(tmp_path):
    """A step with a non-finite gradient is skipped: the weights and optimizer state after
    it equal those before it (step checkpoints every step), the next step changes them,
    and it is counted in the log and the checkpoint."""
    cfg, run = _spiky_run(tmp_path, [5])
    p = train(cfg, f"run.dir={run}", "--resume", "auto")
    assert p.returncode == 0, p.stderr[-3000:]
    skipped = [ln for ln in p.stderr.splitlines() if "update skipped" in ln]
    assert len(skipped) == 1 and "utt5" in skipped[0], p.stderr[-3000:]
    bad_step = int(skipped[0].split("step ")[1].split(":")[0])
    cks = {s: torch.load(run / "checkpoints" / f"step-{s:08d}.pt", weights_only=True)
           for s in range(bad_step - 1, bad_step + 2)}
    prev, after, nxt = cks[bad_step - 1], cks[bad_step], cks[bad_step + 1]
    assert after["state"]["bad_total"] == 1 and prev["state"].get("bad_total", 0) == 0
    for k, v in prev["model"].items():
        assert torch.equal(v, after["model"][k]), f"a skipped step changed {k}"
    for i, st in prev["optim"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, after["optim"]["state"][i][k]), f"optimizer {i}.{k} changed"
    assert any(not torch.equal(v, nxt["model"][k]) for k, v in after["model"].items())
    assert all(torch.isfinite(v).all() for v in nxt["model"].values())
    assert "update skipped" in (run / "train.log").read_text()


def test_nan_steps_in_a_row_stop_the_run(tmp_path):
    cfg, run = _spiky_run(tmp_path, range(12), max_bad_steps=2)
    p = train(cfg, f"run.dir={run}", "--resume", "auto")
    assert_clean_error(p, "2 steps in a row with NaN/Inf", "train.max_bad_steps = 2",
                       "sequences utt")


def test_infeasible_targets_filtered_and_reported_once(tmp_path):
    parts = good_parts(n=8)
    targets = list(parts["targets"])
    targets[2] = " ".join(["a", "b"] * 10)  # 20 labels > 16 frames
    targets[6] = " ".join(["a"] * 14)       # 14 labels + 13 blanks between repeats > 24
    parts["targets"] = targets
    path = write_nc(tmp_path / "t.nc", parts)
    val = write_nc(tmp_path / "v.nc", dict(parts, tags=[f"v{i}" for i in range(8)]))
    p = train(config(tmp_path, path, val=val), f"run.dir={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stderr.splitlines() if "too short for their targets" in ln]
    assert len(lines) == 2, lines
    assert "train: skipping 2 of 8" in lines[0] and "utt2, utt6" in lines[0]
    assert "val: skipping 2 of 8" in lines[1] and "v2, v6" in lines[1]
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("too short for their targets") == 2
    assert "nan" not in (tmp_path / "run" / "metrics.jsonl").read_text().lower()


def test_decode_out_folder_missing(tmp_path, trained, good_nc):
    _, run = trained
    out = tmp_path / "no" / "hyps.tsv"
    p = run_cli("rnntrain", "decode", run / "checkpoints" / "last.pt", good_nc[0], "--out", out)
    assert_clean_error(p, f"--out {out}: its folder does not exist")
    p = run_cli("rnntrain", "decode", run / "checkpoints" / "last.pt", good_nc[0], "--out",
                tmp_path / "hyps.tsv")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = (tmp_path / "hyps.tsv").read_text().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == [f"utt{i}" for i in range(6)]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["hyps.tsv"]  # no temp file left


@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET",
                                 "NETCDF3_64BIT_DATA", "NETCDF4"])
@pytest.mark.parametrize("records", [False, True])
def test_truncation_check_against_real_layouts(tmp_path, fmt, records):
    """The header-offset check accepts every valid file (record variables, attributes of
    every type, odd sizes) and flags it once bytes are missing."""
    import netCDF4
    from rnntrain.errors import DataError
    from rnntrain.data.ncdata import check_complete, classic_min_size
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(str(path), "w", format=fmt) as ds:
        ds.setncattr("title", "odd length title")
        ds.setncattr("scale", np.array([1.5, 2.5], dtype="f8"))
        ds.createDimension("rec" if records else "n", None if records else 7)
        ds.createDimension("x", 3)
        first = "rec" if records else "n"
        a = ds.createVariable("a", "i2", (first, "x"))
        a.units = "m"
        b = ds.createVariable("b", "S1", (first,))
        c = ds.createVariable("c", "f8", ("x",))
        a[0:7, :] = np.arange(21, dtype="i2").reshape(7, 3)
        b[0:7] = np.array(list("abcdefg"), dtype="S1")
        c[:] = [1.0, 2.0, 3.0]
    size = path.stat().st_size
    need = classic_min_size(path)
    if fmt == "NETCDF4":
        assert need is None  # HDF5 reports its own truncation
        return
    # records are padded to 4 bytes per variable; the check does not count that padding
    slack = 3 * 2 * 7 if records and fmt != "NETCDF4" else 3
    assert need is not None and size - slack <= need <= size
    check_complete(path)  # no error on the valid file
    path.write_bytes(path.read_bytes()[: need - 1])
    with pytest.raises(DataError, match="truncated file"):
        check_complete(path)


class _Payload:
    """Unpickling this would create a file: what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_with_code_is_refused(refused):
    p, d = refused["code"]
    assert_clean_error(p, str(d / "evil.pt"), "not a readable checkpoint")
    assert not (d / "pwned").exists(), "loading a checkpoint ran code"


def test_resume_without_checkpoint(refused):
    p, d = refused["no_checkpoint"]
    assert_clean_error(p, f"--resume auto: no checkpoint in {d / 'run' / 'checkpoints'}",
                       "run.dir=")
