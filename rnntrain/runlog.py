"""The run folder: resolved config, metrics.jsonl, train.log, checkpoints/.

Only rank 0 writes (``RunLog(None)`` is the silent stand-in used on other ranks).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from .errors import UserError


def default_run_dir(config_path: str | None, overrides: list[str], resolved_toml: str) -> Path:
    """runs/<config name>[-<overrides>]-<hash of the resolved config>."""
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
            tmp = self.folder / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.folder / name)

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
