"""Plot validation (and training) label error rate over training time from metrics.jsonl.

    python recipes/plot_ler.py RUN_DIR [RUN_DIR ...] --out plot.png [--title T]

Time is wall-clock seconds since the run's first metrics line (the first ``log_every``
steps are not counted). Training LER is the running figure the trainer logs (with dropout
and noise, if any); validation LER is best-path decoding of the validation set per epoch.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(run: Path):
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    if not recs:
        raise SystemExit(f"{run}/metrics.jsonl is empty")
    t0 = recs[0]["time"]
    tr = [(r["time"] - t0, r["ler"]) for r in recs if r["split"] == "train"]
    va = [(r["time"] - t0, r["ler"]) for r in recs if r["split"] == "val"]
    return tr, va


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", required=True)
    p.add_argument("--no-train", action="store_true", help="validation curve only")
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in a.runs:
        tr, va = load(run)
        if tr and not a.no_train:
            ax.plot([t / 60 for t, _ in tr], [100 * v for _, v in tr], alpha=0.4,
                    label=f"{run.name} train (running)")
        if va:
            ax.plot([t / 60 for t, _ in va], [100 * v for _, v in va], "o-",
                    label=f"{run.name} validation")
            tb, best = min(va, key=lambda r: (r[1], r[0]))
            low = best < 0.01  # near the axis: the label goes above the point
            ax.annotate(f"best {100 * best:.2f}%", xy=(tb / 60, 100 * best),
                        xytext=(6, 8) if low else (-8, -16), textcoords="offset points",
                        ha="left" if low else "right")
    ax.set_ylim(bottom=0)
    ax.set_yscale("symlog", linthresh=1.0)  # linear below 1 % so that 0 shows
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("label error rate (%)")
    ax.set_title(a.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
