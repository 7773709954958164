"""Files written whole or not at all, files read whole within bounds, and checksums.

Every writer of a file a user or a later run relies on (checkpoints, run-folder files,
decoded hypotheses, NetCDF files, manifests, sweep results, traces) goes through
``atomic_write`` or ``atomic_path``: the bytes go to a temporary file in the target's
folder (same file system, so the rename is atomic), the file is fsync'd, renamed over the
target, and the folder is fsync'd so that the rename itself survives a power cut. A crash
at any moment leaves the old file or the new one, never half a file; on any error the
temporary file is removed and the target is untouched.

Every small input read whole into memory (text for language models, Kaldi tables, lists)
goes through ``read_bytes`` / ``read_text``: the path must be a regular file (a FIFO would
block forever, /dev/zero never ends: see ``rnntrain.errors.file_problem``) of at most
``limit`` bytes, and a text that is not UTF-8 is named with its line.

Temporary names are ``.NAME.tmpPID`` (hidden, and unique per process so that two writers
of the same file never share one); ``stale_temps`` finds those a killed process left, and
the next write of the same file removes those of dead processes.

An output a user names (``--out``) never destroys what it points at (``write_target``,
``check_output``): a symlink is followed and its target replaced, a FIFO or device
(``/dev/null``, ``--out >(cmd)``) is written through, a folder or block device is refused,
and an output that is also an input is refused before any work.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Union

from rnntrain.errors import DataError, UserError, check_regular_file

Payload = Union[bytes, str, Callable[[IO[bytes]], None]]

READ_LIMIT = 1 << 30
"""Default most bytes ``read_bytes``/``read_text`` hold in memory (1 GiB)."""


def read_bytes(path, what: str = "file", limit: int = READ_LIMIT, error=UserError) -> bytes:
    """The whole content of ``path``: a regular file (symlinks followed) of at most
    ``limit`` bytes; otherwise ``error("PATH: why")`` (not found, a FIFO, a device, a
    folder, too large). ``what`` names the file's role in the message ("text file")."""
    check_regular_file(path, what, error)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)  # a file that grew since the check stops here too
    except OSError as e:
        raise error(f"{path}: {what} cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise error(f"{path}: {what} is larger than {limit:,} bytes (the most read into "
                    f"memory)")
    return data


def read_text(path, what: str = "file", limit: int = READ_LIMIT, error=UserError) -> str:
    """``read_bytes`` decoded as UTF-8; a byte that is not UTF-8 is named with its line:
    ``error("PATH line N: not UTF-8 text (byte 0xNN)")``."""
    data = read_bytes(path, what, limit, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise error(f"{path} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x})"
                    ) from None


def temp_path(path) -> Path:
    """The temporary name ``atomic_write`` uses for ``path`` in this process."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def stale_temps(folder, name_glob: str = "*") -> list[Path]:
    """Temporary files of interrupted writes of ``name_glob`` in ``folder``."""
    folder = Path(folder)
    return sorted(folder.glob(f".{name_glob}.tmp*")) if folder.is_dir() else []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def remove_dead_temps(path) -> list[Path]:
    """Remove the temporary files of ``path`` (``.NAME.tmpPID``) whose process is gone:
    what an export or a conversion killed mid-write left beside its output. The next
    write of the same output calls this, so no such file outlives one more run. A temp
    file of a live process (this one included) is kept: it is a write in progress.
    (A writer of the same name on another host of a shared file system is not seen; two
    writers of one output race anyway.) Returns the files removed."""
    path = Path(path)
    gone = []
    for p in stale_temps(path.parent, glob.escape(path.name)):
        tail = p.name[len(path.name) + 5:]  # after ".NAME.tmp"
        if tail.isdigit() and int(tail) != os.getpid() and not _pid_alive(int(tail)) \
                and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone



def drop_torn_tail(path, block: int = 1 << 16) -> int:
    """Cut an append-only text log back to its last complete line; the number of bytes cut.

    A process killed inside ``write`` can leave its last line half written (the kernel
    checks for a fatal signal between pages, so a line that crosses a page boundary can end
    up cut). Whoever appends next (the resumed run, which owns the folder) would glue its
    first line onto that fragment and spoil both; so it calls this first. A missing or
    empty file, or one that ends in a newline, is left as it is."""
    try:
        fh = open(path, "r+b")
    except FileNotFoundError:
        return 0
    with fh:
        size = end = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        while end > 0:  # backwards, a block at a time, to the last newline
            start = max(0, end - block)
            fh.seek(start)
            cut = fh.read(end - start).rfind(b"\n")
            if cut >= 0:
                end = start + cut + 1
                break
            end = start
        fh.truncate(end)
        return size - end


def fsync_dir(folder):
    """Make a rename (or a new file) in ``folder`` durable. A no-op where folders cannot
    be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (e.g. certain network mounts) refuse: nothing to do
        pass
    finally:
        os.close(fd)


def commit(tmp, path, before_rename: Callable[[], None] | None = None):
    """fsync ``tmp`` (complete, closed), rename it over ``path``, fsync the folder.

    before_rename: called between the fsync and the rename (the fault-injection tests
    kill the process there: a complete temporary file, the target not yet replaced)."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    if before_rename is not None:
        before_rename()
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


# ---- where an output goes

def write_target(path) -> tuple[Path, bool]:
    """(the file to write for the output ``path``, True when it is written through).

    - a symlink is followed: its target is replaced atomically, the link stays;
    - an existing FIFO or character device (``/dev/null``, ``/dev/stdout``, the pipe of
      ``--out >(cmd)``, ``/dev/fd/N``) is written through: opened and written as it is,
      never replaced by a regular file;
    - a folder, a block device or a socket is refused (UserError, one line);
    - anything else (a regular file, a new name) is replaced atomically.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode  # links followed
    except FileNotFoundError:  # a new name, or a link to one: create the link's target
        return (Path(os.path.realpath(path)) if path.is_symlink() else path), False
    except OSError as e:
        raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None
    if stat.S_ISREG(mode):
        return (Path(os.path.realpath(path)) if path.is_symlink() else path), False
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        # opened by the name given: /dev/fd/63 links to "pipe:[N]", which no path reaches
        return path, True
    kind = "a folder; give a file name" if stat.S_ISDIR(mode) else \
        "a block device (a disk): refused" if stat.S_ISBLK(mode) else "not a file: refused"
    raise UserError(f"{path}: is {kind}")


def same_file(a, b) -> bool:
    """Whether ``a`` and ``b`` are one file (same device and inode; links followed)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output(path, inputs: Iterable = (), what: str = "--out") -> Path:
    """Refuse, before any work, an output that cannot be written or would destroy what
    it points at: a folder, a block device, a missing folder, an unwritable folder, or a
    file that is also one of ``inputs`` (same inode: a hard link or symlink counts). One
    UserError line naming the option and the path. Returns ``Path(path)``."""
    path = Path(path)
    try:
        target, through = write_target(path)
    except UserError as e:
        raise UserError(f"{what} {e}") from None
    for src in inputs:
        if src is not None and same_file(src, target):
            same = "" if str(src) == str(path) else f" ({src})"
            raise UserError(f"{what} {path}: is also an input{same}; writing it would "
                            "destroy it: choose another name")
    if through:
        return path
    if not target.parent.is_dir():
        raise UserError(f"{what} {path}: its folder does not exist")
    probe = temp_path(target)
    try:  # the folder is writable: create and remove the temp file the write will use
        with open(probe, "xb"):
            pass
        probe.unlink()
    except FileExistsError:
        pass
    except OSError as e:
        raise UserError(f"{what} {path}: cannot write in {target.parent} "
                        f"({e.strerror or e})") from None
    return path


@contextmanager
def _open_through(target: Path, what) -> Iterator[IO[bytes]]:
    """A FIFO or device opened for writing as it is. A FIFO nobody reads is refused
    instead of blocking forever (the open would wait for a reader)."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise UserError(f"{what}: a FIFO (named pipe) that no process reads; start "
                            "its reader first") from None
        raise
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as fh:
        yield fh


class _Recorder:
    """The file handed to a writer callback: remembers the OSError of a failed write,
    which libraries like torch.save turn into a RuntimeError without the errno
    (``[enforce fail at inline_container.cc] unexpected pos``)."""

    def __init__(self, fh: IO[bytes]):
        self.fh, self.error = fh, None

    def write(self, b) -> int:
        try:
            return self.fh.write(b)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name):
        return getattr(self.fh, name)


def _write_payload(fh: IO[bytes], data: "Payload", path):
    if not callable(data):
        fh.write(data.encode() if isinstance(data, str) else data)
        return
    rec = _Recorder(fh)
    try:
        data(rec)
    except OSError:
        raise
    except Exception:
        if rec.error is not None:  # the write failure under the library's error
            e = rec.error
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


class PendingWrite:
    """A write of ``path`` in progress, for writers that cannot use a ``with`` block (a
    NetCDF writer open across calls): write the file ``tmp``, then ``commit()`` (it
    replaces ``path``) or ``abort()`` (it removes ``tmp``; ``path`` untouched).

    ``path`` as ``write_target`` says: a symlink's target is replaced (the link stays); a
    FIFO or device gets the finished file's bytes written through (``tmp`` then lies in
    the system's temp folder); a folder is refused. Temporary files of ``path`` left by
    dead processes are removed first (``remove_dead_temps``)."""

    def __init__(self, path, before_rename: Callable[[], None] | None = None):
        self.path = path
        self.target, self.through = write_target(path)
        self.before_rename = before_rename
        if self.through:
            fd, name = tempfile.mkstemp(suffix=self.target.suffix)
            os.close(fd)
            self.tmp = Path(name)
        else:
            remove_dead_temps(self.target)
            self.tmp = temp_path(self.target)

    def commit(self):
        try:
            if self.through:
                with open(self.tmp, "rb") as src, _open_through(self.target, self.path) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                self.tmp.unlink()
            else:
                commit(self.tmp, self.target, self.before_rename)
        except BaseException:
            self.abort()
            raise

    def abort(self):
        self.tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path, before_rename: Callable[[], None] | None = None) -> Iterator[Path]:
    """``with atomic_path(p) as tmp:`` write the file ``tmp`` by any means (a library that
    wants a file name); on leaving the block it replaces ``p`` (see ``commit``). On an
    exception (or Ctrl-C) the temporary file is removed and ``p`` is untouched. ``p`` as
    ``PendingWrite`` takes it (symlinks followed, FIFOs and devices written through)."""
    w = PendingWrite(path, before_rename)
    try:
        yield w.tmp
    except BaseException:
        w.abort()
        raise
    w.commit()


@contextmanager
def open_output(path, before_rename: Callable[[], None] | None = None) -> Iterator[IO[bytes]]:
    """``with open_output(p) as fh:`` a binary file for ``p``: a FIFO or device is written
    as the bytes come (a pipe's reader sees lines as they are made); anything else goes
    through ``atomic_path`` (the whole file or nothing under the name)."""
    target, through = write_target(path)
    if through:
        with _open_through(target, path) as fh:
            yield fh
        return
    with atomic_path(target, before_rename) as tmp:
        with open(tmp, "wb") as fh:
            yield fh


def atomic_write(path, data: Payload, before_rename: Callable[[], None] | None = None):
    """Replace ``path`` with ``data`` (bytes; str, written as UTF-8; or a callable that
    writes to the open binary file) so that the file is either the old or the new one
    (``path`` as ``atomic_path`` takes it: symlinks followed, FIFOs and devices written
    through). A failed write surfaces as the OSError (errno, strerror, path), also when
    the callable's library reported it as something else."""
    with open_output(path, before_rename) as fh:
        _write_payload(fh, data, path)


def sha256_file(path, block: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(block)
            if not b:
                return h.hexdigest()
            h.update(b)


def verify_file(path, nbytes: int, sha256: str, what: str):
    """Size and sha256 of ``path`` against recorded values (0 / "" = not recorded);
    DataError naming the file and what it is for."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataError(path, f"{what} unreadable ({e.strerror or e})") from None
    if nbytes and size != nbytes:
        raise DataError(path, f"{what} has {size} bytes, the manifest says {nbytes} "
                              "(truncated or replaced?)")
    if sha256 and sha256_file(path) != sha256:
        raise DataError(path, f"{what} checksum (sha256) differs from the manifest "
                              "(corrupted or modified since sharding)")
