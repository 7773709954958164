"""Experiment configuration: one typed dataclass per TOML table.

``load_config(path, overrides)`` reads a TOML file, applies ``section.key=value`` overrides
(values parsed as TOML, bare words as strings) and validates. An unknown section or key,
a wrong type or an impossible value raises ConfigError listing the valid keys. Each
component receives only its own section.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from rnntrain.errors import ConfigError, check_regular_file


@dataclass
class DataConfig:
    train: str = ""              # .nc file or dataset manifest.json
    val: str = ""                # validation set (same alphabet and inputPattSize)
    test: str = ""               # optional: scored with the best checkpoint after training
    chunk_frames: int = 2_000_000  # virtual chunk size when a single .nc file is given


@dataclass
class ModelConfig:
    layers: int = 2
    hidden: int = 128            # units per direction
    bidirectional: bool = True
    subsample: int = 1           # stack this many frames into one (speech: 3 is typical)
    cell: str = "lstm"           # "lstm" (cuDNN/oneDNN) or "peephole" (RNNLIB's cell)
    dropout: float = 0.0         # between layers


@dataclass
class OptimConfig:
    name: str = "adam"           # "adam" or "sgd" (RNNLIB: sgd, lr 1e-4, momentum 0.9, sum)
    lr: float = 1e-3
    momentum: float = 0.9        # sgd only
    weight_decay: float = 0.0
    clip_norm: float = 0.0       # global gradient-norm clipping; 0 = off
    normalize: str = "sequences"  # loss normalisation: "sum" (RNNLIB), "sequences", "frames"
    schedule: str = "constant"   # "constant", "cosine", "step"
    warmup_steps: int = 0
    step_epochs: int = 10        # "step" schedule: multiply lr by step_gamma every N epochs
    step_gamma: float = 0.5
    min_lr: float = 0.0          # "cosine" schedule floor


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_frames: int = 8000     # padded frames per (global) batch
    seed: int = 1
    input_noise: float = 0.0     # Gaussian noise std added to inputs (RNNLIB inputNoiseDev)
    threads: int = 0             # worker threads; 0 = fill this rank's cores (cores / intra_threads)
    intra_threads: int = 1       # torch intra-op threads per worker (one process-wide setting)
    tasks_per_worker: int = 2    # micro-batches per worker per batch (load balance)
    device: str = "auto"         # "auto", "cpu", "cuda", "cuda:N"
    precision: str = "fp32"      # "fp32", "bf16", "fp16" (CUDA autocast; CTC stays fp32)
    round_lengths: int = 0       # pad batches to a ladder of N lengths per doubling; 0 = off
    deterministic: bool = True   # CUDA: deterministic cuDNN kernels (CPU always is)
    max_bad_steps: int = 5       # NaN/Inf steps in a row before the run stops
    patience: int = 0            # stop after N validations without improvement; 0 = never
    log_every: int = 20          # steps between metric lines
    val_every_epochs: int = 1


@dataclass
class CheckpointConfig:
    every_steps: int = 0         # 0 = only at epoch ends
    every_minutes: float = 10.0
    keep_last: int = 2


@dataclass
class DistConfig:
    mode: str = "allreduce"      # "allreduce" or "master"
    wire: str = "fp32"           # gradient wire format: "fp32", "bf16", "fp16"
    timeout_s: float = 120.0     # a rank that does not arrive within this is reported dead


@dataclass
class RunConfig:
    dir: str = ""                # run folder; "" = runs/<name>-<overrides>-<hash>
    name: str = ""               # names the default run folder (default: the config's name)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    run: RunConfig = field(default_factory=RunConfig)


CHOICES = {
    ("model", "cell"): ("lstm", "peephole"),
    ("optim", "name"): ("adam", "sgd"),
    ("optim", "normalize"): ("sum", "sequences", "frames"),
    ("optim", "schedule"): ("constant", "cosine", "step"),
    ("train", "precision"): ("fp32", "bf16", "fp16"),
    ("dist", "mode"): ("allreduce", "master"),
    ("dist", "wire"): ("fp32", "bf16", "fp16"),
}
POSITIVE = {("model", "layers"), ("model", "hidden"), ("model", "subsample"),
            ("optim", "lr"), ("train", "epochs"), ("train", "batch_frames"),
            ("train", "intra_threads"), ("train", "tasks_per_worker"), ("train", "log_every"),
            ("train", "max_bad_steps"), ("train", "val_every_epochs"),
            ("data", "chunk_frames"), ("dist", "timeout_s"), ("checkpoint", "keep_last"),
            ("optim", "step_epochs")}
# inf passes "> 0": a learning rate of inf turns every weight into NaN at the first step
FINITE = {("optim", "lr"), ("optim", "momentum"), ("optim", "weight_decay"),
          ("optim", "clip_norm"), ("optim", "min_lr"), ("optim", "step_gamma"),
          ("train", "input_noise"), ("model", "dropout")}
NON_NEGATIVE = {("optim", "momentum"), ("optim", "weight_decay"), ("optim", "clip_norm"),
                ("optim", "warmup_steps"), ("optim", "min_lr"), ("train", "input_noise"),
                ("train", "threads"), ("train", "patience"), ("checkpoint", "every_steps"),
                ("checkpoint", "every_minutes"), ("model", "dropout"), ("train", "seed"),
                ("train", "round_lengths")}


def _valid_keys(obj) -> str:
    return ", ".join(f.name for f in fields(obj))


def _coerce(section: str, key: str, value: Any, typ) -> Any:
    name = f"{section}.{key}"
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{name} must be {typ.__name__}, got {type(value).__name__} {value!r}")


def _apply(cfg: Config, table: dict, source: str):
    for section, values in table.items():
        if not hasattr(cfg, section) or section.startswith("_"):
            raise ConfigError(f"{source}: unknown section [{section}]; valid sections: "
                              f"{_valid_keys(cfg)}")
        sec = getattr(cfg, section)
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        hints = get_type_hints(type(sec))
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(f"{source}: unknown key {section}.{key}; valid keys of "
                                  f"[{section}]: {_valid_keys(sec)}")
            setattr(sec, key, _coerce(section, key, value, hints[key]))


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` (a leading ``--`` is allowed) → (section, key, value)."""
    body = text[2:] if text.startswith("--") else text
    if "=" not in body or "." not in body.split("=", 1)[0]:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    lhs, raw = body.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string
    return section, key, value


def validate(cfg: Config):
    for (sec, key), choices in CHOICES.items():
        v = getattr(getattr(cfg, sec), key)
        if v not in choices:
            raise ConfigError(f"{sec}.{key} = {v!r}; choose one of {', '.join(choices)}")
    for sec, key in POSITIVE:
        v = getattr(getattr(cfg, sec), key)
        if not v > 0:
            raise ConfigError(f"{sec}.{key} = {v!r} must be > 0")
    for sec, key in NON_NEGATIVE:
        v = getattr(getattr(cfg, sec), key)
        if not v >= 0:
            raise ConfigError(f"{sec}.{key} = {v!r} must be >= 0")
    for sec, key in FINITE:
        v = getattr(getattr(cfg, sec), key)
        if not math.isfinite(v):
            raise ConfigError(f"{sec}.{key} = {v!r} must be a finite number")
    for f in fields(cfg):
        for g in fields(getattr(cfg, f.name)):
            v = getattr(getattr(cfg, f.name), g.name)
            if isinstance(v, str):
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:  # undecodable bytes from the command line
                    raise ConfigError(f"{f.name}.{g.name} = {v!r} is not valid UTF-8 text"
                                      ) from None
    if cfg.model.dropout >= 1:
        raise ConfigError(f"model.dropout = {cfg.model.dropout} must be < 1")
    dev = cfg.train.device
    if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ConfigError(f"train.device = {dev!r}; choose auto, cpu, cuda or cuda:N")
    if not cfg.data.train:
        raise ConfigError("data.train is not set (an RNNLIB .nc file or a manifest.json)")


def load_config(path: str | Path | None, overrides: list[str] = (), check: bool = True) -> Config:
    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        check_regular_file(p, "config file", ConfigError)
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:  # TOML is UTF-8 by definition
            line = p.read_bytes()[:e.start].count(b"\n") + 1
            raise ConfigError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} on line "
                              f"{line}); TOML files must be UTF-8") from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot read ({e.strerror or e})") from None
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML ({e})") from None
        _apply(cfg, table, str(p))
    for text in overrides:
        section, key, value = parse_override(text)
        _apply(cfg, {section: {key: value}}, f"override {text!r}")
    if check:
        validate(cfg)
    return cfg


def config_from_dict(table: dict) -> Config:
    """Rebuild a Config saved in a checkpoint (same keys, no file)."""
    cfg = Config()
    _apply(cfg, table, "checkpoint config")
    return cfg


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
                 "\f": "\\f", "\r": "\\r"}


def toml_string(v: str) -> str:
    """``v`` as a TOML basic string: quotes, backslashes and every control character
    (which TOML does not allow raw: newline, tab, DEL, ...) escaped, so any run.name or
    path reads back as itself."""
    out = []
    for ch in v:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML (saved in the run folder)."""
    lines = []
    for sec, values in to_dict(cfg).items():
        lines.append(f"[{sec}]")
        for k, v in values.items():
            if isinstance(v, bool):
                s = "true" if v else "false"
            elif isinstance(v, str):
                s = toml_string(v)
            else:
                s = repr(v)
            lines.append(f"{k} = {s}")
        lines.append("")
    return "\n".join(lines)
