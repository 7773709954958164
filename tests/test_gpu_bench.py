"""The GPU benchmark's code paths, run small on CPU (its figures come from a GPU)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import bench.gpu as gpu


def test_measure_runs_end_to_end_and_ceiling_on_cpu(tmp_path):
    path = gpu.write_data(str(tmp_path / "t.nc"), 40, input_size=6, labels=5)
    r = gpu.measure(path, "cpu", "fp32", 1500, layers=1, hidden=8, run_dir=str(tmp_path / "r"))
    assert r["fps"] > 0 and r["ceiling"] > 0 and r["share"] == r["fps"] / r["ceiling"]
    assert r["padding"] >= 1.0


def test_section_without_cuda_says_not_measured_and_points_at_the_recorded_figures():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the real section comes from `python -m bench.gpu`")
    text = gpu.run(quick=True)
    assert "Not measured in this run" in text and "python -m bench.gpu" in text
    recorded = Path(__file__).resolve().parents[1] / "docs" / "benchmarks-gpu.md"
    assert "docs/benchmarks-gpu.md" in text and "| fp32 |" in recorded.read_text()


def test_repeated_rows_give_each_rates_median_and_range():
    runs = [{"fps": f, "ceiling": c, "peak": 1, "padding": 1.0, "share": f / c}
            for f, c in [(300.0, 10.0), (100.0, 40.0), (200.0, 20.0), (400.0, 30.0)]]
    r = gpu.summarise(runs)
    fps, ceil = sorted(x["fps"] for x in runs), sorted(x["ceiling"] for x in runs)
    assert r["fps"] == fps[1] and r["ceiling"] == ceil[1]  # lower medians of 4
    assert r["share"] == fps[1] / ceil[1] and r["repeats"] == 4
    assert r["fps_range"] == (100.0, 400.0) and r["ceiling_range"] == (10.0, 40.0)
    one = gpu.summarise(runs[:1])
    assert (one["fps"], one["ceiling"], one["fps_range"]) == (300.0, 10.0, (300.0, 300.0))
