"""``rnntrain export``: a model as TorchScript or ONNX, checked against the training network.

Both formats hold ``rnntrain.infer.graph.ExportCTC`` (the training weights, fp32) with a
variable batch and length: inputs ``x`` (T, N, F) float32 zero-padded and ``lengths`` (N,)
int64; outputs ``log_probs`` (T', N, C) and ``out_lengths`` (N,). The labels, input size,
stacking and front end (feature settings and normalisation statistics; for image models
the image converter's settings and input height) travel inside the file as JSON: a TorchScript extra file ``rnntrain.json``, an ONNX metadata property of the
same name. ``rnntrain.load`` reads either back.

Every export is checked before it is kept: the written file is loaded again (TorchScript,
or ONNX Runtime) and run on real inputs, a padded batch of unequal lengths, whose
log-probabilities must match the training network's within 1e-4 on every valid frame.

Models with the convolutional front end (images, ``model.frontend = "conv"``) export with
it (``graph.ExportConv``): the exported graph takes any number of columns and gives the
output lengths after pooling, ceil(W / pool) per block; ``rnntrain.load`` of the export
prepares image files with the image front end it carries, as the checkpoint does.

ONNX is written by the TorchScript-based exporter (``dynamo=False``): the torch.export one
of torch 2.13 fixes the sequence length of ``nn.LSTM`` at the example's (its output fails
on any other length), which this file checks for. RNNLIB's peephole cell exports to
TorchScript only: its time loop has no ONNX form with a variable length.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_path, check_output

FORMATS = ("torchscript", "onnx")
TOLERANCE = 1e-4
OPSET = 17


def check_inputs(model, frames: list[np.ndarray] | None = None, seed: int = 0):
    """A padded batch for checking: the given frames, else random frames of three unequal
    lengths (one not a multiple of the stacking) → (x (T, N, F), lengths (N,))."""
    if not frames:
        rng = np.random.default_rng(seed)
        frames = [rng.standard_normal((n, model.input_size)).astype(np.float32)
                  for n in (53, 37, 11)]
    lengths = np.array([len(f) for f in frames], dtype=np.int64)
    x = np.zeros((int(lengths.max()), len(frames), model.input_size), np.float32)
    for i, f in enumerate(frames):
        x[:len(f), i] = f
    return x, lengths


def training_frames(model, count: int = 8) -> tuple[list[np.ndarray], str]:
    """Up to ``count`` sequences of the data the checkpoint was trained and validated on
    (its config's data.val, data.test or data.train .nc file, when it is still there and
    fits the model; images as the model's padded columns) → (frames, where); ([], "")
    when none is available."""
    from rnntrain.data.dataset import Dataset
    from rnntrain.errors import UserError as _UE
    from rnntrain.run.checkpoint import read
    try:
        data = read(model.path).card.config.get("data", {})
    except (_UE, AttributeError):
        return [], ""
    for key in ("val", "test", "train"):
        path = data.get(key) or ""
        if not path.endswith(".nc") or not os.path.isfile(path):
            continue
        try:
            ds = Dataset.open(path, chunk_frames=1, need_targets=False)
            if ds.is_2d:  # columns padded to the model's height, as training served them
                ds.set_pad_height(model.image.height if model.image is not None else
                                  model.input_size // max(ds.input_size, 1), "export check")
            if ds.frame_size != model.input_size:
                continue
            n = min(count, ds.num_seqs)
            got: dict = {}
            k = 0
            while len(got) < n and k < len(ds.chunks):  # chunks of one sequence or more
                got.update(ds.load_chunk(k))
                k += 1
        except _UE:
            continue
        return [got[i] for i in range(n)], f"{path} ({n} sequences)"
    return [], ""


def max_diff(a: np.ndarray, b: np.ndarray, out_len: np.ndarray) -> float:
    """Largest |a - b| over the valid frames of (T', N, C) log-probabilities."""
    worst = 0.0
    for i, n in enumerate(out_len.tolist()):
        worst = max(worst, float(np.abs(a[:n, i] - b[:n, i]).max(initial=0.0)))
    return worst


def export(model, out, fmt: str, check_frames: list[np.ndarray] | None = None) -> Path:
    """Write ``model`` (an ``api.Model`` loaded from a checkpoint) to ``out``; returns the
    path.

    check_frames: real utterances (model-ready frames) to check on; default: sequences of
    the checkpoint's own data files (``training_frames``), else random frames.
    """
    import torch
    from rnntrain.infer.graph import ExportCTC
    from rnntrain.infer.model import EXPORT_META, open_model
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if model.net is None:
        raise UserError(f"{model.path}: already an exported model ({model.engine.name}); "
                        f"export from its checkpoint or run folder")
    cell = model.meta.model.get("cell", "lstm")
    if fmt == "onnx" and cell != "lstm":
        raise UserError(f"{model.path}: cell '{cell}' (RNNLIB's peephole LSTM) cannot be "
                        f"exported to ONNX (its time loop has no variable-length ONNX form); "
                        f"use --format torchscript")
    out = check_out(out)
    import copy
    graph = ExportCTC(copy.deepcopy(model.net).cpu()).eval()  # the model may be on a GPU
    if not check_frames:
        check_frames = training_frames(model)[0]
    x, lengths = check_inputs(model, check_frames)
    import dataclasses
    # the checkpoint's file name, not its absolute path: the file travels to other machines
    meta = dataclasses.replace(model.meta, source=Path(model.meta.source).name)
    try:
        with atomic_path(out) as tmp:  # nothing under the name unless it checks out
            with torch.no_grad():
                if fmt == "torchscript":
                    with warnings.catch_warnings():
                        # torch 2.13 deprecates TorchScript in favour of torch.export, whose
                        # files need torch to run too; TorchScript still runs from C++
                        # (libtorch) without Python, which is what this format is for
                        warnings.simplefilter("ignore", DeprecationWarning)
                        scripted = torch.jit.script(graph)
                        torch.jit.save(scripted, str(tmp),
                                       _extra_files={EXPORT_META: meta.to_json()})
                else:
                    _write_onnx(graph, tmp, meta)
            # the check runs on the written file, through the same loader users get
            diff = check(model.engine, open_model(tmp)[2], x, lengths)
            if not diff <= TOLERANCE:
                raise UserError(f"{out}: the {fmt} export differs from the model by "
                                f"{diff:.2e} (more than {TOLERANCE:g}) in log-probability; "
                                "not written")
    except OSError as e:  # a write that fails midway: disk full, the folder removed
        raise UserError(f"--out {out}: cannot write it ({e.strerror or e})") from None
    except RuntimeError as e:
        if "writ" not in str(e):  # torch.jit.save: "PytorchStreamWriter failed writing"
            raise
        raise UserError(f"--out {out}: cannot write it ({str(e).splitlines()[0][:200]})") \
            from None
    return out


def check_out(out, inputs=()) -> Path:
    """``--out``: a file name in an existing, writable folder, not a folder and not one of
    ``inputs`` (one line otherwise; fsutil.check_output), checked before any work."""
    return check_output(out, inputs)


def check(reference, exported, x: np.ndarray, lengths: np.ndarray) -> float:
    """Max |log-prob difference| of two engines on the batch x (T, N, F), lengths (N,)."""
    a, out_a = reference.run(x, lengths)
    b, out_b = exported.run(x, lengths)
    if not np.array_equal(out_a, out_b) or a.shape != b.shape:
        return float("inf")
    return max_diff(a, b, out_a)


def _write_onnx(graph, path: Path, meta):
    import torch
    try:
        import onnx
    except ImportError:
        raise UserError("--format onnx needs the onnx and onnxruntime packages "
                        "(pip install 'rnntrain[export]')") from None
    # a small example: the exported graph takes any batch and length (dynamic axes)
    ex = (torch.zeros(7, 2, meta.input_size), torch.tensor([7, 5]))
    with warnings.catch_warnings():
        # the TorchScript-based exporter is deprecated, but the only one whose nn.LSTM
        # keeps a variable length (module docstring); its batch-size warning concerns
        # initial states passed as inputs, which this graph does not have
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, ex, str(path), dynamo=False, opset_version=OPSET,
                          input_names=["x", "lengths"],
                          output_names=["log_probs", "out_lengths"],
                          dynamic_axes={"x": {0: "T", 1: "N"}, "lengths": {0: "N"},
                                        "log_probs": {0: "T_out", 1: "N"},
                                        "out_lengths": {0: "N"}})
    m = onnx.load(str(path))
    prop = m.metadata_props.add()
    prop.key, prop.value = "rnntrain.json", meta.to_json()
    m.producer_name = "rnntrain"
    onnx.save(m, str(path))
