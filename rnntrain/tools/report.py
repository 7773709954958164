"""``rnntrain report RUN_DIR [RUN_DIR ...]``: PNG plots and a markdown summary of runs.

Figures (several runs overlay, one colour per run):
  curves.png      train/val CTC loss, label error rate (log axis, best.pt starred) and the
                  learning rate, over steps and over wall time
  throughput.png  training frames/s and the padding overhead of the batches over steps
  time_split.png  mean time per step by phase — data wait, compute, barrier wait,
                  communication, update — for each run and rank
and report.md, a table of the runs with links to the figures. ``--tensorboard`` also
writes the metrics as TensorBoard event files when the tensorboard package is installed.

Everything comes from the run folders (metrics.jsonl, status.json, config.toml), so a
report can be made during training, after it, or on another machine.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError
from rnntrain.tools.runs import RunSummary, read_metrics, read_status, summarize

PHASES = ("data wait", "compute", "barrier wait", "communication", "update")
PHASE_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974")


def phase_seconds(r: dict) -> np.ndarray:
    """A train record's (or rank entry's) mean seconds per step in PHASES order. The
    pool's wall time is split into busy compute and the workers' idle share at the
    barrier; the fixed-order reduce counts with the update."""
    comp = r.get("compute_s", 0.0)
    idle = min(max(r.get("barrier_idle", 0.0), 0.0), 1.0)
    return np.array([r.get("data_wait_s", 0.0), comp * (1 - idle), comp * idle,
                     r.get("comm_s", 0.0), r.get("reduce_s", 0.0) + r.get("update_s", 0.0)])


def rank_splits(train: list[dict]) -> list[np.ndarray]:
    """Mean seconds per step by phase for each rank (first window, the warm-up, excluded
    when there are others)."""
    recs = train[1:] if len(train) > 1 else train
    if not recs:
        return []
    n = max(len(r.get("ranks", [])) for r in recs) or 1
    out = []
    for k in range(n):
        rows = [phase_seconds(r["ranks"][k] if "ranks" in r else r) for r in recs
                if "ranks" not in r or k < len(r["ranks"])]
        out.append(np.mean(rows, axis=0))
    return out


def _labels(runs: list[Path]) -> list[str]:
    """Short distinct names: the folder name, or more of the path when names clash."""
    parts = [p.resolve().parts for p in runs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in runs]


class RunData:
    def __init__(self, path: Path, label: str):
        self.path, self.label = path, label
        self.summary: RunSummary = summarize(path)
        recs = read_metrics(path)
        self.train = [r for r in recs if r.get("split") == "train"]
        self.val = [r for r in recs if r.get("split") == "val"]
        times = [r["time"] for r in recs if "time" in r]
        st = read_status(path)
        # wall time origin: the run's start; else one window before the first record
        self.t0 = st.get("started") or (times[0] if times else 0.0)

    def xs(self, recs: list[dict], key: str, scale: float = 60.0) -> np.ndarray:
        """Steps, or wall time since the start in units of ``scale`` seconds."""
        if key == "step":
            return np.array([r.get("step", 0) for r in recs], dtype=float)
        return (np.array([r.get("time", self.t0) for r in recs], dtype=float) - self.t0) / scale

    @staticmethod
    def ys(recs: list[dict], key: str) -> np.ndarray:
        return np.array([r.get(key, np.nan) for r in recs], dtype=float)

    def duration(self) -> float:
        return max((r.get("time", self.t0) - self.t0 for r in self.train + self.val),
                   default=0.0)


def time_unit(runs: list[RunData]) -> tuple[float, str]:
    """Seconds, minutes or hours, whichever keeps the axis numbers readable."""
    longest = max(r.duration() for r in runs)
    return (1.0, "s") if longest < 180 else (60.0, "min") if longest < 3 * 3600 else \
        (3600.0, "h")


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("rnntrain report needs matplotlib: pip install matplotlib") from None
    return plt


def best_val(recs: list[dict]) -> int | None:
    """Index of the validation record best.pt holds: the lowest LER, ties to the lower loss
    (``TrainState.record_validation``); None without one."""
    ok = [i for i, r in enumerate(recs) if np.isfinite(r.get("ler", np.nan))]
    return min(ok, key=lambda i: (recs[i]["ler"], recs[i].get("loss", np.inf)), default=None)


def plot_curves(runs: list[RunData], out: Path) -> Path:
    plt = _plt()
    fig = curves_figure(runs)
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves_figure(runs: list[RunData]):
    """Loss, LER and learning rate (rows) over steps and over wall time (columns). LER on a
    log axis (linear below 0.1 %, so 0 has a place): differences under 5 % stay visible.
    The best validation (what best.pt holds) is starred and labelled with its epoch."""
    plt = _plt()
    fig, axes = plt.subplots(3, 2, figsize=(12, 11), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    scale, unit = time_unit(runs)
    for row, (key, title) in enumerate((("loss", "CTC loss per sequence"),
                                        ("ler", "label error rate"),
                                        ("lr", "learning rate"))):
        for col, (xkey, xlabel) in enumerate((("step", "step"),
                                              ("time", f"wall time ({unit})"))):
            ax = axes[row, col]
            for i, r in enumerate(runs):
                c = colors[i % len(colors)]
                if r.train:
                    ax.plot(r.xs(r.train, xkey, scale), r.ys(r.train, key), color=c, lw=1.2,
                            alpha=0.8, label=f"{r.label} train")
                if r.val and key != "lr":
                    ax.plot(r.xs(r.val, xkey, scale), r.ys(r.val, key), color=c, lw=2, ls="--",
                            marker="o", ms=4, label=f"{r.label} val")
                b = best_val(r.val)
                if key == "ler" and b is not None:
                    x, y = r.xs(r.val, xkey, scale)[b], r.val[b]["ler"]
                    ax.plot([x], [y], marker="*", ms=16, color=c, mec="black", zorder=5)
                    xs = r.xs(r.train + r.val, xkey, scale)
                    right = x > (np.nanmin(xs) + np.nanmax(xs)) / 2  # label towards the middle
                    high = y > 0.3
                    ax.annotate(f"best.pt: epoch {int(r.val[b].get('epoch', 0)) + 1}, "
                                f"{100 * y:.2f} %", (x, y), textcoords="offset points",
                                xytext=(-10 if right else 10, -12 if high else 10 + 12 * i),
                                ha="right" if right else "left", va="top" if high else
                                "bottom", fontsize=8, color=c)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(title)
            ax.set_title(f"{title} over {xlabel.split(' (')[0]}")
            ax.grid(alpha=0.3)
            if key in ("loss", "lr") and _positive(runs, key):
                _log_axis(ax)
            if key == "ler":
                _ler_axis(ax)
    _legend(axes[0, 0], runs)
    return fig


def _log_axis(ax):
    """Log scale labelled 1, 2, 5, 10, 20, ... (plain numbers, not only powers of ten)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _ler_axis(ax):
    """LER in percent on a log axis that is linear below 0.1 % (a run at 0 % stays on the
    plot): 0, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100 %."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    ax.set_yscale("symlog", linthresh=1e-3, linscale=0.3)
    ticks = [0.0] + [m * 10.0 ** e for e in range(-3, 0) for m in (1, 2, 5)] + [1.0]
    lo, hi = ax.get_ylim()
    ax.set_ylim(0, max(min(hi, 1.05), 2e-3))
    ax.yaxis.set_major_locator(FixedLocator([t for t in ticks if t <= max(hi, 2e-3) * 1.5]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:g} %"))
    ax.yaxis.set_minor_locator(NullLocator())


def _positive(runs, key) -> bool:
    vals = [v for r in runs for v in r.ys(r.train + r.val, key) if np.isfinite(v)]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 20


def _legend(ax, runs):
    if any(r.train or r.val for r in runs):
        ax.legend(fontsize=8 if len(runs) < 4 else 7, loc="upper right")


def plot_throughput(runs: list[RunData], out: Path) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(runs):
        c = colors[i % len(colors)]
        if r.train:
            x = r.xs(r.train, "step")
            axes[0].plot(x, r.ys(r.train, "frames_per_s"), color=c, lw=1.2, label=r.label)
            axes[1].plot(x, 100 * (r.ys(r.train, "padding") - 1), color=c, lw=1.2,
                         label=r.label)
    axes[0].set_title("training throughput")
    axes[0].set_ylabel("frames / s")
    axes[0].set_ylim(bottom=0)
    axes[1].set_title("padding overhead (extra padded frames computed)")
    axes[1].set_ylabel("extra frames (%)")
    axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if any(r.train for r in runs):
        axes[0].legend(fontsize=8, loc="lower right")
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_time_split(runs: list[RunData], out: Path) -> Path:
    plt = _plt()
    bars = []  # (label, seconds per phase)
    for r in runs:
        splits = rank_splits(r.train)
        for k, s in enumerate(splits):
            bars.append((r.label + (f"  rank {k}" if len(splits) > 1 else ""), s))
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.45 * max(len(bars), 1)),
                           constrained_layout=True)
    for j, (label, s) in enumerate(bars[::-1]):
        left = 0.0
        for p, (v, name, color) in enumerate(zip(1e3 * s, PHASES, PHASE_COLORS)):
            ax.barh(j, v, left=left, color=color, label=name if j == 0 else None, height=0.6)
            left += v
        ax.text(left, j, f" {left:.1f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([b[0] for b in bars[::-1]], fontsize=8)
    ax.set_xlabel("mean time per step (ms)")
    ax.set_title("where a training step's time goes")
    if bars:
        ax.set_xlim(0, 1.15e3 * max(float(b[1].sum()) for b in bars) or 1)
        fig.legend(ncol=len(PHASES), fontsize=8, loc="outside lower center", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    path = out / "time_split.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary_markdown(runs: list[RunData], images: list[Path], out: Path) -> str:
    lines = ["# Training report", "",
             "| run | status | epochs | steps | best val LER (epoch) | last train loss | "
             "frames/s (median) | padding | data wait | compute | barrier | comm | update |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s = r.summary
        best = "-" if s.best_val_ler is None else f"{s.best_val_ler:.4f} ({s.best_epoch})"
        pad = r.ys(r.train, "padding")
        split = rank_splits(r.train)
        share = (np.mean(split, axis=0) / max(np.mean(split, axis=0).sum(), 1e-12)
                 if split else None)
        status = s.status + (" (early stop)" if s.early_stopped else "")
        cells = [f"`{r.label}`", status, f"{s.epochs_done}/{s.epochs}", str(s.steps), best,
                 "-" if s.last_train_loss is None else f"{s.last_train_loss:.3f}",
                 "-" if s.frames_per_s is None else f"{s.frames_per_s:,.0f}",
                 f"{100 * (np.nanmean(pad) - 1):.1f}%" if len(pad) else "-"]
        cells += [f"{100 * v:.1f}%" for v in share] if share is not None else ["-"] * 5
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Padding: extra frames computed beyond the real ones (padded / real - 1). "
              "Time split: share of the mean step time (all ranks averaged); barrier = "
              "workers idle waiting for the slowest task; comm = the gradient allreduce; "
              "update = fixed-order reduce, clipping and optimizer step.", ""]
    for img in images:
        lines += [f"![{img.stem}]({os.path.relpath(img, out)})", ""]
    for r in runs:
        if r.summary.error:
            lines.append(f"- `{r.label}` failed: {r.summary.error}")
    return "\n".join(lines).rstrip() + "\n"


def write_tensorboard(runs: list[RunData], out: Path) -> str:
    """Metrics as TensorBoard scalars (one sub-folder per run); skipped without the package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return "tensorboard is not installed (pip install tensorboard); skipped TensorBoard"
    for r in runs:
        w = SummaryWriter(str(out / "tensorboard" / r.label.replace("/", "_")))
        for split, recs in (("train", r.train), ("val", r.val)):
            for rec in recs:
                for k, v in rec.items():
                    if isinstance(v, (int, float)) and k not in ("step", "epoch", "time"):
                        w.add_scalar(f"{split}/{k}", v, int(rec.get("step", 0)),
                                     walltime=rec.get("time"))
        w.close()
    return f"TensorBoard event files in {out / 'tensorboard'}"


def report(run_dirs: list[str], out: str | None = None, tensorboard: bool = False) -> Path:
    """Write the figures and report.md into ``out`` (default: the single run's folder, or
    ./report for several runs); returns the markdown path."""
    if not run_dirs:
        raise UserError("give at least one run folder")
    paths = [Path(p) for p in run_dirs]
    for p in paths:
        if not p.is_dir():
            raise UserError(f"{p}: no such run folder")
    runs = [RunData(p, lab) for p, lab in zip(paths, _labels(paths))]
    if not any(r.train or r.val for r in runs):
        raise UserError(f"{', '.join(map(str, paths))}: no metrics recorded yet "
                        f"(metrics.jsonl is empty)")
    outdir = Path(out) if out else (paths[0] / "report" if len(paths) == 1 else Path("report"))
    if outdir.exists() and not outdir.is_dir():
        raise UserError(f"--out {outdir}: not a folder (the report is a folder of PNGs and "
                        "report.md)")
    outdir.mkdir(parents=True, exist_ok=True)
    images = [plot_curves(runs, outdir), plot_throughput(runs, outdir),
              plot_time_split(runs, outdir)]
    md = outdir / "report.md"
    md.write_text(summary_markdown(runs, images, outdir))
    if tensorboard:
        print(write_tensorboard(runs, outdir), file=sys.stderr)
    return md
