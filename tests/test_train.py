"""End to end: train from a config, overfit a handful of sequences, eval and decode."""
from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
import torch

from data_tools.synth import make_sequences, label_names
from rnntrain.data import ncdata
from rnntrain.config import load_config
from rnntrain.data.dataset import Dataset
from rnntrain.data.plan import make_plan, padding_ratio
from rnntrain.run.train import train
from tests.conftest import run_cli


def _tiny(tmp_path, n=8, seed=1, name="tiny.nc", too_short=False):
    names = label_names(5)
    seqs = list(make_sequences(n, 5, 6, seed, mean_labels=3, noise=0.3))
    frames = [x for x, _ in seqs]
    targets = [" ".join(names[i] for i in t) for _, t in seqs]
    tags = [f"utt{i}" for i in range(n)]
    if too_short:  # 2 frames cannot carry 3 labels
        frames.append(np.zeros((2, 6), np.float32))
        targets.append("L00 L01 L02")
        tags.append("short_one")
    path = tmp_path / name
    ncdata.write_file(path, frames, targets, names, tags)
    return path


def _cfg(tmp_path, data, run="run", **over):
    ov = [f"data.train={json.dumps(str(data))}", f"data.val={json.dumps(str(data))}",
          "model.layers=1", "model.hidden=48", "optim.lr=0.03", "train.epochs=70",
          "batch.batch_frames=60", "log.every_steps=5", "compute.threads=1",
          f"run.dir={json.dumps(str(tmp_path / run))}"]
    ov += [f"{k.replace('__', '.')}={v}" for k, v in over.items()]
    return load_config(None, ov), ov


def test_overfits_a_handful_to_ler_zero(tmp_path):
    data = _tiny(tmp_path, too_short=True)
    cfg, _ = _cfg(tmp_path, data, data__test=json.dumps(str(data)))
    run = train(cfg)
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    test = [r for r in recs if r["split"] == "test"]
    assert len(test) == 1 and test[0]["ler"] == 0.0 and test[0]["skipped"] == 1
    recs = [r for r in recs if r["split"] != "test"]
    val = [r for r in recs if r["split"] == "val"]
    tr = [r for r in recs if r["split"] == "train"]
    assert val[-1]["ler"] == 0.0, val[-1]
    assert val[-1]["skipped"] == 1 and val[-1]["seqs"] == 8  # the short one skipped, counted
    for r in tr + val:
        assert {"split", "epoch", "step", "loss", "ler"} <= r.keys() and np.isfinite(r["loss"])
    assert all("frames_per_s" in r for r in tr)
    assert tr[-1]["loss"] < tr[0]["loss"] / 5
    assert "short_one" in (run / "train.log").read_text()
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["model"]["hidden"] == 48
    for name in ("best.pt", "last.pt"):
        assert (run / "checkpoints" / name).is_file()
    # eval and decode through the CLI, as a user would
    r = run_cli("rnntrain", "eval", run / "checkpoints" / "best.pt", data, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ler"] == 0.0 and out["seqs"] == 8 and out["skipped"] == 1
    r = run_cli("rnntrain", "decode", run / "checkpoints" / "best.pt", data, "--beam", "4")
    assert r.returncode == 0, r.stderr
    lines = dict(l.split("\t") for l in r.stdout.splitlines())
    h = ncdata.read_header(data)
    for i, tag in enumerate(h.tags[:8]):
        assert lines[tag] == " ".join(h.labels[k] for k in h.targets[i])
    # decoding needs no target: the sequence too short for its own is decoded too
    assert "short_one" in lines and not lines["short_one"].startswith("<")


def _final_weights(tmp_path, run, **over):
    data = _tiny(tmp_path, n=24, seed=3, name="det.nc")
    cfg, _ = _cfg(tmp_path, data, run=run, train__epochs=2, train__batch_frames=150,
                  train__input_noise=0.1, **over)
    out = train(cfg)
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_same_seed_same_weights_whatever_the_thread_timing(tmp_path):
    # two workers race for the tasks differently in every run; the task gradients are
    # reduced in task order whoever computed them, so the weights are bit-identical
    a = _final_weights(tmp_path, "a", train__threads=2)
    b = _final_weights(tmp_path, "b", train__threads=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = _final_weights(tmp_path, "c", train__threads=2, train__seed=7)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_plan_groups_by_length(tmp_path):
    from data_tools.synth import write_synth
    p = tmp_path / "s.nc"
    write_synth(str(p), num_seqs=600, num_labels=5, input_size=4, seed=4)
    ds = Dataset.open(str(p))
    keep = ds.feasible()
    steps = make_plan(ds, keep, 3000, seed=1, epoch=0)
    ids = sorted(s for st in steps for s in st.seqs)
    assert ids == list(np.flatnonzero(keep))  # every sequence exactly once
    grouped = padding_ratio(steps, ds.lengths)
    rng = np.random.default_rng(0)  # random batches of the same sizes, for comparison
    perm = rng.permutation(np.flatnonzero(keep))
    sizes = np.cumsum([len(st.seqs) for st in steps])[:-1]
    rand = padding_ratio([type(steps[0])(0, tuple(b)) for b in np.split(perm, sizes)], ds.lengths)
    assert grouped < 1.2 and rand > 1.5, (grouped, rand)
    for st in steps:
        assert len(st.seqs) * ds.lengths[list(st.seqs)].max() <= 3000 or len(st.seqs) == 1
    assert make_plan(ds, keep, 3000, seed=1, epoch=0) == steps
    assert make_plan(ds, keep, 3000, seed=1, epoch=1) != steps


def test_cli_train_bad_data_is_one_line(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(f'[data]\ntrain = "{tmp_path}/missing.nc"\n')
    r = run_cli("rnntrain", "train", p, f"run.dir={json.dumps(str(tmp_path / 'r'))}")
    assert r.returncode == 2 and "missing.nc: data file not found" in r.stderr
    assert "Traceback" not in r.stderr


def test_trains_on_a_file_written_by_another_tool(tmp_path):
    """netCDF-4, vlen strings, int16 inputs, seqDims only, another frames dimension name."""
    import netCDF4
    names = label_names(3)
    seqs = list(make_sequences(12, 3, 4, 9, mean_labels=2, noise=0.2))
    path = tmp_path / "foreign.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("numSeqs", len(seqs))
        ds.createDimension("frames", sum(len(x) for x, _ in seqs))
        ds.createDimension("inputPattSize", 4)
        ds.createDimension("numLabels", 3)
        ds.createDimension("numDims", 1)
        ds.createVariable("inputs", "i2", ("frames", "inputPattSize"))[:] = \
            np.round(np.concatenate([x for x, _ in seqs]) * 100)
        ds.createVariable("seqDims", "i4", ("numSeqs", "numDims"))[:] = \
            np.array([[len(x)] for x, _ in seqs])
        lab = ds.createVariable("labels", str, ("numLabels",))
        for i, n in enumerate(names):
            lab[i] = n
        tgt = ds.createVariable("targetStrings", str, ("numSeqs",))
        for i, (_, t) in enumerate(seqs):
            tgt[i] = " ".join(names[k] for k in t)
    cfg, _ = _cfg(tmp_path, path, run="foreign", train__epochs=2)
    run = train(cfg)
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["split"] == "val" and recs[-1]["seqs"] == 12 and np.isfinite(recs[-1]["loss"])


def test_cpu_update_is_fused_and_an_unfused_checkpoint_resumes_unfused(tmp_path):
    """On the CPU the trainer steps a fused optimizer (one kernel per update, docs/threads.md
    "The update"); a checkpoint written before that (its groups say ``fused = None``)
    resumes with the per-tensor update it was trained with, so it repeats its own run."""
    data = _tiny(tmp_path, n=12, seed=2, name="fused.nc")
    cfg, ov = _cfg(tmp_path, data, run="f", train__epochs=1, batch__batch_frames=150)
    out = train(cfg)
    ck = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert all(g["fused"] is True for g in ck["optim"]["param_groups"])
    for g in ck["optim"]["param_groups"]:   # as a checkpoint of the per-tensor update
        g["fused"] = None
    torch.save(ck, out / "checkpoints" / "last.pt")
    cfg2, _ = _cfg(tmp_path, data, run="f", train__epochs=2, batch__batch_frames=150)
    train(cfg2, overrides=ov, resume="auto")
    ck2 = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ck2["state"]["epoch"] == 2
    assert all(g["fused"] is None for g in ck2["optim"]["param_groups"])
    assert int(ck2["optim"]["state"][0]["step"]) > int(ck["optim"]["state"][0]["step"])


def test_blank_bias_adds_to_the_blank_output_alone(tmp_path):
    """model.blank_bias: a run starts from torch's initialisation under its seed with the
    value added to the output layer's blank bias and nothing else (0: exactly torch's).
    A learning rate of 1e-30 leaves every fp32 weight of the saved model as it started."""
    from rnntrain.compute.model import build_model
    data = _tiny(tmp_path, n=8, seed=4, name="bb.nc")
    for bias in (0.0, 2.5):
        cfg, _ = _cfg(tmp_path, data, run=f"bb{bias}", train__epochs=1, optim__lr=1e-30,
                      model__blank_bias=bias)
        saved = torch.load(train(cfg) / "checkpoints" / "last.pt",
                           weights_only=True)["model"]
        torch.manual_seed(cfg.train.seed)   # the same draws, built here on their own
        ref = build_model(cfg.model, 6, 5).state_dict()
        assert saved.keys() == ref.keys()
        for k, v in ref.items():
            if k == "out.bias":
                assert torch.equal(saved[k][:5], v[:5])    # the five labels untouched
                assert saved[k][5].item() == pytest.approx(v[5].item() + bias, abs=1e-6)
            else:
                assert torch.equal(saved[k], v), k


def test_a_checkpoint_without_a_newer_model_key_resumes(tmp_path):
    """A checkpoint from an rnntrain that lacked a [model] key (blank_bias here) resumes
    under a config that leaves the key at its default; a real difference still refuses."""
    data = _tiny(tmp_path, n=8, seed=5, name="old.nc")
    cfg, ov = _cfg(tmp_path, data, run="old", train__epochs=1)
    out = train(cfg)
    path = out / "checkpoints" / "last.pt"
    ck = torch.load(path, weights_only=True)
    del ck["config"]["model"]["blank_bias"]   # as the older rnntrain wrote it
    torch.save(ck, path)
    cfg2, _ = _cfg(tmp_path, data, run="old", train__epochs=2, model__blank_bias=1.0)
    from rnntrain.errors import UserError
    with pytest.raises(UserError, match="model section differs.*blank_bias"):
        train(cfg2, overrides=ov, resume="auto")
    cfg2, _ = _cfg(tmp_path, data, run="old", train__epochs=2)
    train(cfg2, overrides=ov, resume="auto")
    assert torch.load(path, weights_only=True)["state"]["epoch"] == 2


@pytest.mark.parametrize("fused", [False, True])
def test_adam_betas_from_the_config_against_numpy_adam(fused):
    """optim.beta1/beta2 reach the update: three fused and unfused Adam steps equal
    Adam's formula written out in numpy; the defaults are torch's (0.9, 0.999)."""
    from rnntrain.compute.optim import build_optimizer
    assert build_optimizer(load_config(None, ["data.train=x.nc"]).optim,
                           [torch.nn.Parameter(torch.zeros(1))]).defaults["betas"] == (0.9, 0.999)
    ocfg = load_config(None, ["data.train=x.nc", "optim.lr=0.1", "optim.beta1=0.5", "optim.beta2=0.8"]).optim
    w0 = np.array([0.3, -1.2, 2.0], np.float64)
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
    opt = build_optimizer(ocfg, [p], fused=fused)
    grads = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -4.0], [-1.0, 2.5, 0.2]])
    w, m, v = w0.copy(), np.zeros(3), np.zeros(3)
    for t, g in enumerate(grads, 1):
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        m = 0.5 * m + 0.5 * g
        v = 0.8 * v + 0.2 * g * g
        w -= 0.1 * (m / (1 - 0.5 ** t)) / (np.sqrt(v / (1 - 0.8 ** t)) + 1e-8)
    np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-5, atol=1e-6)
