"""The run folder and the typed checkpoint record (issue #29).

- A checkpoint written by the code before the record existed (tests/data/ckpt_format1.pt,
  written by tests/data/make_old_checkpoint.py at commit d578050) still loads, resumes and
  transcribes: its log-probabilities are the ones that code recorded.
- One builder: ``rnntrain eval``'s loader and the Python API build the same network.
- The run folder hands out every path; "checkpoints" is spelled in one place.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rnntrain
from rnntrain.errors import UserError
from rnntrain.run import checkpoint as ckpt
from rnntrain.artifact.runfolder import RunFolder
from tests.conftest import ROOT, run_cli, train_here

DATA = ROOT / "tests" / "data"
OLD = DATA / "ckpt_format1.pt"
sys.path.insert(0, str(DATA))
import make_old_checkpoint as old  # noqa: E402  (the generator: its data and input)


@pytest.fixture(scope="module")
def old_data(tmp_path_factory):
    """The synthetic file the old checkpoint was trained on (same generator and seed)."""
    from data_tools.synth import write_synth
    d = tmp_path_factory.mktemp("old")
    write_synth(str(d / "train.nc"), **old.DATA)
    return d / "train.nc"


def test_old_checkpoint_reads_into_the_card_and_parts():
    raw = torch.load(OLD, weights_only=True)
    ck = ckpt.read(OLD, training=True)
    assert ck.card.labels == raw["labels"] and ck.card.input_size == 3
    assert ck.card.frame_size == raw["frame_size"] == 3 and ck.card.image_height == 0
    assert ck.card.config == raw["config"]
    for name in ("model", "optim", "state"):
        assert name in ck.parts
    for k, v in raw["model"].items():
        assert torch.equal(ck.parts["model"][k], v)
    assert ck.state().position() == (1, 0, 5)  # 1 epoch of 5 steps


def test_old_checkpoint_transcribes_as_the_old_code_did(tmp_path):
    want = np.load(DATA / "ckpt_format1_logprobs.npy")
    m = rnntrain.load(OLD)
    got = m.log_probs(old.frames())
    assert got.shape == want.shape == (30, 5)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.save(tmp_path / "x.npy", old.frames())
    p = run_cli("rnntrain", "transcribe", OLD, tmp_path / "x.npy")
    assert p.returncode == 0, p.stderr[-2000:]
    # best path of the recorded log-probs, decoded here: argmax, collapse, drop the blank
    best = want.argmax(1)
    hyp = [int(k) for i, k in enumerate(best) if k != 4 and (i == 0 or k != best[i - 1])]
    assert p.stdout.split("\t")[1].strip() == " ".join(m.labels[k] for k in hyp)


def test_old_checkpoint_resumes(tmp_path, old_data):
    over = [f"data.train={old_data}", *old.OVERRIDES, "train.epochs=2",
            f"run.dir={tmp_path / 'run'}"]
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    run = RunFolder(train(load_config(None, over), None, over, resume=str(OLD)))
    assert f"resumed from {OLD} at epoch 2 step 5" in run.log.read_text()
    new = ckpt.read(run.last, training=True)
    assert new.state().position() == (2, 0, 10)
    before = ckpt.read(OLD).parts["model"]
    assert any(not torch.equal(new.parts["model"][k], before[k]) for k in before)
    assert new.card.labels == ckpt.read(OLD).card.labels
    # the optimizer's moments came from the file: Adam's step counts went on from 5
    steps = {int(s["step"]) for s in new.parts["optim"]["state"].values()}
    assert steps == {10}


def test_one_builder_for_eval_and_the_python_api(old_data):
    from rnntrain.cli import _load_for_eval
    cfg, ds, net, _ = _load_for_eval(str(OLD), str(old_data), "cpu")
    api = rnntrain.load(OLD)
    a, b = net.state_dict(), api.net.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.from_numpy(old.frames())[:, None]
    with torch.no_grad():
        lp = net.eval()(x, torch.tensor([30]))[0][:, 0].numpy()
    np.testing.assert_array_equal(lp, api.log_probs(old.frames()))


def test_eval_of_the_old_checkpoint(old_data):
    p = run_cli("rnntrain", "eval", OLD, old_data, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["seqs"] == old.DATA["num_seqs"]


def test_a_card_without_frame_size_derives_it():
    """Checkpoints older than the frame_size entry: derived as before (2-D: height x
    inputPattSize; column layouts and plain features: inputPattSize)."""
    base = {"labels": ["a"], "input_size": 3, "config": {}}
    assert ckpt.ModelCard.from_record(base, "x").frame_size == 3
    assert ckpt.ModelCard.from_record({**base, "image_height": 8}, "x").frame_size == 24
    cols = {**base, "input_size": 16, "image_height": 8,
            "image_frontend": json.dumps({"layout": "columns"})}
    assert ckpt.ModelCard.from_record(cols, "x").frame_size == 16


@pytest.mark.parametrize("bad, why", [({"labels": "abc"}, "labels"),
                                      ({"input_size": "3"}, "input_size"),
                                      ({"config": None}, "config")])
def test_a_mistyped_card_is_one_line(tmp_path, bad, why):
    raw = torch.load(OLD, weights_only=True)
    ckpt.save_atomic({**raw, **bad}, tmp_path / "c.pt")
    with pytest.raises(UserError, match=f"wrong type: {why}"):
        ckpt.read(tmp_path / "c.pt")


def test_run_folder_paths_and_pruning(tmp_path):
    run = RunFolder(tmp_path / "r")
    assert RunFolder.of(run.checkpoints) == run == RunFolder.of(run.root)
    assert run.step(7).name == "step-00000007.pt" and run.best.parent == run.checkpoints
    assert run.existing_run() is None and run.model_checkpoint() is None
    run.make()
    for n in (3, 10, 7):
        run.step(n).write_bytes(b"x")
    (run.checkpoints / ".step-00000011.pt.tmp123").write_bytes(b"half")
    assert run.step_checkpoints() == [run.step(3), run.step(7), run.step(10)]
    run.prune(2)
    assert run.step_checkpoints() == [run.step(7), run.step(10)]
    assert "already holds checkpoints" in run.existing_run()
    run.remove_stale_temps()
    assert sorted(p.name for p in run.checkpoints.iterdir()) == [
        "step-00000007.pt", "step-00000010.pt"]
    run.last.write_bytes(b"x")
    assert run.model_checkpoint() == run.last


def test_the_folder_name_is_spelled_once():
    """Every other module asks RunFolder for the checkpoints folder."""
    hits = [f for f in (ROOT / "rnntrain").rglob("*.py")
            if re.search(r"""["']checkpoints["']""", f.read_text())]
    assert hits == [ROOT / "rnntrain" / "artifact" / "runfolder.py"]


def test_training_writes_through_the_run_folder(tmp_path, old_data):
    over = [f"data.train={old_data}", *old.OVERRIDES, f"run.dir={tmp_path / 'run'}"]
    run = RunFolder(train_here(None, *over))
    for p in (run.config, run.status, run.metrics, run.log, run.lock, run.best, run.last):
        assert p.is_file(), p
    ck = ckpt.read(run.best, training=True)
    from rnntrain.data.dataset import Dataset
    assert ck.card == ckpt.ModelCard.of_data(Dataset.open(str(old_data)), ck.card.config)
