"""The run folder: resolved config, metrics.jsonl, train.log, status.json, checkpoints/.

``status.json`` says whether the run is running, finished, stopped (by a signal, resumable)
or failed (with the error), and which process on which host runs it, so ``rnntrain runs``
can tell a crashed run (its process is gone) from a live one.

Only rank 0 writes (``RunLog(None)`` is the silent stand-in used on other ranks).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write


def default_run_dir(config_path: str | None, overrides: list[str], resolved_toml: str) -> Path:
    """runs/<config name (or run.name)>[-<overrides>]-<hash of the resolved config>."""
    stem = Path(config_path).stem if config_path else "run"
    ov = "-".join(o.lstrip("-").split(".", 1)[-1].replace("=", "") for o in overrides
                  if not o.lstrip("-").startswith("run."))
    ov = "".join(c if c.isalnum() or c in "-_." else "_" for c in ov)[:60]
    h = hashlib.sha1(resolved_toml.encode()).hexdigest()[:6]
    return Path("runs") / "-".join(x for x in (stem, ov, h) if x)


class RunLog:
    def __init__(self, folder: Path | None):
        self.folder = folder
        self._metrics = self._log = None
        if folder is None:
            return
        try:
            (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
            self._metrics = open(folder / "metrics.jsonl", "a", buffering=1)
            self._log = open(folder / "train.log", "a", buffering=1)
        except OSError as e:
            raise UserError(f"run folder {folder} is not writable ({e.strerror})") from None

    @property
    def checkpoints(self) -> Path | None:
        return self.folder / "checkpoints" if self.folder else None

    def write_text(self, name: str, text: str):
        if self.folder:
            atomic_write(self.folder / name, text)

    def set_status(self, status: str, **fields):
        """Write status.json: running | finished | stopped | failed, plus ``fields``."""
        if not self.folder:
            return
        old = {}
        try:
            old = json.loads((self.folder / "status.json").read_text())
        except (OSError, ValueError):
            pass
        now = round(time.time(), 3)
        rec = {"status": status, "started": old.get("started", now) if status != "running"
               else now, "updated": now, "pid": os.getpid(), "host": socket.gethostname()}
        rec.update(fields)
        self.write_text("status.json", json.dumps(rec) + "\n")

    def finish(self, exc: BaseException | None, stop_signal: str | None, state: dict):
        """The final status.json of a run: failed (with the error), stopped (a signal or
        Ctrl-C; resumable) or finished (all epochs, or early stopping)."""
        stopped = stop_signal or isinstance(exc, KeyboardInterrupt)
        status = "stopped" if stopped else "failed" if exc is not None else "finished"
        best = state.get("best_ler", float("inf"))
        self.set_status(status, epoch=state.get("epoch"), step=state.get("step"),
                        best_ler=best if best != float("inf") else None,
                        error=f"{type(exc).__name__}: {exc}" if status == "failed" else "")

    def metrics(self, **record):
        if self._metrics:
            record.setdefault("time", round(time.time(), 3))
            _write(self._metrics, json.dumps(record) + "\n")

    def info(self, msg: str, echo: bool = True):
        if self._log:
            _write(self._log, time.strftime("%H:%M:%S ") + msg + "\n")
        if echo and self.folder is not None:
            from tqdm import tqdm
            tqdm.write(msg, file=sys.stderr)

    def close(self):
        for f in (self._metrics, self._log):
            if f:
                _write(f, None)


def _write(fh, text: str | None):
    """Write (None: close), naming the file when the disk is full (the CLI prints that on
    one line)."""
    try:
        fh.write(text) if text is not None else fh.close()
    except OSError as e:
        raise OSError(e.errno, e.strerror, fh.name) from None
