"""Reading run folders: ``rnntrain runs [DIR]`` lists them; report and sweep reuse it.

A run folder holds config.toml (the resolved config), metrics.jsonl (one JSON record per
train window or validation), status.json and train.log. Everything here only reads, so it
is safe on a run that is still training.
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rnntrain.errors import UserError
from rnntrain.artifact.runfolder import CHECKPOINTS, RunFolder


@dataclass
class RunSummary:
    path: str
    status: str = "unknown"      # running | finished | stopped | failed | died | unknown
    epochs_done: int = 0
    epochs: int = 0              # configured
    steps: int = 0
    best_val_ler: float | None = None
    best_epoch: int | None = None  # 1-based epoch of the best validation LER
    last_val_ler: float | None = None
    last_train_loss: float | None = None
    frames_per_s: float | None = None  # median over the train windows (warm-up excluded)
    wall_s: float | None = None
    started: float | None = None
    error: str = ""
    early_stopped: bool = False
    config: dict = field(default_factory=dict, repr=False)

    def row(self) -> dict:
        d = asdict(self)
        d.pop("config")
        return d


def read_metrics(run: str | Path) -> list[dict]:
    """The records of metrics.jsonl; a line cut short by a live writer is ignored."""
    p = RunFolder(run).metrics
    out = []
    try:
        lines = p.read_text().splitlines()
    except OSError:
        return out
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if n != len(lines):
                raise UserError(f"{p}: line {n} is not JSON") from None
    return out


def read_status(run: str | Path) -> dict:
    try:
        return json.loads(RunFolder(run).status.read_text())
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def summarize(run: str | Path) -> RunSummary:
    run = Path(run)
    if not RunFolder(run).metrics.exists() and not RunFolder(run).config.exists():
        raise UserError(f"{run}: not a run folder (no metrics.jsonl or config.toml)")
    s = RunSummary(path=str(run))
    try:
        s.config = tomllib.loads(RunFolder(run).config.read_text())
        s.epochs = int(s.config.get("train", {}).get("epochs", 0))
    except (OSError, tomllib.TOMLDecodeError):
        pass
    st = read_status(run)
    s.status = st.get("status", "unknown")
    if s.status == "running" and st.get("host") == socket.gethostname() and st.get("pid") \
            and not _alive(int(st["pid"])):
        s.status = "died"   # killed without a chance to write its status
    s.error = st.get("error", "")
    recs = read_metrics(run)
    train = [r for r in recs if r.get("split") == "train"]
    val = [r for r in recs if r.get("split") == "val"]
    if train:
        s.steps = max(int(r.get("step", 0)) for r in train)
        s.last_train_loss = train[-1].get("loss")
        fps = sorted(r["frames_per_s"] for r in train[1:] or train if "frames_per_s" in r)
        s.frames_per_s = fps[len(fps) // 2] if fps else None
        s.epochs_done = max(int(r.get("epoch", 0)) for r in train) + 1
    if val:
        best = min(val, key=lambda r: (r.get("ler", math.inf), r.get("step", 0)))
        s.best_val_ler, s.best_epoch = best.get("ler"), int(best.get("epoch", 0)) + 1
        s.last_val_ler = val[-1].get("ler")
        s.epochs_done = max(s.epochs_done, max(int(r.get("epoch", 0)) for r in val) + 1)
    if st.get("epoch") is not None and s.status != "running":
        s.epochs_done = int(st["epoch"])   # completed epochs, as the trainer counted them
    times = [r["time"] for r in recs if "time" in r]
    s.started = st.get("started") or (times[0] if times else None)
    ends = [t for t in (st.get("updated"), times[-1] if times else None) if t]
    end = time.time() if s.status == "running" else max(ends, default=None)
    if s.started and end:
        s.wall_s = max(0.0, end - s.started)
    s.early_stopped = s.status == "finished" and 0 < s.epochs_done < s.epochs
    return s


def find_runs(root: str | Path, max_depth: int = 3) -> list[Path]:
    """Run folders under ``root`` (itself included), by start time."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: no such folder")
    found = []

    def walk(d: Path, depth: int):
        if RunFolder(d).looks_like_run():
            found.append(d)
            return
        if depth < max_depth:
            for c in sorted(d.iterdir()):
                if c.is_dir() and not c.name.startswith(".") and c.name != CHECKPOINTS:
                    walk(c, depth + 1)
    walk(root, 0)
    return found


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def format_table(summaries: list[RunSummary], root: Path | None = None) -> str:
    """A fixed-width table for the terminal."""
    head = ("run", "status", "epochs", "steps", "best val LER", "frames/s", "wall")
    rows = []
    for s in summaries:
        name = os.path.relpath(s.path, root) if root is not None else s.path
        status = s.status + (" (early stop)" if s.early_stopped else "")
        best = "-" if s.best_val_ler is None else f"{s.best_val_ler:.4f} (ep {s.best_epoch})"
        rows.append((name, status, f"{s.epochs_done}/{s.epochs}", str(s.steps), best,
                     _fmt(s.frames_per_s, ".0f"), _duration(s.wall_s)))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i in (0, 1) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in [head] + rows]
    return "\n".join(lines)


def list_runs(root: str | Path = "runs", as_json: bool = False) -> str:
    root = Path(root)
    runs = [summarize(p) for p in find_runs(root)]
    runs.sort(key=lambda s: (s.started or 0, s.path))
    if as_json:
        return json.dumps([s.row() for s in runs], indent=1)
    if not runs:
        return f"no runs under {root}"
    return format_table(runs, root)
