"""Config: TOML + overrides, typed sections, clear errors listing valid keys."""
from __future__ import annotations

import tomllib

import pytest

from rnntrain.config import ConfigError, Config, load_config, to_toml
from tests.conftest import run_cli

REQUIRED = {("data", "train"), ("data", "val"), ("model", "layers"), ("model", "hidden"),
            ("model", "bidirectional"), ("optim", "name"), ("optim", "lr"), ("train", "epochs"),
            ("train", "batch_frames"), ("train", "seed"), ("run", "dir")}


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
    ("train.device=tpu", "train.device = 'tpu'"),
    ("model.bidirectional=1", "model.bidirectional must be bool"),
    ("hidden=3", "must look like section.key=value"),
    ("train.plan=bogus", "train.plan = 'bogus'; choose one of auto, length, sharded, random"),
    ("dist.wire=fp8", "dist.wire = 'fp8'; choose one of fp32, bf16, fp16"),
    ("model.cell=7", "model.cell must be str, got int"),
    ("model.dropout=1", "model.dropout = 1.0 must be < 1"),
    ("train.threads=-1", "train.threads = -1 must be >= 0"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last = 0 must be > 0"),
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
    assert n_choice == 17 and n_limit >= 27
