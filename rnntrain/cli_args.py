"""Command-line plumbing shared by ``rnntrain`` and ``rnntrain-data`` (no torch here).

- ``Parser``: every subcommand shows each option's default in ``--help`` (subparsers
  inherit the class, so commands added later get it too).
- ``positive_int`` & co.: values that cannot work are refused by the parser, not at run
  time (``--beam -1`` would otherwise search forever).
- ``split_overrides``: ``section.key=value`` overrides anywhere on the line, in any order
  with the options, as ``--section.key=value`` or ``--section.key value``.
- ``resume_value``: ``--resume`` takes the next word only when it is ``auto``, ``if-any``
  or an existing checkpoint file or run folder, so it never swallows an override or the
  config file.
- ``run_main``: one line and exit 2 for a user's mistake, quiet exit when the reader of a
  pipe goes away (``rnntrain decode ... | head``).
"""
from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys
from pathlib import Path

from rnntrain.errors import UserError

_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already names its
    default, the default is empty (None, False, "") or the help is suppressed."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower() or action.help == argparse.SUPPRESS:
            return text
        d = action.default
        if d is None or d is False or d == "" or d == argparse.SUPPRESS or d == []:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def number_arg(kind, test, what):
    def check(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not test(v):
            raise argparse.ArgumentTypeError(f"{text} must be {what}")
        return v
    check.__name__ = f"{what} {kind.__name__}"
    return check


positive_int = number_arg(int, lambda v: v > 0, "> 0")
non_negative_int = number_arg(int, lambda v: v >= 0, ">= 0")
positive_float = number_arg(float, lambda v: v > 0 and v != float("inf"), "> 0")
non_negative_float = number_arg(float, lambda v: v >= 0 and v != float("inf"), ">= 0")
finite_float = number_arg(float, math.isfinite, "a finite number")  # not nan, inf


# ---- overrides

_OVERRIDE = re.compile(r"^(--)?[A-Za-z_][\w-]*\.[A-Za-z_][\w.-]*=")
_SPACED = re.compile(r"^--([A-Za-z_][\w-]*)\.([A-Za-z_][\w-]*)$")


def split_overrides(argv: list[str], sections: set[str]) -> tuple[list[str], list[str]]:
    """(the other arguments, the overrides as ``section.key=value``).

    ``section.key=value`` and ``--section.key=value`` are overrides wherever they stand;
    ``--section.key value`` is one when ``section`` is a config section. Everything after
    ``--`` is left to argparse.
    """
    rest, overrides = [], []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        if _OVERRIDE.match(a):
            overrides.append(a[2:] if a.startswith("--") else a)
        elif (m := _SPACED.match(a)) and m.group(1) in sections:
            if i + 1 >= len(argv):
                raise UserError(f"{a} needs a value: {a} VALUE or {a[2:]}=VALUE")
            overrides.append(f"{a[2:]}={argv[i + 1]}")
            i += 1
        else:
            rest.append(a)
        i += 1
    return rest, overrides


RESUME_WORDS = ("auto", "if-any")


def take_resume(argv: list[str]) -> tuple[list[str], str | None]:
    """Pull ``--resume [VALUE]`` out of argv: (the rest, the value or None).

    ``--resume=VALUE`` always takes VALUE. ``--resume VALUE`` takes it only when it is
    ``auto``, ``if-any``, an existing folder, or an existing file that is not a ``.toml``
    config; otherwise ``--resume`` alone means ``auto`` and the word stays where it was.
    """
    rest, value = [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest.extend(argv[i:])
            break
        opt = a.split("=", 1)[0]
        if len(opt) >= 4 and opt != "--resume" and "--resume".startswith(opt):
            # argparse would take --resum as an abbreviation, after --resume was taken out
            # here: the run would start afresh, silently
            raise UserError(f"{opt}: did you mean --resume? (it is spelled out in full)")
        if a == "--resume" or a.startswith("--resume="):
            if value is not None:
                raise UserError("--resume given twice")
            if "=" in a:
                value = a.split("=", 1)[1]
                if not value:
                    raise UserError("--resume= needs a value: auto, if-any or a checkpoint path")
            else:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if nxt is not None and nxt.endswith(".pt") and not Path(nxt).exists():
                    raise UserError(f"--resume {nxt}: checkpoint not found")
                if nxt is not None and not nxt.startswith("-") and "=" not in nxt and \
                        not nxt.endswith(".toml") and nxt not in RESUME_WORDS and \
                        not Path(nxt).exists():  # (an override stays where it is)
                    raise UserError(f"--resume {nxt}: no such run folder or checkpoint "
                                    "(--resume alone continues run.dir's newest checkpoint; "
                                    "`rnntrain runs` lists the run folders)")
                if nxt is not None and (nxt in RESUME_WORDS or Path(nxt).is_dir() or (
                        Path(nxt).is_file() and not nxt.endswith(".toml"))):
                    value = nxt
                    i += 1
                else:
                    value = "auto"
        else:
            rest.append(a)
        i += 1
    return rest, value


# ---- running a command

def run_main(prog: str, cmd: str, fn, *args) -> int:
    """Call ``fn(*args)``; user errors → one line on stderr and exit 2."""
    try:
        rc = fn(*args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return rc
    except UserError as e:
        print(f"{prog} {cmd}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of our stdout has gone (``| head``): stop quietly, as cat does; point
        # stdout at /dev/null so that the interpreter's final flush does not complain
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the pipe
    except OSError as e:
        if e.errno not in _STORAGE_ERRORS:
            raise
        # disk full, quota, file size limit, read-only: a condition of the machine, not a bug
        print(f"{prog} {cmd}: error: cannot write {e.filename or 'a file'} "
              f"({e.strerror}); files written before are intact", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog} {cmd}: interrupted", file=sys.stderr)
        return 130


def version() -> str:
    from rnntrain import __version__  # the one place the version is written (pyproject reads it)
    return __version__
