"""Run folders: status.json, `rnntrain runs`, early stopping, `rnntrain sweep`."""
from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys

import pytest
import torch

from conftest import run_cli
from rnntrain.config import load_config
from rnntrain.errors import UserError
from rnntrain.tools.runs import list_runs, read_metrics, read_status, summarize
from rnntrain.run.train import train

TINY = ["model.layers=1", "model.hidden=8", "batch.batch_frames=800", "compute.threads=2",
        "log.every_steps=4"]


def tiny_config(tmp_path, train_nc, val_nc):
    p = tmp_path / "tiny.toml"
    p.write_text(f'[data]\ntrain = "{train_nc}"\nval = "{val_nc}"\n')
    return p


def train_run(tmp_path, synth_pair, name, *overrides):
    cfg_path = tiny_config(tmp_path, *synth_pair)
    ov = [*TINY, f"run.dir={tmp_path / 'runs' / name}", *overrides]
    return train(load_config(cfg_path, ov), str(cfg_path), ov)


def val_lers(run):
    return [r["ler"] for r in read_metrics(run) if r["split"] == "val"]


def test_finished_run_is_listed(synth_pair, tmp_path):
    run = train_run(tmp_path, synth_pair, "ok", "train.epochs=2")
    st = read_status(run)
    steps = max(r["step"] for r in read_metrics(run) if r["split"] == "train")
    assert st["status"] == "finished" and st["epoch"] == 2 and st["step"] == steps
    best = min(val_lers(run))
    assert st["best_ler"] == pytest.approx(best)
    ck = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    assert ck["state"]["best_ler"] == pytest.approx(best)
    table = list_runs(tmp_path / "runs")
    row = [ln for ln in table.splitlines() if ln.startswith("ok ")]
    assert len(row) == 1 and "finished" in row[0] and "2/2" in row[0]
    assert f"{best:.4f}" in row[0]
    (js,) = json.loads(list_runs(tmp_path / "runs", as_json=True))
    assert js["status"] == "finished" and js["steps"] == steps
    assert js["best_val_ler"] == pytest.approx(best) and js["frames_per_s"] > 0


def test_failed_run_records_the_error(synth_pair, tmp_path):
    # an absurd learning rate overflows the weights: NaN loss, and the run stops
    with pytest.raises(UserError, match="NaN"):
        train_run(tmp_path, synth_pair, "bad", "optim.lr=1e30", "optim.clip_norm=0",
                  "train.max_bad_steps=1", "train.epochs=3")
    st = read_status(tmp_path / "runs" / "bad")
    assert st["status"] == "failed" and "NaN" in st["error"]
    assert "failed" in list_runs(tmp_path / "runs")


def test_killed_run_shows_as_died(tmp_path):
    run = tmp_path / "runs" / "gone"
    run.mkdir(parents=True)
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # its pid is now free: a run that was killed without a word
    import socket
    (run / "status.json").write_text(json.dumps({"status": "running", "pid": p.pid,
                                                 "host": socket.gethostname(),
                                                 "started": 1.0, "updated": 2.0}))
    (run / "metrics.jsonl").write_text('{"split": "train", "epoch": 0, "step": 4, '
                                       '"loss": 3.0, "frames_per_s": 10.0, "time": 2.0}\n'
                                       '{"split": "train", "epo')  # cut mid-line
    s = summarize(run)
    assert s.status == "died" and s.steps == 4


def test_early_stopping_after_patience(synth_pair, tmp_path):
    """A learning rate too small to change the best-path output: the validation LER never
    improves after the first epoch, so training stops after 1 + patience validations."""
    patience, epochs = 2, 6
    run = train_run(tmp_path, synth_pair, "es", "optim.lr=1e-12", f"train.epochs={epochs}",
                    f"train.patience={patience}")
    lers = val_lers(run)
    # when must it stop? replay RNNLIB's maxTestsNoBest rule on the recorded LERs
    best, since, expected = float("inf"), 0, len(lers)
    for n, ler in enumerate(lers, 1):
        best, since = (ler, 0) if ler < best else (best, since + 1)
        if since >= patience:
            expected = n
            break
    assert len(lers) == expected < epochs
    assert "early stop" in (run / "train.log").read_text()
    s = summarize(run)
    assert s.status == "finished" and s.early_stopped and s.epochs_done == expected
    assert "(early stop)" in list_runs(tmp_path / "runs")


def test_sweep_runs_and_tabulates_four_configs(synth_pair, tmp_path):
    cfg = tiny_config(tmp_path, *synth_pair)
    out = tmp_path / "sw"
    args = ["rnntrain", "sweep", cfg, "optim.lr=0.001,0.003", "model.hidden=8,12",
            "train.epochs=1", "model.layers=1", "batch.batch_frames=800", "--out", out]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(row["optim.lr"], row["model.hidden"]) for row in rows] == [
        ("0.001", "8"), ("0.001", "12"), ("0.003", "8"), ("0.003", "12")]
    for row in rows:
        run = out / row["run"]
        assert row["status"] == "finished" and row["epochs_done"] == "1"
        assert float(row["best_val_ler"]) == pytest.approx(min(val_lers(run)))
        cfg_text = (run / "config.toml").read_text()
        assert f"lr = {row['optim.lr']}" in cfg_text and f"hidden = {row['model.hidden']}" \
            in cfg_text
    md = (out / "results.md").read_text()
    assert sum(ln.startswith("| 0") for ln in md.splitlines()) == 4 and "**" in md
    assert len(list_runs(out).splitlines()) == 1 + 4
    again = run_cli(*args)  # a second time: every run is already finished
    assert again.returncode == 0 and again.stderr.count("already finished") == 4


def test_sweep_print_and_bad_value(synth_pair, tmp_path):
    cfg = tiny_config(tmp_path, *synth_pair)
    r = run_cli("rnntrain", "sweep", cfg, "optim.lr=0.001,0.003", "model.hidden=8,16",
                "--print", "--out", tmp_path / "p", "--launcher", "mpiexec -n 4")
    assert r.returncode == 0, r.stderr
    cmds = [shlex.split(ln) for ln in r.stdout.splitlines()]
    assert len(cmds) == 4 and not (tmp_path / "p").exists()
    for c in cmds:
        assert c[:6] == ["mpiexec", "-n", "4", "rnntrain", "train", str(cfg)]
        assert c[-1].startswith(f"run.dir={tmp_path / 'p'}/")
        load_config(cfg, c[6:])  # each printed command is a valid configuration
    bad = run_cli("rnntrain", "sweep", cfg, "model.hidden=8,big", "--out", tmp_path / "b")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "model.hidden" in bad.stderr and not (tmp_path / "b").exists()
