"""``rnntrain sweep CONFIG key=v1,v2 key2=a,b``: a grid of training runs and their table.

Every combination of the comma-separated values becomes one ``rnntrain train`` run (a
subprocess, one after another) in its own folder inside the sweep folder; a key with one
value applies to every run. Before anything runs, every combination is loaded and
validated, so a typo fails in a second, not after the first hour. After each run the
results table (results.md and results.csv) is rewritten, so an interrupted sweep still has
one. Running the same sweep again skips finished runs and resumes stopped ones.
``--print`` prints the commands instead (one per line, for a cluster's job script).
"""
from __future__ import annotations

import csv
import io
import itertools
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rnntrain.config import load_config, parse_override
from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write
from rnntrain.artifact.runfolder import RunFolder
from rnntrain.tools.runs import read_status, summarize

RESULT_KEYS = ("status", "epochs_done", "steps", "best_val_ler", "best_epoch",
               "last_val_ler", "last_train_loss", "frames_per_s", "wall_s")


def split_values(text: str) -> list[str]:
    """``1e-3,3e-3`` → ["1e-3", "3e-3"]; commas inside [..] or quotes do not split."""
    out, cur, depth, quote = [], "", 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return [v.strip() for v in out]


def parse_grid(specs: list[str]) -> list[tuple[str, list[str]]]:
    """["optim.lr=1e-3,3e-3", "model.hidden=64"] → [("optim.lr", [...]), ("model.hidden", [...])]."""
    grid, seen = [], set()
    for spec in specs:
        body = spec[2:] if spec.startswith("--") else spec
        section, key, _ = parse_override(body)  # checks the section.key=value shape
        name = f"{section}.{key}"
        if name in seen:
            raise UserError(f"sweep: {name} is given twice")
        if name == "run.dir":
            raise UserError("sweep: run.dir is set per run by the sweep (use --out for the "
                            "sweep folder)")
        seen.add(name)
        values = split_values(body.split("=", 1)[1])
        if any(v == "" for v in values):
            raise UserError(f"sweep: empty value in {spec!r}")
        grid.append((name, values))
    return grid


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in text)


def combinations(grid: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """(run name, overrides) for every combination, in grid order (last key fastest)."""
    varying = [k for k, vs in grid if len(vs) > 1]
    out = []
    for i, combo in enumerate(itertools.product(*[vs for _, vs in grid])):
        ov = [f"{k}={v}" for (k, _), v in zip(grid, combo)]
        label = "-".join(f"{k.split('.')[-1]}={v}" for (k, _), v in zip(grid, combo)
                         if k in varying)
        out.append((_safe(f"{i:02d}" + (f"-{label}" if label else ""))[:80], ov))
    return out


def sweep(config: str, specs: list[str], out: str | None = None, print_only: bool = False,
          launcher: str = "", show_output: bool = False) -> int:
    grid = parse_grid(specs)
    if not grid:
        raise UserError("sweep: give at least one key=v1,v2,... (e.g. optim.lr=1e-3,3e-3)")
    runs = combinations(grid)
    for name, ov in runs:  # fail fast on a bad value anywhere in the grid
        try:
            load_config(config, ov)
        except UserError as e:
            raise UserError(f"sweep run {name}: {e}") from None
    folder = Path(out) if out else Path("sweeps") / (
        f"{Path(config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    prefix = shlex.split(launcher) if launcher else []
    if print_only:
        for name, ov in runs:
            print(shlex.join(prefix + ["rnntrain", "train", config, *ov,
                                       f"run.dir={folder / name}"]))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    print(f"sweep: {len(runs)} runs in {folder}", file=sys.stderr, flush=True)
    failed = run_all(config, folder, grid, runs, prefix, show_output)
    print(f"sweep: results in {folder / 'results.md'} and {folder / 'results.csv'}",
          file=sys.stderr)
    if failed:
        print(f"sweep: {failed} of {len(runs)} runs failed (see console.log in their "
              f"folders)", file=sys.stderr)
        return 1
    return 0


def run_all(config: str, folder: Path, grid, runs: list[tuple[str, list[str]]],
            prefix: list[str] = (), show_output: bool = False) -> int:
    """Train each (name, overrides) of ``runs`` in ``folder / name``, one after another, as
    a subprocess: a finished run is skipped, an interrupted one resumed. The results table
    is rewritten after each run. Returns the number of runs that failed."""
    prefix = list(prefix)
    failed = 0
    for n, (name, ov) in enumerate(runs, 1):
        run_dir = folder / name
        status = read_status(run_dir).get("status")
        if status == "finished":
            print(f"[{n}/{len(runs)}] {name}: already finished, skipped", file=sys.stderr)
            continue
        cmd = prefix + [sys.executable, "-m", "rnntrain", "train", config, *ov,
                        f"run.dir={run_dir}"]
        ck = RunFolder(run_dir).checkpoints
        if status in ("stopped", "failed", "died", "running") and ck.is_dir() and \
                any(ck.glob("*.pt")):
            cmd.append("--resume")  # continue an interrupted run from its newest checkpoint
        print(f"[{n}/{len(runs)}] {name}: {shlex.join(cmd[len(prefix) + 3:])}",
              file=sys.stderr, flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            with open(run_dir / "console.log", "a") as log:
                rc = subprocess.run(cmd, stdout=None if show_output else log,
                                    stderr=None if show_output else subprocess.STDOUT).returncode
        finally:  # the table, also when Ctrl-C stops the sweep
            write_results(folder, grid, runs)
        s = summarize(run_dir)
        if rc != 0:
            failed += 1
            tail = _last_line(run_dir / "console.log")
            print(f"    failed (exit {rc}): {tail}", file=sys.stderr, flush=True)
        else:
            best = "-" if s.best_val_ler is None else f"{s.best_val_ler:.4f}"
            print(f"    {s.status}: best val LER {best}, {time.monotonic() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    return failed


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-200:] if lines else ""


def write_results(folder: Path, grid, runs) -> list[dict]:
    """results.csv and results.md: one row per run (grid values and outcome)."""
    keys = [k for k, _ in grid]
    rows = []
    for name, ov in runs:
        row = {"run": name, **{k: o.split("=", 1)[1] for k, o in zip(keys, ov)}}
        run_dir = folder / name
        if run_dir.exists():
            s = summarize(run_dir).row() if RunFolder(run_dir).config.exists() or \
                RunFolder(run_dir).metrics.exists() else {"status": "failed"}
        else:
            s = {"status": "pending"}
        row.update({k: s.get(k) for k in RESULT_KEYS})
        rows.append(row)
    cols = ["run", *keys, *RESULT_KEYS]
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=cols)
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r[k] is None else r[k] for k in cols})
    atomic_write(folder / "results.csv", text.getvalue())
    done = [r for r in rows if r["best_val_ler"] is not None]
    best = min(done, key=lambda r: r["best_val_ler"]) if done else None

    def cell(r, k):
        v = r[k]
        if v is None:
            return "-"
        if k in ("best_val_ler", "last_val_ler"):
            return f"**{v:.4f}**" if r is best and k == "best_val_ler" else f"{v:.4f}"
        if k == "last_train_loss":
            return f"{v:.3f}"
        if k == "frames_per_s":
            return f"{v:,.0f}"
        if k == "wall_s":
            return f"{v:.0f} s"
        return str(v)
    md = [f"# Sweep {folder.name}", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(cell(r, k) for k in cols) + " |" for r in rows]
    if best is not None:
        md += ["", f"Best validation LER: {best['best_val_ler']:.4f} ({best['run']})."]
    (folder / "results.md").write_text("\n".join(md) + "\n")
    return rows
