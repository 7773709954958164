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
of the same file never share one); ``stale_temps`` finds those a killed process left.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
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


@contextmanager
def atomic_path(path, before_rename: Callable[[], None] | None = None) -> Iterator[Path]:
    """``with atomic_path(p) as tmp:`` write the file ``tmp`` by any means (a library that
    wants a file name); on leaving the block it replaces ``p`` (see ``commit``). On an
    exception (or Ctrl-C) the temporary file is removed and ``p`` is untouched."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        yield tmp
        commit(tmp, path, before_rename)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path, data: Payload, before_rename: Callable[[], None] | None = None):
    """Replace ``path`` with ``data`` (bytes; str, written as UTF-8; or a callable that
    writes to the open binary file) so that the file is either the old or the new one."""
    with atomic_path(path, before_rename) as tmp:
        with open(tmp, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode() if isinstance(data, str) else data)


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
