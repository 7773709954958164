"""Fine-tuning (train.init_from, init_alphabet, freeze) and weight averaging (rnntrain
average, train.average) on the committed tiny checkpoint (tests/data/ckpt_format1.pt:
labels L00..L03, 3 inputs, 1 BLSTM layer of 4 units)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rnntrain.config import load_config
from rnntrain.data.dataset import Dataset
from rnntrain.data.ncdata import read_file, write_file
from rnntrain.errors import UserError
from rnntrain.run import checkpoint as ckpt
from rnntrain.run import finetune
from rnntrain.run.average import WeightAverage
from rnntrain.artifact.runfolder import RunFolder
from tests.conftest import ROOT, run_cli, train_here

DATA = ROOT / "tests" / "data"
OLD = DATA / "ckpt_format1.pt"
sys.path.insert(0, str(DATA))
import make_old_checkpoint as old  # noqa: E402

# the new data's alphabet: L02, L00 and L01 known (in another order), Z9 new, L03 gone
RENAME = {"L00": "L00", "L01": "L01", "L02": "L02", "L03": "Z9"}
NEW_LABELS = ["L02", "L00", "Z9", "L01"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """(the old checkpoint's data, the same sequences with another alphabet, a file with
    4 inputs per frame)."""
    from data_tools.synth import write_synth
    d = tmp_path_factory.mktemp("ft")
    write_synth(str(d / "same.nc"), **old.DATA)
    h, seqs = read_file(d / "same.nc")
    targets = [" ".join(RENAME[h.labels[k]] for k in t) for t in h.targets]
    write_file(d / "new.nc", seqs, targets, NEW_LABELS)
    write_file(d / "wide.nc", [np.concatenate([s, s[:, :1]], 1) for s in seqs], targets,
               NEW_LABELS)
    return d / "same.nc", d / "new.nc", d / "wide.nc"


def overrides(train, tmp, *more):
    return [f"data.train={train}", *old.OVERRIDES, f"run.dir={tmp}", *more]


def initialised(train, mode: str):
    """The fine-tuned network right after initialisation (as train() builds it)."""
    from rnntrain.compute.model import build_model
    cfg = load_config(None, overrides(train, "x", f"train.init_from={OLD}",
                                      f"train.init_alphabet={mode}"))
    ds = Dataset.open(str(train))
    labels = finetune.alphabet(mode, ckpt.read(OLD).card.labels, ds.labels, OLD)
    torch.manual_seed(1)
    net = build_model(cfg.model, ds.frame_size, len(labels))
    finetune.start_from(cfg, net, labels, ds)
    return net, labels


@pytest.mark.parametrize("mode, want", [("merge", NEW_LABELS + ["L03"]),
                                        ("replace", NEW_LABELS)])
def test_shared_labels_keep_their_rows_exactly(data, mode, want):
    net, labels = initialised(data[1], mode)
    assert labels == want
    src = ckpt.read(OLD).parts["model"]
    src_labels = ckpt.read(OLD).card.labels
    got = net.state_dict()
    for key in src:
        if not key.startswith("out."):
            assert torch.equal(got[key], src[key]), key
    for i, lb in enumerate(labels + ["<blank>"]):
        j = len(src_labels) if lb == "<blank>" else src_labels.index(lb) \
            if lb in src_labels else None
        if j is not None:
            assert torch.equal(got["out.weight"][i], src["out.weight"][j]), lb
            assert torch.equal(got["out.bias"][i], src["out.bias"][j]), lb
    assert got["out.weight"].shape[0] == len(want) + 1  # the blank last


@pytest.mark.parametrize("mode", ["merge", "replace"])
def test_fine_tuning_trains_and_its_model_reads_the_data(tmp_path, data, mode):
    run = RunFolder(train_here(None, *overrides(data[1], tmp_path / "r",
                                                f"train.init_from={OLD}",
                                                f"train.init_alphabet={mode}")))
    assert f"initialised from {OLD}" in run.log.read_text()
    ck = ckpt.read(run.last, training=True)
    assert ck.card.init_from == str(OLD) and ck.state().position() == (1, 0, 5)
    assert ck.card.labels == (NEW_LABELS + ["L03"] if mode == "merge" else NEW_LABELS)
    start, _ = initialised(data[1], mode)
    assert not torch.equal(ck.parts["model"]["out.weight"], start.state_dict()["out.weight"])
    p = run_cli("rnntrain", "eval", run.root, data[1], "--json")
    assert p.returncode == 0, p.stderr[-2000:]


@pytest.mark.parametrize("lr, start_is_best", [(5.0, True), (0.05, None)])
def test_val_at_start_lets_the_starting_weights_compete_for_best(tmp_path, data, lr,
                                                                  start_is_best):
    """train.val_at_start (rnntrain finetune sets it): the starting weights are scored
    before step 1, as "epoch 0", with the LER `rnntrain eval` gives the source model on
    the same file (a real subprocess); a fine-tuning that only gets worse (Adam at lr 5
    throws the weights about) ends with best.pt = the starting weights, exactly."""
    import json
    run = RunFolder(train_here(None, *overrides(data[0], tmp_path / "r", f"train.init_from={OLD}",
                                                f"data.val={data[0]}", "train.epochs=2",
                                                "train.val_at_start=true", f"optim.lr={lr}")))
    recs = [json.loads(ln) for ln in run.metrics.read_text().splitlines()]
    val = [r for r in recs if r.get("split") == "val"]
    assert [r["epoch"] for r in val] == [-1, 0, 1] and val[0]["step"] == 0
    p = run_cli("rnntrain", "eval", OLD, data[0], "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert val[0]["ler"] == pytest.approx(json.loads(p.stdout)["ler"], abs=1e-12)
    best = ckpt.read(run.best, training=True)
    start, _ = initialised(data[0], "keep")
    same = all(torch.equal(v, best.parts["model"][k]) for k, v in start.state_dict().items())
    worse = all((r["ler"], r["loss"]) >= (val[0]["ler"], val[0]["loss"]) for r in val[1:])
    assert same == worse   # best.pt is the start exactly when no epoch beat it
    if start_is_best:
        assert same and best.state().step == 0
        assert "(the starting weights)" in run.log.read_text().splitlines()[-1]


def test_keep_refuses_another_alphabet_naming_the_difference(tmp_path, data):
    p = run_cli("rnntrain", "train", *overrides(data[1], tmp_path / "r",
                                                f"train.init_from={OLD}"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "only in the data: 1 ('Z9')" in line and "only in the model: 1 ('L03')" in line


def test_input_side_must_match(tmp_path, data):
    p = run_cli("rnntrain", "train", *overrides(data[2], tmp_path / "r",
                                                f"train.init_from={OLD}",
                                                "train.init_alphabet=replace"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "inputPattSize 3 differs from" in line and "(4)" in line


def test_frozen_layers_stay_the_checkpoints(tmp_path, data):
    run = RunFolder(train_here(None, *overrides(data[0], tmp_path / "r",
                                                f"train.init_from={OLD}",
                                                'train.freeze=["lstm:1"]')))
    got, src = ckpt.read(run.last).parts["model"], ckpt.read(OLD).parts["model"]
    for k in src:
        assert torch.equal(got[k], src[k]) == k.startswith("rnns.0."), k
    with pytest.raises(UserError, match="has 1 LSTM layer"):
        finetune.frozen_parameters(ckpt.load_model(OLD)[0], ["lstm:2"])
    with pytest.raises(UserError, match="no front end"):
        finetune.frozen_parameters(ckpt.load_model(OLD)[0], ["frontend"])


# ---------------------------------------------------------------- averaging

def test_average_of_two_copies_is_the_checkpoint(tmp_path):
    p = run_cli("rnntrain", "average", OLD, OLD, "--out", tmp_path / "a.pt")
    assert p.returncode == 0, p.stderr
    got, want = ckpt.read(tmp_path / "a.pt"), ckpt.read(OLD)
    assert got.card.labels == want.card.labels
    for k, v in want.parts["model"].items():
        assert torch.equal(got.parts["model"][k], v), k


def test_average_is_the_mean_and_refuses_other_shapes(tmp_path, data):
    from rnntrain.run.average import average_checkpoints
    run = RunFolder(train_here(None, *overrides(data[0], tmp_path / "r",
                                                f"train.init_from={OLD}")))
    out = average_checkpoints([OLD, run.last], tmp_path / "m.pt").parts["model"]
    a, b = ckpt.read(OLD).parts["model"], ckpt.read(run.last).parts["model"]
    for k in a:  # the mean in float64, rounded once to float32
        want = ((a[k].double() + b[k].double()) / 2).float()
        assert torch.equal(out[k], want), k
    wide = RunFolder(train_here(None, *overrides(data[0], tmp_path / "w", "model.hidden=5")))
    p = run_cli("rnntrain", "average", OLD, wide.last, "--out", tmp_path / "x.pt")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "rnns.0.weight_ih_l0 has shape (20, 3)" in p.stderr and "(16, 3)" in p.stderr
    assert not (tmp_path / "x.pt").exists()


def test_weight_average_follows_its_formula():
    net = ckpt.load_model(OLD)[0]
    ema, last = WeightAverage(net, "ema", decay=0.9), WeightAverage(net, "last", last=2)
    key = "out.weight"
    want_ema = net.state_dict()[key].double().clone()
    seen = []
    for n in range(4):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(0.01 * (n + 1))
        ema.step()
        d = min(0.9, (1 + n) / (10 + n))
        want_ema = d * want_ema + (1 - d) * net.state_dict()[key].double()
        last.end_epoch()
        seen.append(net.state_dict()[key].clone())
    assert torch.allclose(ema.weights()[key].double(), want_ema, atol=1e-6)
    assert torch.equal(last.weights()[key], (seen[-2] + seen[-1]) / 2)
    again = WeightAverage(net, "ema")
    again.load_state_dict(ema.state_dict())
    assert torch.equal(again.weights()[key], ema.weights()[key]) and again.count == 4


@pytest.mark.parametrize("kind,threads", [("ema", 1), ("last", 1), ("ema", 2)])
def test_training_average_resumes_exactly(tmp_path, data, kind, threads):
    """2 epochs straight vs 1 epoch, then resumed to 2: the same average, the same
    best.pt; inference reads the average. (2 worker threads: each step's average is applied
    during the next step, ``StepRunner``; a checkpoint holds it applied.)"""
    ov = [f"train.average={kind}", "train.average_last=2", f"data.val={data[0]}",
          f"compute.threads={threads}"]
    straight = RunFolder(train_here(None, *overrides(data[0], tmp_path / "s", *ov,
                                                     "train.epochs=2")))
    first = RunFolder(train_here(None, *overrides(data[0], tmp_path / "p", *ov)))
    from rnntrain.run.train import train
    over = overrides(data[0], tmp_path / "p", *ov, "train.epochs=2")
    train(load_config(None, over), None, over, resume="auto")
    a, b = ckpt.read(straight.last), ckpt.read(first.last)
    assert a.card.weights == "average" and a.parts["average"]["count"] >= 2
    for k, v in a.parts["average"]["avg"].items():
        assert torch.equal(v, b.parts["average"]["avg"][k]), k
    net = ckpt.load_model(straight.last)[0]
    for k, v in a.parts["average"]["avg"].items():
        assert torch.equal(net.state_dict()[k], v), k


def test_a_deferred_average_step_equals_the_immediate_one():
    """``step_later`` (applied by ``flush`` or by any read of the average, before the
    weights change again) gives bit for bit the average of ``step`` after each change."""
    net = ckpt.load_model(OLD)[0]
    now, later = WeightAverage(net, "ema", decay=0.8), WeightAverage(net, "ema", decay=0.8)
    reads = [lambda: later.flush(), lambda: later.weights(), lambda: later.state_dict(),
             lambda: later.swap_out(later.swap_in()), lambda: later.end_epoch(),
             lambda: (later.step_later(), now.step())]  # a second step on the same weights
    for n, read in enumerate(reads * 2):
        with torch.no_grad():
            for p in net.parameters():
                p.mul_(1.01).add_(0.003 * (n + 1))
        now.step()
        later.step_later()
        assert not torch.equal(now.avg["out.weight"], later.avg["out.weight"])  # pending
        read()
        later.flush()
        for k in now.avg:
            assert torch.equal(now.avg[k], later.avg[k]), (n, k)
    assert later.state_dict()["count"] == now.count == 14


def test_training_applies_the_average_later_with_the_same_bits(tmp_path, data, monkeypatch):
    """Two CPU workers: the runner applies each step's average during the next step
    (``StepRunner._average_later``); a run that applies it right after each step (the
    serial reference) ends with the same average and weights, bit for bit."""
    from rnntrain.run.step import StepRunner
    init, runners = StepRunner.__init__, []

    def record(self, *a, **k):
        init(self, *a, **k)
        runners.append(self)
        if immediate:
            self._average_later = False
    monkeypatch.setattr(StepRunner, "__init__", record)
    ov = ["train.average=ema", "train.ema_decay=0.7", f"data.val={data[0]}",
          "train.epochs=2", "compute.threads=2"]
    out = {}
    for immediate in (False, True):
        run = RunFolder(train_here(None, *overrides(data[0], tmp_path / str(immediate), *ov)))
        assert runners[-1].averager is not None and runners[-1].workers == 2
        assert runners[-1]._average_later == (not immediate)
        out[immediate] = ckpt.read(run.last), ckpt.read(run.best)
    for a, b in zip(out[False], out[True]):
        assert a.parts["average"]["count"] == b.parts["average"]["count"] >= 4
        for part in ("model", "average"):
            x = a.parts[part]["avg"] if part == "average" else a.parts[part]
            y = b.parts[part]["avg"] if part == "average" else b.parts[part]
            for k in x:
                assert torch.equal(x[k], y[k]), (part, k)


def test_fine_tuning_starts_from_the_weights_validation_scored(tmp_path, data):
    """A run that kept a weight average (validation scored the average): fine-tuning from
    it starts from the average, as transcribe would use it, not the raw trained weights."""
    from rnntrain.compute.model import build_model
    src = RunFolder(train_here(None, *overrides(data[0], tmp_path / "s", "train.average=ema",
                                                "train.ema_decay=0.5",
                                                f"data.val={data[0]}")))
    ck = ckpt.read(src.best)
    assert ck.card.weights == "average"
    avg, raw = ck.parts["average"]["avg"], ck.parts["model"]
    assert any(not torch.equal(avg[k], raw[k]) for k in avg)  # the two differ
    cfg = load_config(None, overrides(data[0], "x", f"train.init_from={src.best}"))
    ds = Dataset.open(str(data[0]))
    net = build_model(cfg.model, ds.frame_size, len(ck.card.labels))
    finetune.start_from(cfg, net, list(ck.card.labels), ds)
    got = net.state_dict()
    for k, v in ck.inference_weights().items():
        assert torch.equal(got[k], v), k
