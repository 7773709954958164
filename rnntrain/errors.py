"""User-facing errors.

A ``ValueError`` subclass means "the user's input is wrong": the CLI prints its message on
one line and exits non-zero without a traceback. Our own invariants use ``assert``.
"""
from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user (config, command line, data). Printed without traceback."""


class DataError(UserError):
    """Bad data in a file: the message names the file, the variable and the sequence."""

    def __init__(self, path, msg: str, var: str | None = None, seq: int | None = None,
                 tag: str | None = None):
        where = [str(path)]
        if var is not None:
            where.append(f"variable '{var}'")
        if seq is not None:
            where.append(f"sequence {seq}" + (f" ('{tag}')" if tag else ""))
        super().__init__(": ".join([", ".join(where), msg]))
        self.path, self.var, self.seq, self.tag = str(path), var, seq, tag


class SharedError(UserError):
    """A UserError that every rank of a job raises alike, at the same point, because a
    collective agreed on it (the run-folder verdict, ranks whose configs differ). Each
    rank can then leave on its own with the same status: rank 0 prints the line, the
    others leave quietly, and nobody aborts the job (an MPI abort adds the launcher's own
    lines to the one that matters)."""


class ConfigError(UserError):
    """Bad configuration: unknown key, wrong type, impossible value."""



def file_problem(path, what: str = "file") -> str | None:
    """Why ``path`` cannot be read as a regular file ("data file not found", "data file is
    a FIFO ..."), without the path; None when it is an existing regular file (symlinks
    followed).

    Checked before opening: opening a FIFO for reading blocks until a writer appears (a
    training that hangs forever), and a device such as /dev/zero or /dev/urandom is an
    endless stream that a reader would try to hold in memory.
    """
    import os
    import stat
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{what} not found"
    except OSError as e:
        return f"{what} cannot be read ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or
            stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
    return f"{what} is {kind}, not a regular file"


def check_regular_file(path, what: str = "file", error=UserError):
    """Raise ``error("PATH: why")`` unless ``path`` is a regular file (see file_problem)."""
    why = file_problem(path, what)
    if why:
        raise error(f"{path}: {why}")
