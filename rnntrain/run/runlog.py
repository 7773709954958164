"""The run folder: resolved config, metrics.jsonl, train.log, status.json, checkpoints/.

A run folder belongs to one live training at a time (``RunLock``): the writing rank holds
an exclusive ``flock`` on ``RUN/lock`` from before its first write until it exits; the OS
drops the lock when the process dies, however it dies, so a crashed run never leaves the
folder locked. A second training on the folder stops at once naming the holder.

``status.json`` says whether the run is running, finished, stopped (by a signal, resumable)
or failed (with the error), and which process on which host runs it, so ``rnntrain runs``
can tell a crashed run (its process is gone) from a live one.

Only rank 0 writes (``RunLog(None)`` is the silent stand-in used on other ranks).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from rnntrain.errors import SharedError, UserError
from rnntrain.fsutil import atomic_write


def default_run_dir(config_path: str | None, overrides: list[str], resolved_toml: str) -> Path:
    """runs/<config name, run.name, or "default">[-<overrides>]-<hash of the resolved
    config>: ``runs/default-hidden32-epochs5-1a2b3c``. An override reads as its key's last
    part and its value (``model.hidden=32`` → ``hidden32``); one naming a file as the
    file's stem (``data.train=data/synth_train.nc`` → ``synth_train``). The hash tells
    apart what the short name cannot."""
    stem = Path(config_path).stem if config_path else "default"
    parts = []
    for o in overrides:
        key, _, value = o.lstrip("-").partition("=")
        if key.startswith("run."):
            continue
        value = value.strip().strip('"\'')
        if "/" in value or Path(value).suffix.lower() in _FILE_SUFFIXES:
            parts.append(Path(value).stem)        # a file: its name is what tells runs apart
        else:
            parts.append(key.rsplit(".", 1)[-1] + value)
    ov = "".join(c if c.isalnum() or c in "-_." else "_" for c in "-".join(parts))[:60]
    h = hashlib.sha1(resolved_toml.encode()).hexdigest()[:6]
    return Path("runs") / "-".join(x for x in (stem, ov.strip("-_."), h) if x)


_FILE_SUFFIXES = {".nc", ".json", ".toml", ".pt", ".tsv", ".txt", ".arpa"}


LOCK_NAME = "lock"


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
        self.path = self.folder / LOCK_NAME
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


# What a run folder may hold: what a training, ``rnntrain report`` (report/) and ``rnntrain
# sweep`` (console.log) write into it, and the temp files of their interrupted writes
RUN_ENTRIES = frozenset({"lock", "config.toml", "status.json", "metrics.jsonl", "train.log",
                         "checkpoints", "tensorboard", "report", "console.log"})


def unsuitable_run_folder(run_dir) -> str | None:
    """Why ``run_dir`` must not become a run folder, or None. Refused: the root folder, the
    home folder, something that is not a folder, and a folder holding anything but run
    files (``RUN_ENTRIES`` and ``.NAME.tmpPID`` temp files of those): a run writes
    config.toml, train.log, lock ... into it and would mix them with the user's files
    (``run.dir=/`` wrote a run into /). A new folder, an empty one and a previous run's
    folder are fine."""
    p = Path(run_dir)
    real = Path(os.path.realpath(p))
    if real == Path(real.anchor):
        return f"run.dir = {run_dir} is the root folder; give a folder of its own (e.g. runs/NAME)"
    if real == Path(os.path.realpath(Path.home())):
        return f"run.dir = {run_dir} is the home folder; give a folder of its own (e.g. runs/NAME)"
    if not p.exists():
        return None
    if not p.is_dir():
        return f"run.dir = {run_dir} is not a folder"
    try:
        names = sorted(os.listdir(p))
    except OSError as e:
        return f"run folder {run_dir} cannot be listed ({e.strerror or e})"
    other = [n for n in names if n not in RUN_ENTRIES and not (
        n.startswith(".") and ".tmp" in n and n[1:n.rindex(".tmp")] in RUN_ENTRIES)]
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        return (f"run.dir = {run_dir} holds files that are not a run's ({shown}); give a new "
                "or empty folder, or a previous run's")
    return None


def claim_run_folder(comm, run_dir: Path) -> tuple[RunLock | None, str | None]:
    """Rank 0: check that ``run_dir`` may be a run folder (``unsuitable_run_folder``), lock
    it for this run and (only now, under the lock) remove temp files that crashed writes
    left. Every rank raises the same UserError when the folder
    is in use or cannot be locked. Returns (the held lock on rank 0, None elsewhere:
    release it when the run ends; why a fresh run must not start here, or None: the
    folder holds another run's checkpoints), agreed in one start-up collective."""
    from rnntrain.parallel import collectives
    from rnntrain.run import checkpoint as ckpt
    lock, verdict = None, (None, None)
    if comm.rank == 0:
        try:
            if why := unsuitable_run_folder(run_dir):  # before the lock file is created
                raise UserError(why)
            lock = RunLock(run_dir).acquire()
            ckpt.remove_stale_temps(Path(run_dir) / "checkpoints")
            ckpt.remove_stale_temps(Path(run_dir), ("config.toml", "status.json"))
            verdict = (None, ckpt.existing_run(run_dir))
        except UserError as e:
            verdict = (str(e), None)
    error, existing = collectives.from_root(comm, verdict)
    if error:
        if lock is not None:
            lock.release()
        raise SharedError(error)  # every rank got the verdict
    return lock, existing


class RunLog:
    """``log``: the config's [log] section (None: defaults). With ``log.tensorboard`` every
    metrics record also goes to TensorBoard event files in ``folder/tensorboard``."""

    def __init__(self, folder: Path | None, log=None):
        self.folder = folder
        self._metrics = self._log = self._tb = None
        progress = getattr(log, "progress", "auto")
        # a tqdm bar redraws its line every second: fine on a terminal, thousands of lines
        # in a Slurm/nohup/CI log. There, a plain line every train.log_every steps instead.
        self.bar = progress == "bar" or (progress == "auto" and _is_terminal(sys.stderr))
        self._t_progress = None
        if folder is None:
            return
        if getattr(log, "tensorboard", False):
            self._tb = TensorBoardLog(folder / "tensorboard")
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
            old = json.loads((self.folder / "status.json").read_text())
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
        if self._tb:
            self._tb.add(record)

    def progress(self, epoch: int, epochs: int, pos: int, steps: int, rec: dict):
        """Without a bar: one plain line per metrics record (train.log_every steps)."""
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
