"""The run folder: every path of a run, its lock, its default name, pruning and stale temps.

    RUN/
      lock              RunLock: one live training per folder (flock)
      config.toml       the resolved config
      status.json       running | finished | stopped | failed (RunLog.set_status)
      metrics.jsonl     one JSON record per train/val/test window (RunLog.metrics)
      train.log         the log lines (RunLog.info)
      tensorboard/      with log.tensorboard = true
      checkpoints/      step-NNNNNNNN.pt (the newest checkpoint.keep_last), last.pt, best.pt

``RunFolder`` is the one place that knows these names: the training loop, ``RunLog``,
``--resume``, ``rnntrain runs``/``sweep`` and inference (a run folder given as a model)
ask it for paths. Only rank 0 writes into it; the other ranks hold no ``RunFolder`` writer
(``train.py`` says so explicitly: ``rank == 0``).

A run folder belongs to one live training at a time (``RunLock``): the writing rank holds
an exclusive ``flock`` on ``RUN/lock`` from before its first write until it exits; the OS
drops the lock when the process dies, however it dies, so a crashed run never leaves the
folder locked. A second training on the folder stops at once naming the holder.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from rnntrain.errors import SharedError, UserError
from rnntrain.fsutil import stale_temps

CHECKPOINTS = "checkpoints"     # the only place this folder name is spelled
LOCK_NAME = "lock"
_STEP = re.compile(r"step-(\d+)\.pt$")
_FILE_SUFFIXES = {".nc", ".json", ".toml", ".pt", ".tsv", ".txt", ".arpa"}


def step_number(path) -> int | None:
    """N of a ``step-N.pt`` file name, else None."""
    m = _STEP.search(Path(path).name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunFolder:
    """The paths of one run under ``root``."""
    root: Path   # the run folder (run.dir, or runs/<default name>)

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def default(cls, config_path: str | None, overrides: list[str],
                resolved_toml: str) -> "RunFolder":
        """runs/<config name, run.name, or "default">[-<overrides>]-<hash of the resolved
        config>: ``runs/default-hidden32-epochs5-1a2b3c``. An override reads as its key's
        last part and its value (``model.hidden=32`` → ``hidden32``); one naming a file as
        the file's stem (``data.train=data/synth_train.nc`` → ``synth_train``). The hash
        tells apart what the short name cannot."""
        stem = Path(config_path).stem if config_path else "default"
        parts = []
        for o in overrides:
            key, _, value = o.lstrip("-").partition("=")
            if key.startswith("run."):
                continue
            value = value.strip().strip('"\'')
            if "/" in value or Path(value).suffix.lower() in _FILE_SUFFIXES:
                parts.append(Path(value).stem)    # a file: its name is what tells runs apart
            else:
                parts.append(key.rsplit(".", 1)[-1] + value)
        ov = "".join(c if c.isalnum() or c in "-_." else "_" for c in "-".join(parts))[:60]
        h = hashlib.sha1(resolved_toml.encode()).hexdigest()[:6]
        return cls(Path("runs") / "-".join(x for x in (stem, ov.strip("-_."), h) if x))

    @classmethod
    def of(cls, path) -> "RunFolder":
        """The run folder ``path`` names: itself, or the parent of its checkpoints folder."""
        p = Path(path)
        return cls(p.parent if p.name == CHECKPOINTS else p)

    # ---- paths
    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    def step(self, n: int) -> Path:
        return self.checkpoints / f"step-{n:08d}.pt"

    def checkpoint(self, name: str) -> Path:
        """``checkpoints/name`` (best.pt, last.pt, step-N.pt)."""
        return self.checkpoints / name

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def lock(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def data(self) -> Path:
        """The lines ``rnntrain finetune`` converted for this run (train.nc, val.nc ...)."""
        return self.root / "data"

    def entries(self) -> frozenset[str]:
        """What a run folder may hold: what a training, ``rnntrain report`` (report/),
        ``rnntrain sweep`` (console.log) and ``rnntrain finetune`` (data/) write into it."""
        return frozenset({p.name for p in (self.lock, self.config, self.status, self.metrics,
                                           self.log, self.checkpoints, self.tensorboard,
                                           self.data)}
                         | {"report", "console.log"})

    def unsuitable(self) -> str | None:
        """Why this folder must not become a run folder, or None. Refused: the root folder,
        the home folder, something that is not a folder, and a folder holding anything but
        run files (``entries`` and ``.NAME.tmpPID`` temp files of those): a run writes
        config.toml, train.log, lock ... into it and would mix them with the user's files
        (``run.dir=/`` wrote a run into /). A new folder, an empty one and a previous run's
        folder are fine."""
        p, run_dir = self.root, self.root
        real = Path(os.path.realpath(p))
        if real == Path(real.anchor):
            return (f"run.dir = {run_dir} is the root folder; give a folder of its own (e.g. "
                    "runs/NAME)")
        if real == Path(os.path.realpath(Path.home())):
            return (f"run.dir = {run_dir} is the home folder; give a folder of its own (e.g. "
                    "runs/NAME)")
        if not p.exists():
            return None
        if not p.is_dir():
            return f"run.dir = {run_dir} is not a folder"
        try:
            names = sorted(os.listdir(p))
        except OSError as e:
            return f"run folder {run_dir} cannot be listed ({e.strerror or e})"
        ok = self.entries()
        other = [n for n in names if n not in ok and not (
            n.startswith(".") and ".tmp" in n and n[1:n.rindex(".tmp")] in ok)]
        if other:
            shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5
                                            else "")
            return (f"run.dir = {run_dir} holds files that are not a run's ({shown}); give a "
                    "new or empty folder, or a previous run's")
        return None

    def looks_like_run(self) -> bool:
        """Has this folder been written by a training (``rnntrain runs`` lists it)?"""
        return self.metrics.exists() or self.config.exists() and self.checkpoints.is_dir()

    # ---- checkpoints
    def step_checkpoints(self) -> list[Path]:
        """``step-*.pt`` files, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [(n, p) for p in self.checkpoints.iterdir()
                 if (n := step_number(p)) is not None]
        return [p for _, p in sorted(found)]

    def training_checkpoints(self) -> list[Path]:
        """The files ``--resume auto`` chooses among: step checkpoints and last.pt."""
        return [p for p in self.step_checkpoints() + [self.last] if p.exists()]

    def model_checkpoint(self) -> Path | None:
        """What inference reads from a run folder: best.pt, else last.pt; None if neither."""
        for p in (self.best, self.last):
            if p.is_file():
                return p
        return None

    def prune(self, keep_last: int):
        """Remove all but the newest ``keep_last`` step checkpoints (after a new one is
        complete)."""
        for p in self.step_checkpoints()[:-keep_last]:
            p.unlink(missing_ok=True)

    def existing_run(self) -> str | None:
        """Why a fresh run must not start here (the folder holds a run's checkpoints, which
        the new run would overwrite and prune), or None."""
        found = self.step_checkpoints() + [p for p in (self.last, self.best) if p.exists()]
        if not found:
            return None
        return (f"run folder {self.root} already holds checkpoints of a run "
                f"({found[-1].name}, ...); continue it with --resume, or choose another "
                "run.dir")

    def remove_stale_temps(self):
        """Temp files (``.NAME.tmpPID``) of writes a crash interrupted: never valid
        checkpoints or run files. Only call this holding the run lock (``claim``): a live
        run's temp file is the checkpoint it is writing right now."""
        for folder, names in ((self.checkpoints, ("*.pt",)),
                              (self.root, (self.config.name, self.status.name))):
            if folder.is_dir():
                for name in names:
                    for p in stale_temps(folder, name):
                        if p.is_file():
                            p.unlink(missing_ok=True)

    # ---- ownership
    def claim(self, comm) -> tuple["RunLock | None", str | None]:
        """Rank 0: check that the folder may be a run folder (``unsuitable``), lock it for
        this run and (only now, under the lock) remove temp files that crashed writes left. Every rank raises the same UserError when the
        folder is in use or cannot be locked. Returns (the held lock on rank 0, None
        elsewhere: release it when the run ends; why a fresh run must not start here, or
        None), agreed in one start-up collective."""
        from rnntrain.parallel import collectives
        lock, verdict = None, (None, None)
        if comm.rank == 0:
            try:
                if why := self.unsuitable():  # before the lock file is created
                    raise UserError(why)
                lock = RunLock(self.root).acquire()
                self.remove_stale_temps()
                verdict = (None, self.existing_run())
            except UserError as e:
                verdict = (str(e), None)
        error, existing = collectives.from_root(comm, verdict)
        if error:
            if lock is not None:
                lock.release()
            raise SharedError(error)  # every rank got the verdict
        return lock, existing

    def make(self):
        """Create the folder and its checkpoints folder (rank 0, before the first write)."""
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"run folder {self.root} is not writable ({e.strerror})") from None


class RunLock:
    """Exclusive ownership of a run folder by this process (``flock`` on ``RUN/lock``).

    The lock file stays in the folder (removing it would let a third process lock a new
    inode while a second still holds the old one); what matters is the lock, which the
    kernel holds exactly as long as this process keeps the file open. The file's content
    names the holder (host, pid, start time) for the message a second training prints.
    flock works across processes of one machine and, on Linux, across NFS clients (it is
    mapped onto NFS byte-range locks); on file systems without locks it fails loudly.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = RunFolder(self.folder).lock
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        """Take the lock or raise UserError naming the folder and the live holder."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise UserError(f"run folder {self.folder} is not writable "
                            f"({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"run folder {self.folder} is in use by another training "
                                f"({holder}); wait for it to end or stop it, or choose "
                                "another run.dir") from None
            raise UserError(f"run folder {self.folder}: cannot lock {self.path} "
                            f"({e.strerror or e}; the file system may not support locks)"
                            ) from None
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "time": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError:
            pass  # the lock is what counts; the holder info is a courtesy (disk full)
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self):
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *_):
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return (f"host {info['host']}, pid {info['pid']}, started {info['started']}")
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown: it is starting or did not record itself"
