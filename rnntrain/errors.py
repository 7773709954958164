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


class ConfigError(UserError):
    """Bad configuration: unknown key, wrong type, impossible value."""
