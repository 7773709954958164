"""Opening a trained model: the file, its metadata and an engine to run it
(``rnntrain.load`` / ``rnntrain.infer.api.load`` wrap them in a ``Model``).

``path`` is a checkpoint (``.pt``), a run folder (its ``checkpoints/best.pt``), a file
written by ``rnntrain export`` (TorchScript or ONNX) or a zoo name
(``rnntrain.artifact.paths.resolve``). Whatever it is, a ``Model`` knows
its labels, input size, frame stacking and front end (``rnntrain.frontend``), and runs
on one of three engines:

- ``eager``: the training network (``compute.model.CTCModel``), from a checkpoint;
- ``torchscript``: an exported ``ExportCTC`` loaded with ``torch.jit.load``;
- ``onnx``: an exported ONNX graph run by ONNX Runtime.

Every engine takes a zero-padded batch x (T, N, F) float32 with lengths (N,) and gives
log-probabilities (T', N, C) with output lengths (N,); see ``rnntrain.infer.graph``.
"""
from __future__ import annotations

import json
import math
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rnntrain.artifact.paths import resolve  # noqa: F401  (infer.model.resolve: the old name)
from rnntrain.errors import UserError
from rnntrain.frontend import FrontEnd
from rnntrain.frontend.images import ImageFrontEnd

EXPORT_META = "rnntrain.json"     # TorchScript extra file / ONNX metadata key
EXPORT_FORMAT = 1


def kind_of(path: Path) -> str:
    """"checkpoint", "torchscript" or "onnx", from the file's contents."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise UserError(f"{path}: unreadable model file ({e})") from None
        # torch.jit.save writes code/ and constants.pkl; torch.save only data.pkl
        if any(n.endswith("constants.pkl") or "/code/" in n for n in names):
            return "torchscript"
        return "checkpoint"
    if path.suffix == ".onnx":
        return "onnx"
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head[:1] == b"\x08":  # protobuf field 1 (ir_version), varint: an ONNX ModelProto
        return "onnx"
    raise UserError(f"{path}: not a model file (expected an rnntrain checkpoint, a run "
                    f"folder, or a TorchScript/ONNX file written by rnntrain export)")


@dataclass
class Meta:
    """What travels with a model besides its weights."""
    labels: list[str]
    input_size: int
    subsample: int
    frontend: FrontEnd | None
    model: dict = field(default_factory=dict)    # the [model] config section
    source: str = ""                             # the checkpoint it came from
    image: ImageFrontEnd | None = None           # models trained on converted images
    calibration: dict | None = None              # the confidence temperature's fit
                                                 # (decode.calibrate.Calibration.to_dict)

    @property
    def blank(self) -> int:
        return len(self.labels)

    @property
    def temperature(self) -> float:
        """The confidences' temperature (1 without a calibration)."""
        return float(self.calibration["temperature"]) if self.calibration else 1.0

    def to_json(self) -> str:
        return json.dumps({"format": EXPORT_FORMAT, "labels": self.labels,
                           "input_size": self.input_size, "subsample": self.subsample,
                           "frontend": self.frontend.to_dict() if self.frontend else None,
                           "model": self.model, "source": self.source,
                           "image": self.image.to_dict() if self.image else None,
                           "calibration": self.calibration,
                           "io": "x (T, N, F) float32 zero-padded, lengths (N,) int64 -> "
                                 "log_probs (T', N, C) float32 (blank = C - 1), "
                                 "out_lengths (N,) int64"})

    @classmethod
    def from_json(cls, text: str, where) -> "Meta":
        try:
            d = json.loads(text)
            if d.get("format") != EXPORT_FORMAT:
                raise ValueError(f"export format {d.get('format')}, this rnntrain reads "
                                 f"{EXPORT_FORMAT}")
            fe = FrontEnd.from_dict(d["frontend"], str(where)) if d.get("frontend") else None
            im = ImageFrontEnd.from_dict(d["image"], str(where)) if d.get("image") else None
            return cls(list(d["labels"]), int(d["input_size"]), int(d["subsample"]), fe,
                       dict(d.get("model") or {}), str(d.get("source", "")), im,
                       check_calibration(d.get("calibration"), where))
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{where}: metadata is not rnntrain's ({e})") from None


def check_calibration(cal, where) -> dict | None:
    """A stored calibration record (``rnntrain calibrate``): a dict whose temperature is a
    positive finite number, else one line naming the file."""
    if cal is None:
        return None
    t = cal.get("temperature") if isinstance(cal, dict) else None
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        raise UserError(f"{where}: its calibration record has no positive finite "
                        f"temperature ({str(cal)[:80]})")
    return dict(cal)


# ---------------------------------------------------------------- engines


class EagerEngine:
    name = "eager"

    def __init__(self, net, device):
        import torch
        self.net, self.device, self.torch = net.eval(), device, torch

    def run(self, x: np.ndarray, lengths: np.ndarray):
        torch = self.torch
        with torch.inference_mode():
            lp, out = self.net(torch.from_numpy(x).to(self.device),
                               torch.from_numpy(lengths.astype(np.int64)))
        return lp.float().cpu().numpy(), out.cpu().numpy()


class TorchScriptEngine(EagerEngine):
    name = "torchscript"


class OnnxEngine:
    name = "onnx"

    def __init__(self, path: Path, threads: int = 0):
        try:
            import onnxruntime as ort
        except ImportError:
            raise UserError(f"{path}: running an ONNX model needs onnxruntime (pip install "
                            f"'rnntrain[export]')") from None
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads  # 0 = ONNX Runtime's default (all cores)
        so.inter_op_num_threads = 1
        try:
            self.sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types
            raise UserError(f"{path}: ONNX Runtime cannot load it "
                            f"({str(e).splitlines()[0][:200]})") from None

    def metadata(self) -> str | None:
        return self.sess.get_modelmeta().custom_metadata_map.get(EXPORT_META)

    def run(self, x: np.ndarray, lengths: np.ndarray):
        lp, out = self.sess.run(None, {"x": np.ascontiguousarray(x, dtype=np.float32),
                                       "lengths": lengths.astype(np.int64)})
        return lp, out


# ---------------------------------------------------------------- loading


def open_model(path, device: str = "cpu", threads: int = 0):
    """A checkpoint, run folder or exported model → (path, Meta, engine, training network
    or None). ``threads``: ONNX Runtime's intra-op threads (0 = its default); torch engines
    follow ``torch.set_num_threads``. ``rnntrain.load`` wraps this in a ``Model``."""
    p = resolve(path)
    kind = kind_of(p)
    if kind == "checkpoint":
        net, meta = load_checkpoint(p)
        from rnntrain.compute.device import pick_device
        dev = pick_device(device)
        return p, meta, EagerEngine(net.to(dev), dev), net
    if kind == "torchscript":
        import torch
        extra = {EXPORT_META: ""}
        try:
            with warnings.catch_warnings():  # deprecated in torch 2.13: see export.py
                warnings.simplefilter("ignore", DeprecationWarning)
                net = torch.jit.load(str(p), map_location="cpu", _extra_files=extra)
        except Exception as e:  # RuntimeError from the TorchScript loader
            raise UserError(f"{p}: cannot load as TorchScript "
                            f"({str(e).splitlines()[0][:200]})") from None
        if not extra[EXPORT_META]:
            raise UserError(f"{p}: a TorchScript file without rnntrain's metadata (not "
                            f"written by rnntrain export)")
        meta = Meta.from_json(extra[EXPORT_META], p)
        return p, meta, TorchScriptEngine(net, torch.device("cpu")), None
    eng = OnnxEngine(p, threads)
    text = eng.metadata()
    if not text:
        raise UserError(f"{p}: an ONNX file without rnntrain's metadata (not written by "
                        f"rnntrain export)")
    return p, Meta.from_json(text, p), eng, None


def load_checkpoint(path: Path):
    """→ (CTCModel in eval mode on the CPU, Meta), through the one checkpoint → model
    builder (``run.checkpoint.load_model``)."""
    from rnntrain.compute.model import total_subsample
    from rnntrain.run import checkpoint as ckpt
    net, ck = ckpt.load_model(path)
    card = ck.card
    meta = Meta(list(card.labels), card.frame_size, total_subsample(card.model_config(path)),
                FrontEnd.from_dict(card.frontend, str(path)) if card.frontend else None,
                dict(card.config.get("model", {})), str(path),
                ImageFrontEnd.from_checkpoint(card.state_dict(), str(path)),
                check_calibration(card.calibration, path))
    return net, meta
