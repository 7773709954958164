"""Model paths: what a MODEL argument names, resolved in one place.

A model is given as a checkpoint file (``.pt``), a file written by ``rnntrain export``
(TorchScript or ONNX), a run folder (its ``checkpoints/best.pt``, else ``last.pt``) or
the name of a zoo model (``rnntrain models``). A path that exists wins over a zoo model of
the same name, so a folder a user made is never shadowed. Several models (a crossfold
folder, ``a,b,c``) are split by ``rnntrain.infer.ensemble.model_paths`` into these.
"""
from __future__ import annotations

from pathlib import Path

from rnntrain.artifact import zoo
from rnntrain.artifact.runfolder import RunFolder
from rnntrain.errors import UserError, check_regular_file


def resolve(path, what: str = "") -> Path:
    """A run folder → its best checkpoint (else last.pt); a zoo name → the zoo's file
    (its size and SHA-256 checked against its card); a file → itself. ``what``: how the
    caller names the value in messages (default: the path itself)."""
    p = Path(path)
    where = f"{what} = {path}" if what else str(p)
    if p.is_dir():
        run = RunFolder.of(p)  # a run folder or its checkpoints folder
        found = run.model_checkpoint() or next(
            (c for c in (p / "best.pt", p / "last.pt") if c.is_file()), None)
        if found is None:
            raise UserError(f"{where}: a folder without {run.best.relative_to(run.root)} "
                            f"(not a run folder, or a run that has not finished an epoch)")
        return found
    if not p.exists():
        if zoo.find(str(path)) is not None:
            return zoo.verify(str(path))
        raise UserError(f"{where}: model not found (a checkpoint, a run folder, an "
                        f"exported model or a zoo name; {zoo.describe_names()})")
    check_regular_file(p, "model")  # a FIFO would block the read, /dev/zero never end
    return p


def exists(spec: str) -> bool:
    """Does ``spec`` name one model as it is (an existing path or a zoo name)?"""
    return Path(spec).exists() or zoo.find(spec) is not None
