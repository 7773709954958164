"""Config: TOML + overrides, typed sections, clear errors listing valid keys."""
from __future__ import annotations

import tomllib

import pytest

from rnntrain.config import ConfigError, Config, load_config, to_toml
from tests.conftest import run_cli

REQUIRED = {("data", "train"), ("data", "val"), ("model", "layers"), ("model", "hidden"),
            ("model", "bidirectional"), ("optim", "name"), ("optim", "lr"), ("train", "epochs"),
            ("batch", "batch_frames"), ("train", "seed"), ("run", "dir")}


def test_required_keys_exist():
    cfg = Config()
    for sec, key in REQUIRED:
        assert hasattr(getattr(cfg, sec), key), f"{sec}.{key}"


def test_file_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[data]\ntrain = "a.nc"\n[model]\nhidden = 64\n[optim]\nlr = 0.5\n')
    cfg = load_config(p, ["model.hidden=32", "--optim.name=sgd", "train.epochs=3",
                          "model.bidirectional=false", 'run.dir="x y"'])
    assert (cfg.model.hidden, cfg.optim.name, cfg.optim.lr, cfg.train.epochs) == (32, "sgd", 0.5, 3)
    assert cfg.model.bidirectional is False and cfg.run.dir == "x y"
    # the resolved config round-trips through TOML
    back = tomllib.loads(to_toml(cfg))
    assert back["model"]["hidden"] == 32 and back["optim"]["name"] == "sgd"
    assert load_config(None, [f"{s}.{k}={v!r}".replace("'", '"').replace("True", "true")
                              .replace("False", "false")
                              for s, t in back.items() for k, v in t.items()]) == cfg


@pytest.mark.parametrize("override,needle", [
    ("model.hiden=3", "unknown key model.hiden; valid keys of [model]: layers, hidden"),
    ("modle.hidden=3", "unknown section [modle]; valid sections: data, model"),
    ("model.hidden=abc", "model.hidden must be int, got str"),
    ("model.hidden=1.5", "model.hidden must be int, got float"),
    ("model.hidden=0", "model.hidden = 0 must be > 0"),
    ("optim.lr=-0.1", "optim.lr = -0.1 must be > 0"),
    ("optim.name=rmsprop", "optim.name = 'rmsprop'; choose one of adam, sgd"),
    ("compute.device=tpu", "compute.device = 'tpu'"),
    ("model.bidirectional=1", "model.bidirectional must be bool"),
    ("hidden=3", "must look like section.key=value"),
    ("batch.plan=bogus", "batch.plan = 'bogus'; choose one of auto, length, sharded, random"),
    ("dist.wire=fp8", "dist.wire = 'fp8'; choose one of fp32, bf16, fp16"),
    ("model.cell=7", "model.cell must be str, got int"),
    ("model.dropout=1", "model.dropout = 1.0 must be < 1"),
    ("compute.threads=-1", "compute.threads = -1 must be >= 0"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last = 0 must be > 0"),
    # upper bounds where a value multiplies into memory or time; -1 or >= 0 for the knobs
    ("train.epochs=1180591620717411303424", "train.epochs = 1180591620717411303424 must be <= 1000000"),
    ("model.layers=10000", "model.layers = 10000 must be <= 64"),
    ("model.hidden=100000", "model.hidden = 100000 must be <= 16384"),
    ("model.conv_kernel=101", "model.conv_kernel = 101 must be <= 63"),
    ("augment.blur=1e6", "augment.blur = 1000000.0 must be <= 20"),
    ("augment.shear=1e9", "augment.shear = 1000000000.0 must be <= 2"),
    ("augment.prob=1.5", "augment.prob = 1.5 must be <= 1"),
    ("augment.blur=-0.5", "augment.blur = -0.5 must be -1 (the preset's value) or >= 0"),
    ("augment.contrast=-0.2", "augment.contrast = -0.2 must be -1 (the preset's value) or >= 0"),
    ("augment.morph=-2", "augment.morph = -2 must be >= -1"),
    ("batch.batch_frames=10000000000", "batch.batch_frames = 10000000000 must be <= 1000000000"),
])
def test_config_errors(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.train=x.nc", override])
    assert needle in str(e.value)


def test_missing_data_path_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="data.train is not set"):
        load_config(None, [])
    p = tmp_path / "bad.toml"
    p.write_text("[model\nhidden = 3\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load_config(p)


def test_cli_reports_config_error_in_one_line(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[data]\ntrain = "a.nc"\n[train]\nepoch = 3\n')
    r = run_cli("rnntrain", "train", p)
    assert r.returncode == 2
    assert "unknown key train.epoch; valid keys of [train]: epochs" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_choices_and_limits_live_on_the_fields():
    """Every Literal field's default is one of its choices, and the limits that validate
    applies are read from the fields themselves (a new field needs no second table)."""
    import dataclasses
    from typing import get_type_hints

    from rnntrain.config import choices, validate
    cfg = Config()
    cfg.data.train = "x.nc"
    validate(cfg)  # the defaults are valid
    n_choice = n_limit = 0
    for sec in dataclasses.fields(cfg):
        section = getattr(cfg, sec.name)
        hints = get_type_hints(type(section))
        for f in dataclasses.fields(section):
            if choices(hints[f.name]):
                n_choice += 1
                assert getattr(section, f.name) in choices(hints[f.name])
            if f.metadata:
                n_limit += 1
                bad = f.metadata.get("gt", f.metadata.get("ge", 0)) - 1
                with pytest.raises(ConfigError, match=f"{sec.name}.{f.name} = "):
                    load_config(None, ["data.train=x.nc", f"{sec.name}.{f.name}={bad}"])
    # frontend, conv_norm, backend, progress, overlap, allocator, augment.preset,
    # init_alphabet, average, ...
    assert n_choice == 18 and n_limit >= 27


# ---- documentation, freezing, [train] split by concern (old keys still accepted)


def test_every_key_is_documented_and_help_config_prints_it():
    """Each field of each section has a description (the string under it), and
    ``rnntrain train --help-config`` (a real process, no config needed) prints every key
    with its default and description, exit 0."""
    from dataclasses import fields
    from rnntrain.config import field_docs
    cfg = Config()
    r = run_cli("rnntrain", "train", "--help-config")
    assert r.returncode == 0, r.stderr
    for sec in fields(cfg):
        docs = field_docs(type(getattr(cfg, sec.name)))
        assert f"[{sec.name}]" in r.stdout
        for f in fields(getattr(cfg, sec.name)):
            assert docs.get(f.name), f"{sec.name}.{f.name} has no description"
            assert f"  {f.name} = " in r.stdout and docs[f.name][:40] in " ".join(
                r.stdout.split()), f"{sec.name}.{f.name} missing from --help-config"


def test_sections_are_frozen_after_validation(tmp_path):
    import dataclasses
    cfg = load_config(None, ["data.train=a.nc", "batch.batch_frames=700"])
    with pytest.raises(dataclasses.FrozenInstanceError, match="Batch.*frozen"):
        cfg.batch.batch_frames = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train = None
    changed = dataclasses.replace(cfg.batch, batch_frames=5)   # a changed copy is fine
    assert changed.batch_frames == 5 and cfg.batch.batch_frames == 700
    Config().batch.batch_frames = 3   # a config being built is not frozen


OLD_TRAIN = """[data]
train = "a.nc"
[train]
epochs = 3
batch_frames = 1234
threads = 2
precision = "bf16"
log_every = 7
plan = "length"
"""


def test_old_train_keys_still_work_with_one_deprecation_line(tmp_path, capsys):
    """A config written before [train] was split (file and override) loads into the new
    sections, with one line naming each old key's new place; the new file format gives
    the same config and no line."""
    p = tmp_path / "old.toml"
    p.write_text(OLD_TRAIN)
    old = load_config(p, ["train.intra_threads=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.batch_frames is now batch.batch_frames" in err[0]
    assert "train.log_every is now log.every_steps" in err[0]
    assert "train.intra_threads is now compute.intra_threads" in err[0]
    assert (old.train.epochs, old.batch.batch_frames, old.compute.threads,
            old.compute.precision, old.log.every_steps, old.batch.plan,
            old.compute.intra_threads) == (3, 1234, 2, "bf16", 7, "length", 2)
    new = tmp_path / "new.toml"
    new.write_text(to_toml(old))
    assert load_config(new) == old and capsys.readouterr().err == ""
    back = tomllib.loads(to_toml(old))
    assert "batch_frames" not in back["train"] and back["batch"]["batch_frames"] == 1234


def test_a_checkpoint_config_of_the_old_layout_loads(synth_pair):
    """A checkpoint's config written before the split (its "train" holding batch_frames,
    threads, log_every ...) rebuilds into the new sections, silently."""
    from rnntrain.config import config_from_dict, to_dict
    d = to_dict(Config())
    old = dict(d, train={**d["train"], **d["batch"], **{k: v for k, v in d["compute"].items()},
                         "log_every": 9})
    del old["batch"], old["compute"]
    old["log"] = {k: v for k, v in d["log"].items() if k != "every_steps"}
    old["train"]["batch_frames"] = 4321
    cfg = config_from_dict(old)
    assert cfg.batch.batch_frames == 4321 and cfg.log.every_steps == 9
    assert to_dict(cfg)["compute"] == d["compute"]


def test_the_shipped_configs_use_the_new_sections(capsys):
    from tests.conftest import ROOT
    for p in sorted((ROOT / "configs").glob("*.toml")):
        load_config(p, ["data.train=x.nc"])
        assert capsys.readouterr().err == "", p
