"""The run's log: metrics.jsonl, train.log, status.json, the resolved config (and
TensorBoard events), written into the run folder (``runfolder.RunFolder`` names the files).

``status.json`` says whether the run is running, finished, stopped (by a signal, resumable)
or failed (with the error), and which process on which host runs it, so ``rnntrain runs``
can tell a crashed run (its process is gone) from a live one.

Only rank 0 writes: the other ranks hold ``RunLog(None)``, which writes nothing (the
training loop decides who writes: ``rank == 0``; RunLog only logs).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write, drop_torn_tail
from rnntrain.artifact.runfolder import RunFolder


class RunLog:
    """``run``: the run folder to write into (None: write nothing, as on ranks other than
    0); a plain path is taken as a run folder. ``log``: the config's [log] section (None:
    defaults). With ``log.tensorboard`` every metrics record also goes to TensorBoard event
    files in ``RUN/tensorboard``."""

    def __init__(self, run: RunFolder | Path | None, log=None):
        if run is not None and not isinstance(run, RunFolder):
            run = RunFolder(run)
        self.run = run
        self.folder = run.root if run is not None else None
        self._metrics = self._log = self._tb = None
        progress = getattr(log, "progress", "auto")
        # a tqdm bar redraws its line every second: fine on a terminal, thousands of lines
        # in a Slurm/nohup/CI log. There, a plain line every log.every_steps steps instead.
        self.bar = progress == "bar" or (progress == "auto" and _is_terminal(sys.stderr))
        self._t_progress = None
        if run is None:
            return
        if getattr(log, "tensorboard", False):
            self._tb = TensorBoardLog(run.tensorboard)
        run.make()
        try:
            # a session killed mid-write may have left a line cut short: cut it off, so
            # this session's first record starts a line of its own
            torn = {f.name: drop_torn_tail(f) for f in (run.metrics, run.log)}
            self._metrics = open(run.metrics, "a", buffering=1)
            self._log = open(run.log, "a", buffering=1)
        except OSError as e:
            raise UserError(f"run folder {run.root} is not writable ({e.strerror})") from None
        for name, n in torn.items():
            if n:
                self.info(f"{name}: dropped the last {n} bytes, a line cut short when the "
                          f"previous session was killed", echo=False)

    def write_text(self, name: str, text: str):
        """Replace ``RUN/name`` atomically; on a full disk the error names the file and
        no temp file is left behind."""
        if self.folder:
            try:
                atomic_write(self.folder / name, text)  # no temp file left on failure
            except OSError as e:  # name the file, not its temp file (the CLI prints it)
                raise OSError(e.errno, e.strerror, str(self.folder / name)) from None

    def set_status(self, status: str, resumed: bool = False, **fields):
        """Write status.json: running | finished | stopped | failed, plus ``fields``.
        ``started`` is the time the run first started: kept when it is resumed."""
        if not self.folder:
            return
        old = {}
        try:
            old = json.loads(self.run.status.read_text())
        except (OSError, ValueError):
            pass
        now = round(time.time(), 3)
        keep = status != "running" or resumed
        rec = {"status": status, "started": old.get("started", now) if keep else now,
               "updated": now, "pid": os.getpid(), "host": socket.gethostname()}
        if resumed:
            rec["resumed"] = now
        elif status != "running" and "resumed" in old:
            rec["resumed"] = old["resumed"]
        rec.update(fields)
        self.write_text(self.run.status.name, json.dumps(rec) + "\n")

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
        if self._tb:
            self._tb.add(record)

    def progress(self, epoch: int, epochs: int, pos: int, steps: int, rec: dict):
        """Without a bar: one plain line per metrics record (log.every_steps steps)."""
        if self.bar or self.folder is None:
            return
        now = time.monotonic()
        last, self._t_progress = self._t_progress, (now, pos)
        done = None if last is None else pos - last[1] if pos > last[1] else pos  # new epoch
        rate = f", {done / max(now - last[0], 1e-9):.2f} step/s" if done else ""
        print(f"epoch {epoch + 1}/{epochs} step {pos}/{steps}{rate}: loss {rec['loss']:.3f}, "
              f"ler {rec['ler']:.3f}, {rec['frames_per_s']:.0f} frames/s", file=sys.stderr,
              flush=True)

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
        if self._tb:
            self._tb.close()
            self._tb = None


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class TensorBoardLog:
    """The metrics.jsonl records as TensorBoard scalars, at their global ``step``.

    Tags: ``<split>/<field>`` for every number (train/loss, val/ler, train/compute_s, ...),
    ``<split>/<field>/<i>`` for per-worker lists (worker_compute_s) and
    ``<split>/rank<r>/<field>`` for the per-rank time split under MPI. Flushed after each
    record, so a running TensorBoard shows the run live.
    """

    def __init__(self, folder: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("log.tensorboard = true needs the tensorboard package: "
                            "pip install tensorboard (or rnntrain[tensorboard])") from None
        self._cls, self.folder, self.writer = SummaryWriter, folder, None

    def add(self, record: dict):
        step = int(record.get("step", 0))
        if self.writer is None:
            # purge_step: after a resume, events the interrupted run wrote past this step
            # are hidden, so the curves do not fold back on themselves
            self.writer = self._cls(str(self.folder), purge_step=step)
        split = record.get("split", "train")
        wall = record.get("time")
        for key, value in record.items():
            if key in ("split", "epoch", "step", "time"):
                continue
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"{split}/{key}", value, step, walltime=wall)
            elif isinstance(value, list) and key == "ranks":
                for r, split_r in enumerate(value):
                    for k, v in split_r.items():
                        self.writer.add_scalar(f"{split}/rank{r}/{k}", v, step, walltime=wall)
            elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
                for i, v in enumerate(value):
                    self.writer.add_scalar(f"{split}/{key}/{i}", v, step, walltime=wall)
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()


def _write(fh, text: str | None):
    """Write (None: close), naming the file when the disk is full (the CLI prints that on
    one line)."""
    try:
        fh.write(text) if text is not None else fh.close()
    except OSError as e:
        raise OSError(e.errno, e.strerror, fh.name) from None
