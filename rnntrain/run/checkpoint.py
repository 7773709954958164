"""Checkpoints: written atomically, loaded without running code.

A checkpoint is a dict of tensors and plain values saved with ``torch.save`` and loaded
with ``torch.load(weights_only=True)``: a file from a stranger cannot execute code.
Writing goes through ``fsutil.atomic_write`` (temporary file in the same folder, fsync, rename over the
target, fsync of the folder), so a crash leaves either the old or the new file, never half a file.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch

from rnntrain.data.dataset import check_fits
from rnntrain.errors import UserError, check_regular_file
from rnntrain.fsutil import atomic_write, stale_temps

FORMAT_VERSION = 1
_PAUSE = bool(os.environ.get("RNNTRAIN_TEST_PAUSE"))  # see faults.pause_point


def save_atomic(obj: dict, path: Path):
    """Write ``obj`` to ``path`` so that a crash leaves the old file or the new one; a
    failed write (disk full, ...) is a UserError and leaves the old file untouched."""
    path = Path(path)

    def pause():  # tests kill the process here: the temp file is complete, not renamed
        from rnntrain.run.faults import pause_point
        pause_point("ckpt", int(m.group(1)) if (m := _STEP.search(path.name)) else -1)

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


MODEL_KEYS = ("model", "config", "labels", "input_size")     # what eval/decode need
TRAIN_KEYS = MODEL_KEYS + ("optim", "state")                # what a resume needs


def load(path, need: tuple[str, ...] = ()) -> dict:
    """Load and check a checkpoint; a clear UserError if it is not one of ours or lacks
    one of the entries ``need`` names."""
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
    missing = [k for k in need if k not in ck]
    if missing:
        raise UserError(f"{path}: not a complete rnntrain checkpoint (no "
                        f"{', '.join(missing)})")
    if "state" in need and not (isinstance(ck["state"], dict) and all(
            isinstance(ck["state"].get(k), int) for k in ("epoch", "pos", "step"))):
        raise UserError(f"{path}: checkpoint lacks the training position (epoch, pos, step)")
    if "input_size" in need and not isinstance(ck["input_size"], int) \
            or "labels" in need and not isinstance(ck["labels"], list) \
            or "config" in need and not isinstance(ck["config"], dict) \
            or "model" in need and not isinstance(ck["model"], dict):
        raise UserError(f"{path}: not a complete rnntrain checkpoint (an entry has the "
                        "wrong type)")
    return ck


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


_STEP = re.compile(r"step-(\d+)\.pt$")


def step_checkpoints(folder: Path) -> list[Path]:
    """``step-*.pt`` files, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.search(p.name))]
    return [p for _, p in sorted(found)]


def prune(folder: Path, keep_last: int):
    """Remove all but the newest ``keep_last`` step checkpoints (after a new one is complete)."""
    for p in step_checkpoints(folder)[:-keep_last]:
        p.unlink(missing_ok=True)


# ---- training checkpoints: what a resumed run needs to repeat the uninterrupted one

def save_training(folder: Path | None, name: str, cfg, model, opt, state: dict, ds,
                  keep_last: int):
    """Write ``folder/name`` (rank 0 only: other ranks pass folder=None) and prune.

    Step checkpoints beyond ``keep_last`` are removed only after the new one is complete.
    """
    if folder is None:
        return
    from rnntrain.config import to_dict
    save_atomic({"format": FORMAT_VERSION, "model": model.state_dict(),
                 "optim": opt.state_dict(), "state": dict(state), "config": to_dict(cfg),
                 "labels": list(ds.labels), "input_size": ds.input_size,
                 "image_height": ds.frame_height if ds.is_2d or ds.column_height else 0,
                 "frame_size": ds.frame_size,  # the model's input (2-D: pixels per column)
                 # the image converter's settings (rnntrain-data images), for inference
                 "image_frontend": getattr(ds, "image_frontend", ""),
                 # raw input → frames, when the audio converters recorded it
                 "frontend": getattr(ds, "frontend", None)},
                Path(folder) / name)
    if name.startswith("step-"):
        prune(folder, keep_last)


def _position(ck: dict) -> tuple:
    s = ck["state"]
    return (s["epoch"], s["pos"], s["step"])


def resume_candidates(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``--resume auto``: (usable files, newest training position first; [(unreadable
    file, why)]) among the step checkpoints and last.pt.

    Ordered by the position stored in each file, not by mtime or name: last.pt written at
    an epoch end is newer than the step checkpoint of the same step.
    """
    folder = Path(folder)
    found = [p for p in step_checkpoints(folder) + [folder / "last.pt"] if p.exists()]
    good, broken = [], []
    for p in found:
        try:
            good.append((tuple(-v for v in _position(load(p, TRAIN_KEYS))), p))
        except UserError as e:
            broken.append((p, str(e)))
        except (KeyError, TypeError):
            broken.append((p, f"{p}: checkpoint lacks the training position"))
    return [p for _, p in sorted(good)], broken


def check_matches(ck: dict, path, ds, model_cfg: dict):
    """The checkpoint must fit the data (inputPattSize, alphabet) and the model config."""
    check_fits(ds, ck.get("labels") or [], ck.get("input_size"), f"checkpoint {path}")
    have = ds.frame_height if ds.is_2d or ds.column_height else 0
    if ck.get("image_height", 0) != have:
        raise UserError(f"{path}: checkpoint's image height {ck.get('image_height', 0)} "
                        f"differs from {ds.source} ({have})")
    if ck.get("config", {}).get("model") != model_cfg:
        diff = {k: (ck.get("config", {}).get("model", {}).get(k), v)
                for k, v in model_cfg.items()
                if ck.get("config", {}).get("model", {}).get(k) != v}
        raise UserError(f"{path}: model section differs from the config "
                        f"(checkpoint vs config: {diff})")


def load_for_resume(resume: str, run_dir: Path, ds, model, opt, model_cfg: dict,
                    warn=print) -> dict:
    """Load ``resume`` (a path, or "auto": newest usable in run_dir/checkpoints) into the
    model and optimizer; returns the checkpoint dict (with "path").

    A checkpoint that fails to load (truncated, other format version, other model shape)
    is reported with ``warn`` and, for "auto", the next older one is tried.
    """
    folder = Path(run_dir) / "checkpoints"
    if resume == "auto":  # (stale temp files were removed under the run lock)
        cands, broken = resume_candidates(folder)
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
            ck = load(path, TRAIN_KEYS)
            check_matches(ck, path, ds, model_cfg)
            try:
                model.load_state_dict(ck["model"])
                opt.load_state_dict(ck["optim"])
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
                raise UserError(f"{path}: does not fit this model "
                                f"({(str(e).splitlines() or [type(e).__name__])[0][:200]})"
                                ) from None
            ck["path"] = str(path)
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


def existing_run(run_dir: Path) -> str | None:
    """Why a fresh run must not start in ``run_dir`` (it holds a run's checkpoints, which
    the new run would overwrite and prune), or None."""
    folder = Path(run_dir) / "checkpoints"
    found = step_checkpoints(folder) + [p for p in (folder / "last.pt", folder / "best.pt")
                                        if p.exists()]
    if not found:
        return None
    return (f"run folder {run_dir} already holds checkpoints of a run ({found[-1].name}, "
            f"...); continue it with --resume, or choose another run.dir")


def remove_stale_temps(folder: Path, names: tuple[str, ...] = ("*.pt",)):
    """Temp files (``.NAME.tmpPID``, NAME matching ``names``) of writes interrupted by a
    crash: never valid checkpoints or logs.

    Only call this holding the run lock (``runlog.claim_run_folder``): a live run's temp
    file is the checkpoint it is writing right now.
    """
    folder = Path(folder)
    if folder.is_dir():
        for name in names:
            for p in stale_temps(folder, name):
                if p.is_file():
                    p.unlink(missing_ok=True)
