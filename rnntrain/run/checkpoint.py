"""Checkpoints: the typed record, written atomically, loaded without running code.

A checkpoint file is one flat dict saved with ``torch.save`` and loaded with
``torch.load(weights_only=True)`` (a file from a stranger cannot execute code)::

    {"format": 1,
     <ModelCard fields>  labels, input_size, frame_size, image_height, image_frontend,
                         frontend, config         -- everything inference needs
     <training parts>    model, optim, state, ...  -- each a ``state_dict()``}

- ``ModelCard``: what a model IS (its alphabet, its input side, its [model] config). It
  builds the network (``ModelCard.build``; ``load_model`` adds the weights): the one
  checkpoint → model builder that eval, decode, transcribe, export, the Python API and
  fine-tuning use.
- The training parts follow torchtitan's ``Stateful`` pattern: every part is an object
  with ``state_dict()``/``load_state_dict()`` (the network, the optimizer, the
  ``TrainState`` which holds the plan position, the weight average), saved under its name
  (``save``) and restored by name (``Checkpoint.restore``).

Adding a field: a field on ``ModelCard`` (with its default for older files), or one more
named part in the training loop's parts (``train.training_parts``). Older files load: a
missing card field takes its default (``frame_size`` is derived as older versions did),
a missing optional part keeps the state it was built with.

Writing goes through ``fsutil.atomic_write`` (temporary file in the same folder, fsync,
rename over the target, fsync of the folder), so a crash leaves either the old or the new
file, never half a file.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
import types
from typing import Mapping, Protocol, get_args, get_origin, get_type_hints

import torch

from rnntrain.data.dataset import check_fits
from rnntrain.errors import UserError, check_regular_file
from rnntrain.fsutil import atomic_write
from rnntrain.artifact.runfolder import RunFolder, step_number

FORMAT_VERSION = 1
_PAUSE = bool(os.environ.get("RNNTRAIN_TEST_PAUSE"))  # see faults.pause_point
TRAINING_PARTS = ("model", "optim", "state")   # what every resumable checkpoint holds


class Stateful(Protocol):
    """A part of the training saved in a checkpoint (torchtitan's pattern): nn.Module,
    torch.optim.Optimizer, TrainState and the weight averages all have these two."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict): ...


@dataclass
class ModelCard:
    """What a trained model is: everything inference needs besides the weights."""
    labels: list[str]            # the output classes 0..C-2 (the CTC blank is C-1, the last)
    input_size: int              # inputPattSize of the data files it was trained on
    frame_size: int              # values per model input frame (2-D: height x inputPattSize)
    image_height: int = 0        # pixels per column of image data (2-D or columns); 0: none
    image_frontend: str = ""     # the image converter's settings (JSON), for inference
    frontend: dict | None = None  # the audio converters' front end (FrontEnd.to_dict())
    config: dict = field(default_factory=dict)  # the run's resolved config (to_dict(cfg))
    # the confidences' temperature fitted on labelled data (decode.calibrate.Calibration's
    # to_dict: the end of training, rnntrain calibrate); None: uncalibrated (T = 1)
    calibration: dict | None = None
    # the weights inference uses: "model" (the trained ones) or "average" (the part
    # "average": train.average kept one, and validation scored it)
    weights: str = "model"
    init_from: str = ""          # the checkpoint this model was fine-tuned from (train.init_from)

    @classmethod
    def of_data(cls, ds, config: dict) -> "ModelCard":
        """The card of a model trained on Dataset ``ds`` under ``config`` (a to_dict)."""
        return cls(list(ds.labels), ds.input_size, ds.frame_size,
                   ds.frame_height if ds.is_2d or ds.column_height else 0,
                   getattr(ds, "image_frontend", ""), getattr(ds, "frontend", None),
                   config)

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, ck: dict, where) -> "ModelCard":
        """From a checkpoint dict (any version this rnntrain reads); UserError naming
        ``where`` for a missing or mistyped entry."""
        for name in ("labels", "input_size", "config"):
            if name not in ck:
                raise UserError(f"{where}: not a complete rnntrain checkpoint (no {name})")
        hints = get_type_hints(cls)
        got = {}
        for f in fields(cls):
            if f.name in ck and f.name != "frame_size" or ck.get(f.name):
                v = ck[f.name]
                if not _is(v, hints[f.name]):
                    raise UserError(f"{where}: not a complete rnntrain checkpoint (an entry "
                                    f"has the wrong type: {f.name})")
                got[f.name] = v
        if not isinstance(got["config"].get("model", {}), dict):
            raise UserError(f"{where}: not a complete rnntrain checkpoint (an entry has the "
                            "wrong type: config)")
        got.setdefault("frame_size", legacy_frame_size(got))
        return cls(**got)

    # ---- what the model takes and gives
    @property
    def blank(self) -> int:
        return len(self.labels)

    def model_config(self, where=""):
        """The [model] section as a config object (the network's shape)."""
        return self.train_config(where).model

    def train_config(self, where=""):
        from rnntrain.config import config_from_dict
        try:
            return config_from_dict(self.config)
        except UserError as e:
            raise UserError(f"{where}: its config does not fit this rnntrain ({e})") from None

    def build(self, where=""):
        """The untrained network of this card (``compute.model.CTCModel``), with the LSTM
        kernel it was trained with (``compute.lstm``; a card from before that setting:
        "onednn", the only kernel there was), so that it transcribes as it trained."""
        from rnntrain.compute.model import build_model
        return build_model(self.model_config(where), self.frame_size, len(self.labels),
                           max(self.image_height, 1),
                           (self.config.get("compute") or {}).get("lstm", "onednn"))

    def input_side(self) -> dict:
        """What data must match to be fed to this model (fine-tuning checks it)."""
        return {"inputPattSize": self.input_size, "frame size": self.frame_size,
                "image height": self.image_height,
                "front end": self.config.get("model", {}).get("frontend", "none")}

    def check_input(self, ds, where, data_model: dict | None = None):
        """``ds`` (2-D images already padded to this card's height) must feed this model:
        same inputPattSize, image height and frame size, and (``data_model``: the [model]
        section it will train under) the same front end. One line naming both sides."""
        other = {"inputPattSize": ds.input_size, "frame size": ds.frame_size,
                 "image height": ds.frame_height if ds.is_2d or ds.column_height else 0,
                 "front end": (data_model or {}).get("frontend",
                                                     self.input_side()["front end"])}
        for key, have in self.input_side().items():
            if other[key] != have:
                raise UserError(f"{where}: {key} {have} differs from {ds.source} "
                                f"({other[key]}): a model takes only input like its own")

    def check_labels(self, ds, where, what: str | None = None):
        """``ds`` must have this card's alphabet (the difference is named otherwise), or
        be its first labels: a model fine-tuned with train.init_alphabet = "merge" keeps
        the labels its data lacks after the data's own."""
        n = len(ds.labels)
        if n and len(self.labels) > n and list(self.labels[:n]) == list(ds.labels):
            check_fits(ds, self.labels[:n], self.input_size, what or f"checkpoint {where}")
            return
        check_fits(ds, self.labels, self.input_size, what or f"checkpoint {where}")


def _is(v, hint) -> bool:
    """Does ``v`` (a value loaded from a file) have the type ``hint`` (of a card field)?"""
    if isinstance(hint, types.UnionType):
        return any(_is(v, h) for h in get_args(hint))
    if hint is type(None):
        return v is None
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        return isinstance(v, list) and all(_is(x, item) for x in v)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, get_origin(hint) or hint)


def legacy_frame_size(card: dict) -> int:
    """Values per model input frame for checkpoints that do not record it: inputPattSize,
    times the image height for 2-D files (each frame a column of padded pixels). Read by
    the converter's layout record, else by the shape (a 1-D file of image columns has
    inputPattSize = height x channels)."""
    size, height = int(card["input_size"]), int(card.get("image_height", 0) or 0)
    if height <= 1:
        return size
    layout = ""
    if card.get("image_frontend"):
        try:
            layout = str(json.loads(card["image_frontend"]).get("layout", ""))
        except (ValueError, AttributeError):
            pass
    if layout == "columns" or (not layout and size % height == 0):
        return size
    return size * height


@dataclass
class Checkpoint:
    """A checkpoint as read: its card and the state dicts of its parts, by name."""
    path: Path
    card: ModelCard
    parts: dict   # {"model": weights, "optim": ..., "state": ..., ...} as saved

    @property
    def trainable(self) -> bool:
        """Does it hold what a resume needs (optimizer and training position)?"""
        return all(k in self.parts for k in TRAINING_PARTS)

    def save(self, path):
        """Write this checkpoint (its card and parts as they are now) to ``path``."""
        save_atomic({"format": FORMAT_VERSION, **self.card.state_dict(), **self.parts}, path)

    def inference_weights(self) -> dict:
        """The weights inference uses (the card's ``weights``): the model's, with the
        average's floating-point entries in their place for ``"average"``."""
        sd = dict(self.parts["model"])
        if self.card.weights == "average":
            avg = self.parts.get("average")
            if not isinstance(avg, dict) or not isinstance(avg.get("avg"), dict):
                raise UserError(f"{self.path}: its card names averaged weights, but it holds "
                                "none")
            sd.update(avg["avg"])
        return sd

    def state(self):
        """The training position and scores (``TrainState``)."""
        from rnntrain.run.state import TrainState
        return TrainState.from_dict(self.parts["state"])

    def restore(self, parts: Mapping[str, Stateful], optional: tuple[str, ...] = ()):
        """Load each of ``parts`` from the entry of its name (a part named in
        ``optional`` that this file lacks keeps its state); UserError naming the file when
        a part does not fit."""
        for name, part in parts.items():
            if name not in self.parts:
                if name in optional:
                    continue
                raise UserError(f"{self.path}: not a complete rnntrain checkpoint (no {name})")
            try:
                part.load_state_dict(self.parts[name])
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
                raise UserError(f"{self.path}: {name} does not fit this model "
                                f"({(str(e).splitlines() or [type(e).__name__])[0][:200]})"
                                ) from None


def save(path: Path, card: ModelCard, parts: Mapping[str, Stateful]):
    """Write the card and every part's ``state_dict()`` to ``path`` (atomically)."""
    rec = {"format": FORMAT_VERSION, **card.state_dict()}
    for name, part in parts.items():
        assert name not in rec, name
        rec[name] = part.state_dict()
    save_atomic(rec, path)


def save_atomic(obj: dict, path: Path):
    """Write ``obj`` to ``path`` so that a crash leaves the old file or the new one; a
    failed write (disk full, ...) is a UserError and leaves the old file untouched."""
    path = Path(path)

    def pause():  # tests kill the process here: the temp file is complete, not renamed
        from rnntrain.run.faults import pause_point
        n = step_number(path)
        pause_point("ckpt", -1 if n is None else n)

    try:
        atomic_write(path, lambda fh: torch.save(obj, fh), pause if _PAUSE else None)
    except (OSError, RuntimeError) as e:
        # disk full, quota, file size limit: the old checkpoint stays. torch.save reports a
        # failed write of a large tensor as a RuntimeError ("unexpected pos ...").
        why = e.strerror if isinstance(e, OSError) and e.strerror else \
            f"{type(e).__name__}: {(str(e).splitlines() or [type(e).__name__])[0][:120]}"
        try:
            free = f"; {shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free there"
        except OSError:
            free = ""
        raise UserError(f"cannot write checkpoint {path} ({why}{free}); the previous "
                        f"checkpoints in {path.parent} are intact") from None


def read(path, training: bool = False) -> Checkpoint:
    """Load and check a checkpoint; a clear UserError if it is not one of ours, or
    (``training``) lacks what a resume needs."""
    path = Path(path)
    check_regular_file(path, "checkpoint")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, or holds code objects
        raise UserError(f"{path}: not a readable checkpoint ({load_error(e)})") from None
    if not isinstance(ck, dict) or "format" not in ck:
        raise UserError(f"{path}: not an rnntrain checkpoint")
    if ck["format"] != FORMAT_VERSION:
        raise UserError(f"{path}: checkpoint format {ck['format']}, this rnntrain reads "
                        f"format {FORMAT_VERSION}")
    if not isinstance(ck.get("model"), dict):
        raise UserError(f"{path}: not a complete rnntrain checkpoint (no model)")
    card = ModelCard.from_record(ck, path)
    card_keys = {f.name for f in fields(ModelCard)} | {"format"}
    rec = Checkpoint(path, card, {k: v for k, v in ck.items() if k not in card_keys})
    if training:
        missing = [k for k in TRAINING_PARTS if k not in rec.parts]
        if missing:
            raise UserError(f"{path}: not a complete rnntrain checkpoint (no "
                            f"{', '.join(missing)})")
        if not (isinstance(rec.parts["state"], dict) and all(
                isinstance(rec.parts["state"].get(k), int) for k in ("epoch", "pos", "step"))):
            raise UserError(f"{path}: checkpoint lacks the training position (epoch, pos, "
                            "step)")
    return rec


def load_model(path):
    """THE checkpoint → network builder: → (CTCModel in eval mode on the CPU, Checkpoint),
    with the weights the card names for inference."""
    ck = read(path)
    net = ck.card.build(path)
    try:
        net.load_state_dict(ck.inference_weights())
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise UserError(f"{path}: its weights do not fit its own [model] section "
                        f"({(str(e).splitlines() or [type(e).__name__])[0][:200]})") from None
    return net.eval(), ck


def load_error(e: Exception) -> str:
    """Why torch.load failed, in a few words. torch's own message for a file holding Python
    objects advises ``weights_only=False``, i.e. running the file's code: never repeat that
    to a user who may have been sent the file."""
    text = str(e)
    if "Weights only load failed" in text or "weights_only" in text:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text) or \
            re.search(r"Unsupported operand (\d+)", text)
        what = f" ({found.group(1)})" if found else ""
        return (f"it holds Python objects{what} besides tensors and plain values; refused, "
                f"since loading them could run code")
    first = text.splitlines()[0][:200] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


# ---- resuming: what a resumed run needs to repeat the uninterrupted one

def resume_candidates(run: RunFolder) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``--resume auto``: (usable files, newest training position first; [(unreadable
    file, why)]) among the step checkpoints and last.pt.

    Ordered by the position stored in each file, not by mtime or name: last.pt written at
    an epoch end is newer than the step checkpoint of the same step.
    """
    good, broken = [], []
    for p in run.training_checkpoints():
        try:
            good.append((tuple(-v for v in read(p, training=True).state().position()), p))
        except UserError as e:
            broken.append((p, str(e)))
    return [p for _, p in sorted(good)], broken


def check_matches(ck: Checkpoint, ds, model_cfg: dict):
    """The checkpoint must fit the data (inputPattSize, alphabet, image height) and the
    model config."""
    path, card = ck.path, ck.card
    card.check_labels(ds, path)
    have = ds.frame_height if ds.is_2d or ds.column_height else 0
    if card.image_height != have:
        raise UserError(f"{path}: checkpoint's image height {card.image_height} "
                        f"differs from {ds.source} ({have})")
    # a key the checkpoint's rnntrain did not have yet holds its default (what that
    # rnntrain built)
    from rnntrain.config import ModelConfig
    saved = {**asdict(ModelConfig()), **card.config.get("model", {})}
    if saved != model_cfg:
        diff = {k: (saved.get(k), v) for k, v in model_cfg.items() if saved.get(k) != v}
        raise UserError(f"{path}: model section differs from the config "
                        f"(checkpoint vs config: {diff})")


def load_for_resume(resume: str, run: RunFolder, ds, parts: Mapping[str, Stateful],
                    model_cfg: dict, optional: tuple[str, ...] = (),
                    warn=print) -> Checkpoint:
    """Load ``resume`` (a path, or "auto": the newest usable one in the run folder) into
    ``parts`` (by name: model, optim, ...; the training state is the caller's); returns
    the Checkpoint.

    A checkpoint that fails to load (truncated, other format version, other model shape)
    is reported with ``warn`` and, for "auto", the next older one is tried.
    """
    folder = run.checkpoints
    if resume == "auto":  # (stale temp files were removed under the run lock)
        cands, broken = resume_candidates(run)
        if not cands and not broken:
            raise UserError(f"--resume auto: no checkpoint in {folder} (the default run.dir "
                            f"depends on the config and overrides: pass run.dir=FOLDER of the "
                            f"run to continue)")
        for path, why in broken:
            warn(f"warning: {why}; skipping it" +
                 (f", falling back to {cands[0]}" if cands else ""))
        if not cands:
            raise UserError(f"--resume auto: no usable checkpoint in {folder} "
                            f"({len(broken)} unreadable; {broken[-1][1]})")
    else:
        cands = [Path(resume)]
    errors = []
    for i, path in enumerate(cands):
        try:
            ck = read(path, training=True)
            check_matches(ck, ds, model_cfg)
            ck.restore(parts, optional)
            return ck
        except UserError as e:
            errors.append(str(e))
            if i == len(cands) - 1:
                if len(cands) > 1:
                    raise UserError(f"--resume auto: no usable checkpoint in {folder} "
                                    f"(tried {len(cands)}; newest: {errors[0]})") from None
                raise
            warn(f"warning: {e}; falling back to {cands[i + 1]}")
    raise AssertionError("unreachable")
