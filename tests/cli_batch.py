"""Helper of tests/conftest.py ``run_cli_batch``: several command lines in one process.

    python tests/cli_batch.py CASES.json OUT.json

CASES.json is a list of ``[module, arg, ...]`` (module "rnntrain" or "data_tools"). Each
case runs the module's ``main(argv)`` exactly as ``python -m module`` does (``__main__``
raises SystemExit(main())), with its own stdout and stderr; an exception escaping main is
printed as the interpreter would and gives status 1. OUT.json gets, per case, the status,
stdout, stderr and the names of non-daemon threads still alive afterwards (a fresh process
could not have exited with those running, so the caller treats them as a failure).

Why: every ``python -m rnntrain`` imports torch (1-2 s of CPU); the bad-input cases that
stop before training need that start-up once, not once each. Tests that check what only a
fresh process shows (signals, kills, exit at interpreter shutdown) keep ``run_cli``.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import threading
import traceback


def run_case(module: str, argv: list[str]) -> dict:
    main = importlib.import_module(f"{module}.cli").main
    out, err = io.StringIO(), io.StringIO()
    before = set(threading.enumerate())
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as e:  # argparse, or a command that exits itself
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            rc = 1
    left = [t.name for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon]
    return {"returncode": rc or 0, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "threads_left": left}


def main() -> None:
    cases_path, out_path = sys.argv[1:]
    with open(cases_path) as f:
        cases = json.load(f)
    results = [run_case(c[0], c[1:]) for c in cases]
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
