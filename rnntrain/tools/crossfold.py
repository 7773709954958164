"""``rnntrain crossfold CONFIG --folds K [overrides]``: K models on the K folds of one set.

Fold i trains on every fold of ``data.train`` but i and validates on fold i
(``data.folds = K``, ``data.fold = i``: a mask over the file's sequences, see
``rnntrain.data.folds``; nothing is copied). Each fold is an ordinary run folder,
``OUT/fold-i``, trained by ``rnntrain train`` as a subprocess one after another (the
sweep's runner, ``rnntrain.tools.sweep.run_all``): running the same command again skips
finished folds and resumes interrupted ones from their newest checkpoint. ``--print``
prints the K training commands instead (each with ``--resume if-any``, so a requeued
cluster job continues), for a cluster to run side by side.

``OUT/crossfold.json`` records the folds; ``OUT`` itself then names the ensemble of the
folds' best checkpoints wherever a model is expected (``rnntrain eval OUT DATA``,
``decode``, ``transcribe``; see ``rnntrain.infer.ensemble``). With ``data.test`` set, the
ensemble is scored on it at the end, voting and averaging, beside each fold alone
(``OUT/ensemble.md``).
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from rnntrain.config import load_config, parse_override
from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write

MANIFEST = "crossfold.json"
FORMAT = 1
RESERVED = ("data.folds", "data.fold", "data.val", "run.dir")


def fold_runs(folds: int, overrides: list[str]) -> list[tuple[str, list[str]]]:
    """(run name, overrides) of each fold; ``data.fold`` first (the results table's
    column)."""
    return [(f"fold-{i}", [f"data.fold={i}", f"data.folds={folds}", 'data.val=""',
                           *overrides]) for i in range(folds)]


def default_out(config: str, folds: int) -> Path:
    """``runs/<config name>-crossfold<K>``: the same command finds its folder again."""
    return Path("runs") / f"{Path(config).stem}-crossfold{folds}"


def check_manifest(folder: Path, record: dict):
    """``folder`` is new, or holds this very crossfold (same config, folds, overrides):
    resuming a different one there would mix two experiments' folds."""
    path = folder / MANIFEST
    if not path.exists():
        if folder.exists() and any(folder.iterdir()):
            raise UserError(f"{folder}: not empty and not a crossfold folder (no {MANIFEST});"
                            f" choose another --out")
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable ({e})") from None
    diff = [k for k in ("config", "folds", "overrides") if old.get(k) != record[k]]
    if diff:
        shown = "; ".join(f"{k}: {old.get(k)!r} there, {record[k]!r} now" for k in diff)
        raise UserError(f"{folder} holds another crossfold ({shown}); choose another --out "
                        f"or repeat its command")


def crossfold(config: str, folds: int, overrides: list[str], out: str | None = None,
              print_only: bool = False, launcher: str = "", show_output: bool = False) -> int:
    from rnntrain.tools.sweep import run_all
    if folds < 2:
        raise UserError(f"--folds {folds}: give 2 or more")
    for o in overrides:
        section, key, _ = parse_override(o)
        if f"{section}.{key}" in RESERVED:
            raise UserError(f"crossfold sets {section}.{key} itself (folds: --folds, the "
                            f"folder: --out)")
    runs = fold_runs(folds, overrides)
    cfg = load_config(config, runs[0][1])  # a typo fails now, not after the first fold
    folder = Path(out) if out else default_out(config, folds)
    record = {"format": FORMAT, "config": str(config), "folds": folds,
              "overrides": list(overrides), "seed": cfg.train.seed,
              "runs": [name for name, _ in runs]}
    check_manifest(folder, record)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / MANIFEST, json.dumps(record, indent=1) + "\n")
    prefix = shlex.split(launcher) if launcher else []
    if print_only:  # one command per fold, each resumable where a cluster requeues it
        for name, ov in runs:
            print(shlex.join(prefix + ["rnntrain", "train", config, *ov,
                                       f"run.dir={folder / name}", "--resume", "if-any"]))
        return 0
    print(f"crossfold: {folds} folds of {cfg.data.train} in {folder}", file=sys.stderr,
          flush=True)
    grid = [("data.fold", [str(i) for i in range(folds)])]
    failed = run_all(config, folder, grid, runs, prefix, show_output)
    if failed:
        print(f"crossfold: {failed} of {folds} folds failed (see console.log in their "
              f"folders); run the same command again to continue", file=sys.stderr)
        return 1
    if cfg.data.test:
        score_ensemble(folder, cfg.data.test, [name for name, _ in runs])
    print(f"crossfold: results in {folder / 'results.md'}; the ensemble of the folds: "
          f"rnntrain eval {shlex.quote(str(folder))} DATA", file=sys.stderr)
    return 0


def fold_test_ler(run_dir: Path) -> float | None:
    """The test LER a fold's run logged at its end (its best checkpoint on data.test)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    recs = []
    for ln in lines:
        if '"test"' in ln:
            try:
                recs.append(json.loads(ln))
            except ValueError:
                continue  # a line cut short by a kill
    recs = [r for r in recs if isinstance(r, dict) and r.get("split") == "test"]
    return recs[-1].get("ler") if recs else None


def score_ensemble(folder: Path, test: str, names: list[str]):
    """Score the folds' ensemble on data.test both ways (``rnntrain eval --json``, a
    subprocess each) beside each fold alone; print it and write ``ensemble.md``."""
    import subprocess
    rows = []
    for how in ("vote", "posteriors"):
        cmd = [sys.executable, "-m", "rnntrain", "eval", str(folder), test,
               "--combine", how, "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"crossfold: scoring the ensemble failed: {p.stderr.strip()[-300:]}",
                  file=sys.stderr)
            return
        rows.append((f"ensemble of {len(names)}, --combine {how}", json.loads(p.stdout)["ler"]))
    rows += [(f"{name} alone", fold_test_ler(folder / name)) for name in names]
    md = [f"# Crossfold {folder.name}: test LER ({test}, best path)", "",
          "| model | test LER |", "|---|---:|"]
    md += [f"| {what} | {'-' if ler is None else f'{ler:.4f}'} |" for what, ler in rows]
    atomic_write(folder / "ensemble.md", "\n".join(md) + "\n")
    for what, ler in rows:
        print(f"crossfold: test LER {'-' if ler is None else f'{ler:.4f}'}: {what}",
              file=sys.stderr)


def read_manifest(folder: Path) -> dict | None:
    """``folder``'s crossfold record, or None when it is not a crossfold folder."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        runs = [str(r) for r in rec["runs"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a crossfold record ({e})") from None
    if any("/" in r or r in ("", ".", "..") for r in runs):
        raise UserError(f"{path}: a fold name that is not a folder name")
    return {**rec, "runs": runs}
