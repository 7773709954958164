"""The command line as a user meets it: overrides and options in any order, --resume that
never swallows an override, values the parser refuses, help with defaults, a quiet exit on
a closed pipe, resuming finished runs and requeued jobs, plain progress lines without a
terminal, TensorBoard event files, and torch-free data commands."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from rnntrain import cli
from rnntrain.cli_args import split_overrides, take_resume
from rnntrain.config import section_names
from rnntrain.errors import UserError
from tests.conftest import ROOT, run_cli, run_cli_batch, train_here

SECTIONS = section_names()


def _prepared(*argv):
    return cli._prepare(["train", *argv])


def test_overrides_and_options_in_any_order(tmp_path):
    argv, ov, resume = _prepared("--trace", "t.json", "run.dir=x", "c.toml", "--train.epochs",
                                 "3", "--optim.lr=0.1", "model.hidden=4")
    assert ov == ["run.dir=x", "train.epochs=3", "optim.lr=0.1", "model.hidden=4"]
    args = cli.build_parser().parse_args(argv)
    assert (args.config, args.trace, resume) == ("c.toml", "t.json", None)
    # a negative value after a spaced key is the key's value, not an option
    assert split_overrides(["--optim.lr", "-1"], SECTIONS)[1] == ["optim.lr=-1"]
    # an unknown section with '=' stays an override (the config names the valid sections)
    assert split_overrides(["trian.epochs=3"], SECTIONS)[1] == ["trian.epochs=3"]


def test_resume_takes_only_what_it_can_use(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("")
    (tmp_path / "last.pt").write_bytes(b"")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert take_resume(["--resume", "run.dir=x"]) == (["run.dir=x"], "auto")
    assert take_resume(["--resume", "c.toml"]) == (["c.toml"], "auto")
    assert take_resume(["--resume"]) == ([], "auto")
    assert take_resume(["--resume", "last.pt", "c.toml"]) == (["c.toml"], "last.pt")
    assert take_resume(["--resume", "if-any"]) == ([], "if-any")
    # a word that is no existing path: a missing run folder, said so (it used to become
    # the config file, or "unrecognized arguments"); --resum is not silently --resume
    with pytest.raises(UserError, match="--resume runs/nope: no such run folder"):
        take_resume(["--resume", "runs/nope"])
    for typo in (["--resum"], ["--resu", "auto"], ["--resum=x"]):
        with pytest.raises(UserError, match="did you mean --resume"):
            take_resume(typo)
    assert take_resume(["--resume=nothing-here.pt"]) == ([], "nothing-here.pt")
    with pytest.raises(ValueError, match="nope.pt: checkpoint not found"):
        take_resume(["--resume", "nope.pt"])
    argv, ov, resume = _prepared("--resume", "run.dir=x", "c.toml")
    assert (ov, resume, cli.build_parser().parse_args(argv).config) == (["run.dir=x"], "auto",
                                                                         "c.toml")
    # a run folder (or its checkpoints/) means auto in that folder
    from rnntrain.cli import resolve_resume
    assert resolve_resume("run/checkpoints", []) == ("auto", ["run.dir=run"])
    with pytest.raises(ValueError, match="names another"):
        resolve_resume("run", ["run.dir=other"])


@pytest.mark.parametrize("argv", [["eval", "c.pt", "d.nc", "--beam", "-1"],
                                  ["decode", "c.pt", "d.nc", "--batch-frames", "-5"],
                                  ["eval", "c.pt", "d.nc", "--beam", "two"]])
def test_impossible_numbers_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert ("must be >= 0" in err or "must be between 0 and" in err
            or "is not an integer" in err), err


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


@pytest.mark.parametrize("module", ["rnntrain.cli", "data_tools.cli"])
def test_every_option_has_help_and_shows_its_default(module):
    import importlib
    parser = importlib.import_module(module).build_parser()
    for name, sub in _subparsers(parser):
        assert sub.format_help()  # renders (a stray % in a help text would raise here)
        fmt = sub._get_formatter()
        for a in sub._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"{module} {name}: {a.dest} has no help text"
            if a.option_strings and a.default not in (None, False, "", []):
                assert "default" in fmt._get_help_string(a).lower(), f"{name} {a.dest}"
    if module == "rnntrain.cli":
        text = dict(_subparsers(parser))["eval"].format_help()
        assert "(default: 0)" in " ".join(text.split())


def test_version():
    r = run_cli("rnntrain", "--version")
    assert r.returncode == 0 and r.stdout.strip().startswith("rnntrain 0.")


# ---------------------------------------------------------------- end to end (a tiny run)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from data_tools.synth import write_synth
    d = tmp_path_factory.mktemp("tiny")
    write_synth(str(d / "tr.nc"), num_seqs=40, num_labels=4, input_size=5, seed=1)
    write_synth(str(d / "va.nc"), num_seqs=10, num_labels=4, input_size=5, seed=2)
    args = [f"data.train={d / 'tr.nc'}", f"data.val={d / 'va.nc'}", "model.layers=1",
            "model.hidden=8", "batch.batch_frames=600", "compute.threads=1", "log.every_steps=2"]
    return d, args


def _train(*argv, **kw):
    return run_cli("rnntrain", "train", *argv, **kw)


def test_finished_run_resume_and_requeue(tiny):
    d, args = tiny
    run = d / "finished"
    r = _train(*args, f"run.dir={run}", "--resume", "if-any", "--train.epochs", "1",
               "log.tensorboard=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed" not in r.stderr  # if-any with nothing to resume: a fresh run
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "finished" and status["epoch"] == 1
    # non-TTY: no bar redraws, a plain line per metrics record
    assert "\r" not in r.stderr
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_recs = [x for x in recs if x["split"] == "train"]
    lines = [x for x in r.stderr.splitlines() if x.startswith("epoch 1/1 step ")]
    assert len(lines) == len(train_recs) >= 2
    assert lines[-1].startswith(f"epoch 1/1 step {train_recs[-1]['step']}/")
    # TensorBoard: the same scalars as metrics.jsonl, read back with tensorboard's reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for key in ("loss", "ler", "frames_per_s", "compute_s", "data_wait_s", "lr"):
        got = {e.step: e.value for e in acc.Scalars(f"train/{key}")}
        assert got == pytest.approx({x["step"]: x[key] for x in train_recs}, rel=1e-6), key
    assert "train/worker_compute_s/0" in tags
    val = [x for x in recs if x["split"] == "val"]
    assert [(e.step, pytest.approx(e.value, rel=1e-6)) for e in acc.Scalars("val/ler")] == \
        [(x["step"], x["ler"]) for x in val]
    # requeued: the same command resumes; the run is finished, says so, keeps its start
    r = _train(*args, f"run.dir={run}", "--resume", "if-any", "--train.epochs", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"run {run} is finished: 1 of train.epochs=1 epochs done" in r.stderr
    assert "train.epochs=2" in r.stderr  # what to change to train more
    again = json.loads((run / "status.json").read_text())
    assert again["status"] == "finished" and again["started"] == status["started"]
    # training more, resumed: start time kept, the resume recorded
    r = _train(*args, "--resume", f"run.dir={run}", "train.epochs=2")
    assert r.returncode == 0, r.stderr[-3000:]
    more = json.loads((run / "status.json").read_text())
    assert (more["status"], more["epoch"]) == ("finished", 2)
    assert more["started"] == status["started"] and more["resumed"] > status["updated"]


def test_eval_json_schema_and_closed_pipe_and_no_weights_only_advice(tiny, tmp_path):
    import torch
    d, args = tiny
    run = train_here(None, *args, f"run.dir={tmp_path / 'r'}", "train.epochs=1")  # set-up
    ck = run / "checkpoints" / "last.pt"
    # a file with Python objects: refused without torch's weights_only=False advice
    torch.save({"format": 1, "model": {"when": __import__("datetime").date(2020, 1, 1)}},
               tmp_path / "odd.pt")
    plain, beam, odd = run_cli_batch([("rnntrain", "eval", ck, d / "va.nc", "--json"),
                                      ("rnntrain", "eval", ck, d / "va.nc", "--json",
                                       "--beam", "3"),
                                      ("rnntrain", "eval", tmp_path / "odd.pt", d / "va.nc")])
    a, b = json.loads(plain.stdout), json.loads(beam.stdout)
    assert a.keys() == b.keys() and a["beam"] is None and a["beam_width"] == 0
    assert a["best"] == {k: v for k, v in a.items()
                         if k not in ("best", "beam", "beam_width", "out_of_alphabet")}
    assert a["out_of_alphabet"] == b["out_of_alphabet"] == {"lines": 0, "labels": 0}
    assert b["beam"].keys() - {"decoder"} == b["best"].keys()
    assert b["beam_width"] == 3 and a["ler"] == b["ler"] == b["best"]["ler"]
    # `decode ... | head`: the reader goes away before we write
    p = subprocess.Popen([sys.executable, "-m", "rnntrain", "decode", str(ck), str(d / "tr.nc")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert p.returncode == 141 and err == "", err
    r = odd
    assert r.returncode == 2 and "weights_only" not in r.stderr, r.stderr
    assert "refused, since loading them could run code" in r.stderr


def test_tensorboard_per_rank_split(tmp_path):
    """An MPI train record (with per-rank splits) as TensorBoard scalars."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from rnntrain.run.runlog import TensorBoardLog
    tb = TensorBoardLog(tmp_path / "tb")
    tb.add({"split": "train", "step": 7, "loss": 1.5, "worker_compute_s": [0.1, 0.2],
            "ranks": [{"compute_s": 0.3, "comm_s": 0.01}, {"compute_s": 0.4, "comm_s": 0.02}],
            "slowest_rank": 1})
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    got = {t: [(e.step, round(e.value, 6)) for e in acc.Scalars(t)]
           for t in acc.Tags()["scalars"]}
    assert got == {"train/loss": [(7, 1.5)], "train/worker_compute_s/0": [(7, 0.1)],
                   "train/worker_compute_s/1": [(7, 0.2)], "train/slowest_rank": [(7, 1.0)],
                   "train/rank0/compute_s": [(7, 0.3)], "train/rank0/comm_s": [(7, 0.01)],
                   "train/rank1/compute_s": [(7, 0.4)], "train/rank1/comm_s": [(7, 0.02)]}


def test_data_commands_do_not_import_torch(synth_pair, tmp_path):
    for module, *argv in (["data_tools", "inspect", str(synth_pair[0])],
                          ["data_tools", "--help"], ["rnntrain", "runs", str(tmp_path)],
                          ["rnntrain", "init", "--list"]):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", module, *argv],
                           capture_output=True, text=True, cwd=ROOT, timeout=120,
                           env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
        assert r.returncode == 0, r.stderr[-2000:]
        imported = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines()
                    if ln.startswith("import time:")}
        assert "numpy" in imported or module == "rnntrain" or argv == ["--help"]
        assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, argv


def test_finished_note_names_what_to_raise():
    from rnntrain.config import TrainConfig
    from rnntrain.run.state import TrainState
    from rnntrain.run.train import finished_note
    tc = TrainConfig(epochs=3, patience=2)
    over = ["train.epochs=3", "model.hidden=8"]
    note = finished_note(TrainState(epoch=3, since_best=0), tc, "c.toml", over, "runs/x")
    assert note.startswith("run runs/x is finished: 3 of train.epochs=3 epochs done")
    assert note.endswith("rnntrain train c.toml model.hidden=8 run.dir=runs/x --resume "
                         "train.epochs=6")
    note = finished_note(TrainState(epoch=1, since_best=2), tc, None, over, "runs/x")
    assert "stopped early after 2 validations" in note and note.endswith("train.patience=0")
    assert finished_note(TrainState(epoch=1, since_best=1), tc, None, over, "runs/x") is None


def test_help_describes_the_program_and_every_command(capsys):
    """rnntrain --help was cut mid-list (the docstring's first line); runs and report had
    no description."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "Train LSTM-CTC sequence models" in out and "describes each command." in out
    for name in cli.HANDLERS:
        assert f"    {name}" in out, name
    for name in ("runs", "report"):
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        text = capsys.readouterr().out
        paragraphs = [p for p in text.split("\n\n") if p.strip()]
        assert not paragraphs[1].startswith(("positional", "options")), text  # a description
