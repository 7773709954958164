"""`rnntrain report`: PNG figures and a markdown summary for one or several runs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli
from rnntrain.config import load_config
from rnntrain.tools.report import phase_seconds, rank_splits, report
from rnntrain.tools.runs import read_metrics
from rnntrain.run.train import train

TINY = ["model.layers=1", "batch.batch_frames=800", "compute.threads=2", "log.every_steps=3",
        "train.epochs=2"]
PNGS = ("curves.png", "throughput.png", "time_split.png")


@pytest.fixture(scope="module")
def two_runs(synth_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    cfg = d / "tiny.toml"
    cfg.write_text(f'[data]\ntrain = "{synth_pair[0]}"\nval = "{synth_pair[1]}"\n')
    runs = []
    for h in (8, 12):
        ov = [*TINY, f"model.hidden={h}", f"run.dir={d / f'h{h}'}"]
        runs.append(train(load_config(cfg, ov), str(cfg), ov))
    return runs


def _png_shape(path):
    import matplotlib.image as mpimg
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return mpimg.imread(path).shape


def test_report_overlays_two_runs(two_runs, tmp_path, capsys):
    md = report([str(r) for r in two_runs], out=str(tmp_path / "rep"), tensorboard=True)
    for name in PNGS:
        h, w, _ = _png_shape(tmp_path / "rep" / name)
        assert w >= 1000 and h >= 200, name
        assert f"]({name})" in md.read_text()
    text = md.read_text()
    for run in two_runs:
        recs = read_metrics(run)
        best = min(r["ler"] for r in recs if r["split"] == "val")
        row = [ln for ln in text.splitlines() if ln.startswith(f"| `{run.name}`")]
        assert len(row) == 1 and f"{best:.4f} (" in row[0] and "finished" in row[0]
        pad = np.mean([r["padding"] for r in recs if r["split"] == "train"])
        assert f"{100 * (pad - 1):.1f}%" in row[0]
    err = capsys.readouterr().err
    try:
        import torch.utils.tensorboard  # noqa: F401
        assert list((tmp_path / "rep" / "tensorboard").rglob("events.out.tfevents.*"))
    except ImportError:
        assert "tensorboard is not installed" in err


def test_report_cli_default_folder(two_runs):
    r = run_cli("rnntrain", "report", two_runs[0])
    assert r.returncode == 0, r.stderr
    for name in PNGS + ("report.md",):
        assert (two_runs[0] / "report" / name).stat().st_size > 0


def test_time_split_per_rank(tmp_path):
    """Per-rank splits as an MPI run records them: busy compute and barrier idle are cut
    from the pool's wall time, the reduce counts with the update."""
    run = tmp_path / "mpi"
    run.mkdir()
    ranks = [{"data_wait_s": 0.01, "compute_s": 0.10, "reduce_s": 0.001, "comm_s": 0.02,
              "update_s": 0.004, "barrier_idle": 0.2},
             {"data_wait_s": 0.03, "compute_s": 0.12, "reduce_s": 0.002, "comm_s": 0.01,
              "update_s": 0.003, "barrier_idle": 0.5}]
    recs = [{"split": "train", "epoch": 0, "step": 4 * (i + 1), "loss": 5.0 - i, "ler": 0.9,
             "frames_per_s": 100.0, "padding": 1.1, "time": 100.0 + i, **ranks[0],
             "ranks": ranks} for i in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = rank_splits(read_metrics(run))
    assert len(got) == 2
    np.testing.assert_allclose(got[0], [0.01, 0.08, 0.02, 0.02, 0.005])
    np.testing.assert_allclose(got[1], [0.03, 0.06, 0.06, 0.01, 0.005])
    np.testing.assert_allclose(phase_seconds(ranks[1]).sum(), 0.03 + 0.12 + 0.01 + 0.005)
    md = report([str(run)], out=str(tmp_path / "rep"))
    assert _png_shape(tmp_path / "rep" / "time_split.png")[0] > 100
    row = [ln for ln in md.read_text().splitlines() if ln.startswith("| `mpi`")][0]
    # data wait share of the mean step over both ranks: 0.02 of (0.135 + 0.165) / 2
    assert "| 13.3% |" in row


def test_report_errors_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "missing"):
        r = run_cli("rnntrain", "report", target)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert str(target) in r.stderr and "Traceback" not in r.stderr


def test_curves_show_ler_on_a_log_axis_the_best_checkpoint_and_the_lr(two_runs):
    """LER on a log axis that keeps 0; a star on the validation best.pt holds (its epoch as
    best.pt's own training state records it); the learning rate has its own row."""
    import matplotlib.pyplot as plt
    import torch
    from rnntrain.tools.report import RunData, curves_figure
    runs = [RunData(p, p.name) for p in two_runs]
    fig = curves_figure(runs)
    try:
        by_title = {ax.get_title(): ax for ax in fig.axes}
        ler = by_title["label error rate over step"]
        assert ler.get_yscale() == "symlog" and ler.get_ylim()[0] == 0
        lr = by_title["learning rate over step"]
        for r, line in zip(runs, [ln for ln in lr.get_lines()]):
            assert np.allclose(line.get_ydata(), [x["lr"] for x in r.train])
        stars = [ln for ln in ler.get_lines() if ln.get_marker() == "*"]
        assert len(stars) == len(runs)
        for r, star in zip(runs, stars):
            state = torch.load(r.path / "checkpoints" / "best.pt", weights_only=True)["state"]
            best = [v for v in r.val if v["epoch"] + 1 == state["epoch"]][0]
            assert star.get_xdata()[0] == best["step"]
            assert star.get_ydata()[0] == pytest.approx(state["best_ler"])
    finally:
        plt.close(fig)
