"""Experiment configuration: one typed dataclass per TOML table.

``load_config(path, overrides)`` reads a TOML file, applies ``section.key=value`` overrides
(values parsed as TOML, bare words as strings) and validates. An unknown section or key,
a wrong type or an impossible value raises ConfigError listing the valid keys. Each
component receives only its own section.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
import sys
import textwrap
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from rnntrain.errors import ConfigError
from rnntrain.fsutil import read_bytes


# Limits live next to their fields: ``field(metadata=...)`` with "gt" / "ge" / "lt" bounds
# (``positive`` / ``non_negative`` below); choices are ``Literal`` types. ``validate``
# reads both from the dataclasses, so a new key needs no second table.
# "finite": inf passes "> 0", and a learning rate of inf turns every weight into NaN at the
# first step (inf is kept where it means "never": every_minutes, timeout_s).
# "le": an upper bound where a value multiplies into memory or time (model.layers = 10000,
# train.epochs = 2**70 and augment.blur = 1e6 were accepted and then hung or asked for
# terabytes): far above any sensible setting, far below what breaks the machine.
def positive(default, finite: bool = False, most=None):
    return field(default=default, metadata={"gt": 0, "finite": finite,
                                            **({"le": most} if most is not None else {})})


def non_negative(default, finite: bool = False, most=None):
    return field(default=default, metadata={"ge": 0, "finite": finite,
                                            **({"le": most} if most is not None else {})})


def knob(most=None, lt=None, integer: bool = False):
    """An [augment] knob: -1 (the preset's value) or a value from 0 up to ``most`` (or
    below ``lt``)."""
    m = {"ge": -1, "knob": True, **({"le": most} if most is not None else {"lt": lt})}
    if not integer:
        m["finite"] = True
    return field(default=-1 if integer else -1.0, metadata=m)


MANY = 10**6           # epochs, steps, patience ...: counts a run could never reach


Cell = Literal["lstm", "peephole"]
Optimizer = Literal["adam", "sgd"]
Normalize = Literal["sum", "sequences", "frames"]
Schedule = Literal["constant", "cosine", "step"]
Precision = Literal["fp32", "bf16", "fp16"]
ComputePrecision = Literal["fp32", "bf16", "fp16", "auto"]
PlanStrategy = Literal["auto", "length", "sharded", "random"]
LstmKernel = Literal["scan", "onednn"]
Allocator = Literal["cache", "capped", "system"]
ExchangeMode = Literal["allreduce", "master"]
DistBackend = Literal["auto", "mpi", "torch"]
Overlap = Literal["auto", "on", "off"]
InitAlphabet = Literal["keep", "merge", "replace"]
Average = Literal["none", "ema", "last"]
Progress = Literal["auto", "bar", "lines"]
Frontend = Literal["none", "conv"]
ConvNorm = Literal["group", "none"]


class Section:
    """A config section: a dataclass whose fields are its keys, each documented by the
    string literal under it (``rnntrain train --help-config`` prints them). Frozen once
    validated (``freeze``): what runs reads the config it was started with, and a changed
    copy is ``dataclasses.replace(section, key=value)``."""
    _frozen = False

    def __setattr__(self, name, value):
        if self._frozen:
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to {type(self).__name__}.{name}: config sections are frozen "
                "after validation (dataclasses.replace makes a changed copy)")
        object.__setattr__(self, name, value)


@dataclass
class DataConfig(Section):
    """The data: training, validation and test sets."""
    train: str = ""
    """.nc file or dataset manifest.json (``rnntrain-data shard``)"""
    val: str = ""
    """validation set (same alphabet and inputPattSize); "" = none"""
    test: str = ""
    """optional: scored with the best checkpoint after training"""
    chunk_frames: int = positive(2_000_000, most=2**31 - 1)
    """frames per chunk read at a time from a single .nc file (the reader holds two)"""
    folds: int = non_negative(0, most=1000)
    """cross-validation (``rnntrain crossfold``): split data.train into this many folds
    (rnntrain.data.folds; a function of train.seed), train on all but data.fold and
    validate on data.fold (data.val stays empty); 0 = off"""
    fold: int = non_negative(0)
    """the held-out fold, 0 .. folds-1"""


@dataclass
class ModelConfig(Section):
    """The network: an optional convolutional front end, LSTM layers, the CTC output."""
    layers: int = positive(2, most=64)
    """LSTM layers"""
    hidden: int = positive(128, most=16384)
    """units per direction"""
    bidirectional: bool = True
    """BLSTM (true) or forward-only LSTM layers"""
    subsample: int = positive(1, most=64)
    """stack this many frames into one (speech: 3 is typical)"""
    cell: Cell = "lstm"
    """"lstm" (cuDNN/oneDNN) or "peephole" (RNNLIB's cell)"""
    dropout: float = field(default=0.0, metadata={"ge": 0, "lt": 1, "finite": True})
    """dropout between LSTM layers"""
    frontend: Frontend = "none"
    """"none" or "conv" (convolution blocks, then the LSTM layers; images: columns of
    pixels; 1-D data: time convolution)"""
    conv_channels: list[int] = field(default_factory=lambda: [16, 32, 48, 64])
    """output channels of each convolution block (one entry per block)"""
    conv_kernel: int = positive(3, most=63)
    """odd; k x k (1 x k on 1-D data)"""
    conv_pool_h: list[int] = field(default_factory=lambda: [2, 2, 2, 1])
    """height pooling of each block"""
    conv_pool_w: list[int] = field(default_factory=lambda: [2, 2, 1, 1])
    """width (time) pooling of each block: subsamples time"""
    conv_norm: ConvNorm = "group"
    """"group" (per image, over valid columns) or "none\""""
    conv_dropout: float = field(default=0.0, metadata={"ge": 0, "lt": 1, "finite": True})
    """channel dropout after each block"""
    blank_bias: float = field(default=0.0, metadata={"ge": -30, "lt": 30, "finite": True})
    """added to the output layer's initial bias of the CTC blank (a head start in log-odds:
    a CTC model first learns that most frames are blank, then leaves that plateau; 4 gets
    FSDD to its target a whole epoch sooner, docs/accuracy.md); 0 = torch's initialisation.
    Only a new model's initial weights: fine-tuning (train.init_from) and resuming load
    theirs"""


@dataclass
class OptimConfig(Section):
    """The optimizer and its learning-rate schedule."""
    name: Optimizer = "adam"
    """"adam" or "sgd" (RNNLIB: sgd, lr 1e-4, momentum 0.9, normalize "sum")"""
    lr: float = positive(1e-3, finite=True)
    """learning rate"""
    momentum: float = non_negative(0.9, finite=True)
    """sgd only"""
    beta1: float = field(default=0.9, metadata={"ge": 0, "lt": 1})
    """adam only: decay of the gradient's running mean (torch's default 0.9; lower follows
    the gradient sooner: FSDD's first epoch, docs/accuracy.md)"""
    beta2: float = field(default=0.999, metadata={"ge": 0, "lt": 1})
    """adam only: decay of the squared gradient's running mean (torch's default)"""
    weight_decay: float = non_negative(0.0, finite=True)
    """L2 weight decay"""
    clip_norm: float = non_negative(0.0, finite=True)
    """global gradient-norm clipping; 0 = off"""
    normalize: Normalize = "sequences"
    """loss normalisation: "sum" (RNNLIB), "sequences", "frames" (global counts)"""
    schedule: Schedule = "constant"
    """"constant", "cosine" or "step\""""
    warmup_steps: int = non_negative(0, most=10**9)
    """linear warm-up over this many steps"""
    step_epochs: int = positive(10, most=MANY)
    """"step" schedule: multiply lr by step_gamma every N epochs"""
    step_gamma: float = positive(0.5, finite=True)
    """"step" schedule factor"""
    min_lr: float = non_negative(0.0, finite=True)
    """"cosine" schedule floor"""


@dataclass
class TrainConfig(Section):
    """How long to train, with which seed, when to validate and stop; fine-tuning and
    weight averaging."""
    epochs: int = positive(10, most=MANY)
    """passes over the training data"""
    seed: int = field(default=1, metadata={"ge": 0, "lt": 2**32})
    """seed of every random draw (weights, plans, noise); below 2**32: the plan's generator
    keeps the low 32 bits (larger seeds would alias smaller ones)"""
    input_noise: float = non_negative(0.0, finite=True)
    """Gaussian noise std added to inputs (RNNLIB's inputNoiseDev)"""
    max_bad_steps: int = positive(5, most=MANY)
    """NaN/Inf steps in a row before the run stops"""
    patience: int = non_negative(0, most=MANY)
    """stop after N validations without improvement (RNNLIB's maxTestsNoBest); 0 = never"""
    val_every_epochs: int = positive(1, most=MANY)
    """epochs between validations"""
    val_at_start: bool = False
    """also validate the starting weights, before the first step, as a candidate for
    best.pt: a fine-tuning (init_from) then never ends worse on the held-out lines than the
    model it started from (rnntrain finetune sets it); needs data.val"""
    init_from: str = ""
    """fine-tuning (rnntrain.run.finetune): a new run (its own optimizer, schedule and
    epochs) from the weights of this checkpoint or run folder; "" = random initial weights"""
    init_alphabet: InitAlphabet = "keep"
    """the output alphabet when fine-tuning: "keep" (must be the model's), "merge" (the
    model's labels plus the data's new ones), "replace" (the data's); rows of shared labels
    are kept"""
    freeze: list[str] = field(default_factory=list)
    """parameters not trained: "frontend" (the conv front end), "lstm:K" (the first K LSTM
    layers)"""
    average: Average = "none"
    """a weight average kept while training, which validation scores and best.pt holds for
    inference: "none", "ema" (exponential, every step), "last" (the last average_last epoch
    ends); rnntrain.run.average"""
    ema_decay: float = field(default=0.999, metadata={"gt": 0, "lt": 1})
    """decay of the "ema" average per step"""
    average_last: int = positive(5, most=MANY)
    """epoch ends the "last" average spans"""


@dataclass
class BatchConfig(Section):
    """How sequences are grouped into batches (the epoch planner, rnntrain.data.plan)."""
    batch_frames: int = positive(8000, most=10**9)
    """padded frames per global batch (sequences x longest, all ranks together)"""
    round_lengths: int = non_negative(0, most=1024)
    """pad batches to a ladder of N lengths per doubling (a GPU sees few shapes); 0 = off"""
    plan: PlanStrategy = "auto"
    """the epoch planner: "auto" (sharded for a manifest, else length), "length",
    "sharded", "random\""""
    batch_multiple: int = non_negative(0)
    """"length" plan: global batches hold a multiple of this many sequences where that many
    fit, so N ranks get equal shares; 0 = the number of ranks. 1 rank with N plans the
    batches of N ranks (the same weights as an N-rank run)"""


@dataclass
class ComputeConfig(Section):
    """Where and how each rank computes: device, precision, worker threads, memory."""
    device: str = "auto"
    """"auto", "cpu", "cuda", "cuda:N\""""
    precision: ComputePrecision = "fp32"
    """"fp32", "bf16" (CPU and CUDA autocast) or "fp16" (CUDA, loss scaling); CTC stays
    fp32. "auto": time a few steps of fp32 and of bf16 on the model and the epoch plan's
    first batches at start-up (on copies of the weights) and train in the faster; the
    choice is logged and kept in the checkpoints, so a resume reuses it"""
    lstm: LstmKernel = "scan"
    """the CPU's LSTM kernel. "scan": rnntrain's own recurrence (rnntrain.compute.lstmscan),
    compiled on first use with the system's C++ compiler for this CPU: no fixed cost per
    call or per time step, so small tasks and two workers pay less (docs/threads.md, "The
    LSTM kernel"); fp32 only, so bf16 and a machine without a compiler run oneDNN's (the
    run log says which). "onednn": torch's nn.LSTM kernel (all rnntrain ran before this
    setting; checkpoints without it load with it). The two differ in the last bits of
    every sum, so a run keeps one kernel for its whole life; CUDA runs cuDNN's either way"""
    deterministic: bool = True
    """CUDA: deterministic cuDNN kernels (the CPU path always is)"""
    threads: int = non_negative(0, most=4096)
    """worker threads; 0 = fill this rank's cores (cores / intra_threads)"""
    intra_threads: int = positive(1, most=4096)
    """torch intra-op threads per worker (one process-wide setting)"""
    tasks_per_worker: int = positive(2, most=1024)
    """micro-batches per worker per batch (load balance)"""
    allocator: Allocator = "cache"
    """"cache": freed memory stays in the process for the next step's tensors (no page
    faults after the first steps; a higher resident peak); "capped": blocks of 1 MiB and
    more are kept by size in a cache in front of torch's allocator, bounded by the resident
    peak the process has without it (+64 MiB), compiled on first use with the system's C++
    compiler (without one: glibc's settings alone, "system"'s peak and speed; the run log
    says which); "system": glibc's defaults, large blocks go back to the kernel at once
    (rnntrain.compute.allocator). ``rnntrain eval`` and ``decode`` apply the checkpoint's
    policy too"""


@dataclass
class CheckpointConfig(Section):
    """When checkpoints are written and how many are kept."""
    every_steps: int = non_negative(0)
    """a step checkpoint every N steps; 0 = only at epoch ends (and every_minutes)"""
    every_minutes: float = non_negative(10.0)
    """a step checkpoint after this many minutes without one (inf = never)"""
    keep_last: int = positive(2, most=MANY)
    """step checkpoints kept (best.pt and last.pt always are)"""


@dataclass
class DistConfig(Section):
    """Several ranks: the engine, the gradient exchange and its deadline."""
    backend: DistBackend = "auto"
    """"auto" (from the launcher), "mpi", "torch" (torchrun)"""
    mode: ExchangeMode = "allreduce"
    """"allreduce" (every rank updates) or "master" (rank 0 updates, then broadcasts)"""
    wire: Precision = "fp32"
    """gradient wire format: "fp32", "bf16", "fp16\""""
    timeout_s: float = positive(120.0)
    """a rank that does not arrive at a collective within this is reported dead"""
    overlap: Overlap = "auto"
    """the gradient exchange overlapped with the last task's backward, in buckets started
    in reverse parameter order as DDP does (torch backend, one worker per rank, allreduce,
    fp32 wire); "auto" = on for torchrun ranks on CUDA with one worker, else off"""
    bucket_mb: float = positive(25.0, finite=True)
    """overlap bucket size (DDP's default)"""


@dataclass
class RunConfig(Section):
    """The run folder."""
    dir: str = ""
    """run folder; "" = runs/<name>-<overrides>-<hash>"""
    name: str = ""
    """names the default run folder (default: the config file's name)"""


@dataclass
class LogConfig(Section):
    """What training prints and writes besides checkpoints."""
    every_steps: int = positive(20)
    """steps between metric lines"""
    tensorboard: bool = False
    """also write TensorBoard event files to <run.dir>/tensorboard"""
    progress: Progress = "auto"
    """"bar" (tqdm), "lines" (a plain line every log.every_steps steps) or "auto": a bar
    on a terminal, lines otherwise"""


AugmentPreset = Literal["none", "lines", "lines-light", "speech"]


@dataclass
class AugmentConfig(Section):
    """On-the-fly training augmentation (``rnntrain.augment``): the workers transform each
    training sequence just before collation, never stored; validation and test data are
    never augmented. Every draw is a function of (train.seed, epoch, sequence id) alone, so
    the weights do not depend on the thread count and a resumed run repeats the
    uninterrupted one. Off by default (``preset = "none"`` and every knob at -1).

    A knob at -1 takes the preset's value (``rnntrain.augment.params.PRESETS``); any other
    value overrides it (0 turns that transform off). Image knobs apply to line images (2-D
    data, or 1-D files of image columns), feature knobs to other 1-D data; setting a knob
    of the other kind is an error."""
    preset: AugmentPreset = "none"
    """"none": nothing unless a knob is set; "lines": text-line images (small affine,
    elastic distortion, blur, erosion/dilation, contrast jitter, pixel noise; kraken's,
    PyLaia's and Calamari's usual magnitudes); "lines-light": lines about 32 pixels high
    (half the affine magnitudes, no elastic distortion or erosion/dilation, blur up to 0.5
    pixel, half the contrast jitter and noise, half the sequences); "speech": feature sequences (SpecAugment's
    frequency and time masks and time warp as ESPnet sets them, speed perturbation 0.9-1.1,
    feature noise)."""
    prob: float = knob(1)
    """Chance that a sequence is augmented at all in an epoch (else it is used as is)."""
    rotate: float = knob(45)
    """Images: largest rotation, degrees (uniform in +-rotate)."""
    shear: float = knob(2)
    """Images: largest horizontal shear, x shift per pixel of height (slant; 0.2 = 11 deg)."""
    scale: float = knob(lt=1)
    """Images: largest relative change of the glyph size (both axes; the width follows)."""
    stretch: float = knob(lt=1)
    """Images: largest relative change of the width alone (narrow or wide typefaces)."""
    translate: float = knob(0.5)
    """Images: largest vertical shift, as a share of the image height."""
    elastic: float = knob(20)
    """Images: elastic distortion, typical displacement in pixels (a smooth random field)."""
    elastic_scale: float = knob(1000)
    """Images: distance between the elastic field's random control points, pixels (larger:
    smoother, wider bends)."""
    blur: float = knob(20)
    """Images: largest Gaussian blur sigma, pixels (uniform in 0..blur)."""
    morph: int = knob(15, integer=True)
    """Images: largest erosion/dilation window, pixels (2 or 3 thin or thicken strokes;
    0 or 1 = off); erosion or dilation with equal chance."""
    contrast: float = knob(lt=1)
    """Images: ink/background contrast jitter: ink at 1 - U(0, c), background at
    U(0, c/2) (pixels 0..1, ink high, as ``rnntrain-data images`` writes them)."""
    noise: float = knob(10)
    """Images and features: standard deviation of additive Gaussian noise (pixels 0..1;
    features: in their own units, normalised features have unit variance)."""
    freq_masks: int = knob(100, integer=True)
    """Features: number of SpecAugment frequency masks (bands set to 0)."""
    freq_mask_width: float = knob(lt=1)
    """Features: largest width of a frequency mask, as a share of the feature dimension."""
    time_masks: int = knob(100, integer=True)
    """Features: number of SpecAugment time masks (frames set to 0)."""
    time_mask_width: float = knob(lt=1)
    """Features: largest width of a time mask, as a share of the sequence length."""
    time_warp: int = knob(1000, integer=True)
    """Features: SpecAugment time warp window W, frames (a random centre moves by up to W)."""
    speed: float = knob(lt=1)
    """Features: speed perturbation, largest relative change (0.1: factors 0.9-1.1, the
    length divided by the factor); a sequence made too short for its CTC target falls back
    to the unaugmented one."""


@dataclass
class Config(Section):
    """The whole experiment: one section per TOML table."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    run: RunConfig = field(default_factory=RunConfig)
    log: LogConfig = field(default_factory=LogConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)


# Keys that moved out of [train] when it was split by concern: old key -> (section, key).
# Still accepted (config files, overrides, checkpoints), named in one deprecation line.
MOVED: dict[str, tuple[str, str]] = {
    **{f.name: ("batch", f.name) for f in fields(BatchConfig)},
    **{f.name: ("compute", f.name) for f in fields(ComputeConfig)},
    "log_every": ("log", "every_steps"),
}


def freeze(cfg: Config) -> Config:
    """Freeze every section (and the Config itself); returns ``cfg``."""
    for f in fields(cfg):
        object.__setattr__(getattr(cfg, f.name), "_frozen", True)
    object.__setattr__(cfg, "_frozen", True)
    return cfg


def field_docs(cls) -> dict[str, str]:
    """{key: the string literal under the field} of a section class (its source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen build): no descriptions
        return {}
    body, out = tree.body[0].body, {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and \
                isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and \
                isinstance(b.value.value, str):
            out[a.target.id] = " ".join(b.value.value.split())
    return out


def _limits(f) -> str:
    m = f.metadata
    if m.get("knob"):
        top = f"<= {m['le']}" if "le" in m else f"< {m['lt']}"
        return f"-1 (the preset's) or >= 0 and {top}" + (", finite" if m.get("finite") else "")
    out = [f"{op} {m[k]}" for k, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
           if k in m]
    return ", ".join(out + (["finite"] if m.get("finite") else []))


def explain(width: int = 88) -> str:
    """Every section and key: type, default, limits and description (``rnntrain train
    --help-config``)."""
    lines = ["Config keys (TOML tables; override any as section.key=value):", ""]
    for sec in fields(Config):
        cls = sec.default_factory
        lines.append(f"[{sec.name}]  {(cls.__doc__ or '').strip().splitlines()[0]}")
        docs, hints = field_docs(cls), get_type_hints(cls)
        for f in fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING \
                else f.default
            typ = hints[f.name]
            kind = " | ".join(map(repr, choices(typ))) if choices(typ) else \
                str(typ) if get_origin(typ) else typ.__name__
            limits = _limits(f)
            shown = default if isinstance(default, list) else toml_value(default)
            lines.append(f"  {f.name} = {shown}    ({kind}{'; ' + limits if limits else ''})")
            lines += textwrap.wrap(docs.get(f.name, ""), width, initial_indent=" " * 6,
                             subsequent_indent=" " * 6)
        lines.append("")
    moved = ", ".join(f"train.{k} -> {s}.{n}" for k, (s, n) in MOVED.items())
    lines += textwrap.wrap(f"Old keys still accepted: {moved}.", width)
    return "\n".join(lines)


def section_names() -> set[str]:
    """The TOML tables of a config (the CLI tells ``--section.key value`` from options)."""
    return {f.name for f in fields(Config)}


def choices(typ) -> tuple[str, ...] | None:
    """The allowed values of a ``Literal`` type (None for other types)."""
    return get_args(typ) if get_origin(typ) is Literal else None


def check_choice(value, typ, key: str):
    """``value`` must be one of the Literal ``typ``'s values: ConfigError listing them."""
    allowed = choices(typ)
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r}; choose one of {', '.join(allowed)}")
    return value


def check_device(name: str, key: str = "train.device") -> str:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``: ConfigError otherwise."""
    if not (name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ConfigError(f"{key} = {name!r}; choose auto, cpu, cuda or cuda:N")
    return name


def _valid_keys(obj) -> str:
    return ", ".join(f.name for f in fields(obj))


def _coerce(section: str, key: str, value: Any, typ) -> Any:
    name = f"{section}.{key}"
    if choices(typ):  # a Literal: its values' type here, the value itself in validate
        typ = type(choices(typ)[0])
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
    elif get_origin(typ) is list and get_args(typ) == (int,):
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                           for v in value):
            return list(value)
        raise ConfigError(f"{name} must be a list of integers, e.g. [16, 32], got {value!r}")
    elif get_origin(typ) is list and get_args(typ) == (str,):
        if isinstance(value, str):  # one entry: train.freeze=frontend
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{name} must be a list of strings, e.g. [\"a\", \"b\"], got "
                          f"{value!r}")
    raise ConfigError(f"{name} must be {getattr(typ, '__name__', typ)}, got "
                      f"{type(value).__name__} {value!r}")


def _apply(cfg: Config, table: dict, source: str, moved: list[str] | None = None):
    """Set the keys of ``table`` ({section: {key: value}}); an old [train] key (``MOVED``)
    goes to its new place and is appended to ``moved``."""
    for section, values in table.items():
        if not hasattr(cfg, section) or section.startswith("_"):
            raise ConfigError(f"{source}: unknown section [{section}]; valid sections: "
                              f"{_valid_keys(cfg)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        for key, value in values.items():
            sec_name, name = section, key
            if section == "train" and key in MOVED:
                sec_name, name = MOVED[key]
                if moved is not None and f"train.{key}" not in moved:
                    moved.append(f"train.{key}")
            sec = getattr(cfg, sec_name)
            hints = get_type_hints(type(sec))
            if name not in hints:
                raise ConfigError(f"{source}: unknown key {section}.{key}; valid keys of "
                                  f"[{section}]: {_valid_keys(sec)}")
            setattr(sec, name, _coerce(sec_name, name, value, hints[name]))


def moved_note(moved: list[str]) -> str:
    """The one deprecation line for old keys used (see ``MOVED``)."""
    return ("rnntrain: note: " + ", ".join(f"{k} is now {'.'.join(MOVED[k[6:]])}"
                                           for k in moved) +
            " ([train] was split by concern; the old keys still work)")


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
    """Choices and limits of every field (read from the dataclasses), then cross-checks."""
    for sec in fields(cfg):
        section = getattr(cfg, sec.name)
        hints = get_type_hints(type(section))
        for f in fields(section):
            key, v = f"{sec.name}.{f.name}", getattr(section, f.name)
            if choices(hints[f.name]):
                check_choice(v, hints[f.name], key)
            if "gt" in f.metadata and not v > f.metadata["gt"]:
                raise ConfigError(f"{key} = {v!r} must be > {f.metadata['gt']}")
            if "ge" in f.metadata and not v >= f.metadata["ge"]:
                raise ConfigError(f"{key} = {v!r} must be >= {f.metadata['ge']}")
            if "lt" in f.metadata and not v < f.metadata["lt"]:
                raise ConfigError(f"{key} = {v!r} must be < {f.metadata['lt']}")
            if "le" in f.metadata and not v <= f.metadata["le"]:
                raise ConfigError(f"{key} = {v!r} must be <= {f.metadata['le']}")
            if f.metadata.get("knob") and v != -1 and not v >= 0:
                raise ConfigError(f"{key} = {v!r} must be -1 (the preset's value) or >= 0")
            if f.metadata.get("finite") and not math.isfinite(v):
                raise ConfigError(f"{key} = {v!r} must be a finite number")
            if isinstance(v, str):
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:  # undecodable bytes from the command line
                    raise ConfigError(f"{key} = {v!r} is not valid UTF-8 text") from None
    check_device(cfg.compute.device, "compute.device")
    m = cfg.model
    if m.frontend == "conv":
        if not m.conv_channels or not (len(m.conv_channels) == len(m.conv_pool_h)
                                       == len(m.conv_pool_w)):
            raise ConfigError(f"model.conv_channels, conv_pool_h and conv_pool_w need one "
                              f"entry per block (got {len(m.conv_channels)}, "
                              f"{len(m.conv_pool_h)}, {len(m.conv_pool_w)})")
        if min(m.conv_channels + m.conv_pool_h + m.conv_pool_w) < 1:
            raise ConfigError("model.conv_channels, conv_pool_h and conv_pool_w must be >= 1")
        for name, most in (("conv_channels", 4096), ("conv_pool_h", 64), ("conv_pool_w", 64)):
            big = [v for v in getattr(m, name) if v > most]
            if big or len(getattr(m, name)) > 16:
                raise ConfigError(f"model.{name} = {getattr(m, name)}: at most 16 blocks of "
                                  f"at most {most}")
        if m.conv_kernel % 2 == 0:
            raise ConfigError(f"model.conv_kernel = {m.conv_kernel} must be odd (the "
                              "convolutions keep the size: padding k // 2 each side)")
    d = cfg.dist
    if d.overlap == "on":  # what the overlap cannot do, known before any process starts
        if d.backend == "mpi":
            raise ConfigError('dist.overlap = "on" needs dist.backend = "torch" (or "auto" '
                              'under torchrun): the MPI engine exchanges the whole message '
                              'after backward')
        if d.mode != "allreduce":
            raise ConfigError(f'dist.overlap = "on" needs dist.mode = "allreduce" (got '
                              f'"{d.mode}": master mode reduces to rank 0 after backward)')
        if d.wire != "fp32":
            raise ConfigError(f'dist.overlap = "on" needs dist.wire = "fp32" (got '
                              f'"{d.wire}": the 16-bit wires encode the whole gradient with '
                              'one scale after backward)')
    if not cfg.data.train:
        raise ConfigError("data.train is not set (an RNNLIB .nc file or a manifest.json)")
    dc = cfg.data
    if dc.folds == 1:
        raise ConfigError("data.folds = 1: give 2 or more folds (0 = no folds)")
    if dc.folds and dc.fold >= dc.folds:
        raise ConfigError(f"data.fold = {dc.fold} must be < data.folds = {dc.folds}")
    if dc.folds and dc.val:
        raise ConfigError(f"data.folds = {dc.folds} validates on the held-out fold "
                          f"{dc.fold} of data.train: leave data.val empty (data.val=\"\")")
    if not dc.folds and dc.fold:
        raise ConfigError(f"data.fold = {dc.fold} needs data.folds (2 or more)")


def load_config(path: str | Path | None, overrides: list[str] = (), check: bool = True) -> Config:
    cfg, moved = Config(), []
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        # a FIFO would block the read, /dev/zero never end; a config is not megabytes
        data = read_bytes(p, "config file", 1 << 24, ConfigError)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:  # TOML is UTF-8 by definition
            line = data[:e.start].count(b"\n") + 1
            raise ConfigError(f"{p}: not UTF-8 text (byte 0x{data[e.start]:02x} on line "
                              f"{line}); TOML files must be UTF-8") from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot read ({e.strerror or e})") from None
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML ({e})") from None
        _apply(cfg, table, str(p), moved)
    for text in overrides:
        section, key, value = parse_override(text)
        _apply(cfg, {section: {key: value}}, f"override {text!r}", moved)
    if moved:
        print(moved_note(moved), file=sys.stderr, flush=True)
    if check:
        validate(cfg)
        freeze(cfg)
    return cfg


def config_from_dict(table: dict) -> Config:
    """Rebuild a Config saved in a checkpoint (same keys, no file; a checkpoint written
    before [train] was split has the old keys: they go to their new places). Frozen."""
    cfg = Config()
    _apply(cfg, table, "checkpoint config")
    return freeze(cfg)


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def toml_value(v) -> str:
    """A Python bool, str, int or float as a TOML value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):  # JSON's escapes are TOML's, but for DEL, which TOML escapes
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    return repr(v)


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML (saved in the run folder)."""
    lines = []
    for sec, values in to_dict(cfg).items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)
