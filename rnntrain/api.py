"""The Python API behind ``rnntrain.train`` (``rnntrain.load`` is ``rnntrain.infer.api.load``).

    run = rnntrain.train("configs/fsdd_digits.toml", train={"epochs": 3}, run__dir="runs/x")
    m = rnntrain.load(run)
"""
from __future__ import annotations

import json
from pathlib import Path

from rnntrain.errors import ConfigError


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))  # a TOML basic string
    raise ConfigError(f"override value {v!r}: use a bool, number or string")


def overrides_from(args: tuple, sections: dict) -> list[str]:
    """("model.hidden=64",), {"train": {"epochs": 3}, "optim__lr": 1e-3} → override strings."""
    out = [str(a) for a in args]
    for key, value in sections.items():
        if isinstance(value, dict):
            out += [f"{key}.{k}={_toml_value(v)}" for k, v in value.items()]
        elif "__" in key:
            section, name = key.split("__", 1)
            out.append(f"{section}.{name}={_toml_value(value)}")
        else:
            raise ConfigError(f"{key}={value!r}: pass a section as a dict ({key}={{...}}) or "
                              f"one key as section__key=value")
    return out


def train(config, *overrides: str, resume: str | None = None, **sections) -> Path:
    """Train from a TOML config with overrides; returns the run folder.

    overrides: "section.key=value" strings as on the command line; sections: a dict per
    section (``train={"epochs": 3}``) or ``section__key=value``. ``resume``: as
    ``--resume`` ("auto" or a checkpoint path).
    """
    from rnntrain.config import load_config
    ov = overrides_from(overrides, sections)
    cfg = load_config(str(config), ov)
    from rnntrain.run.train import train as run_training
    return Path(run_training(cfg, str(config), ov, resume=resume))
