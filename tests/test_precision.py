"""``compute.precision = "auto"`` (rnntrain.run.precision): the timed trial steps leave the
run's start untouched, the choice is logged and kept, and a resume reuses it."""
from __future__ import annotations

import json

import pytest
import torch

from rnntrain.config import ConfigError, explain, load_config
from rnntrain.compute.device import cpu_bf16
from tests.conftest import mpiexec, run_cli, train_here
from tests.test_resume import assert_same_final, launch, train_cmd, write_config


def precision_records(run) -> list[dict]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get("split") == "precision"]


def last_state(run) -> dict:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["state"]


def test_auto_trains_exactly_like_the_precision_it_chose(tmp_path, synth_pair):
    """An "auto" run times fp32 and bf16 on copies, then ends with the same weights and
    optimizer state as a run configured with its choice directly (a real second run)."""
    cfg = write_config(tmp_path, synth_pair, threads=1)
    auto = train_here(cfg, f"run.dir={tmp_path / 'auto'}", "compute.precision=auto",
                      "train.epochs=1")
    (rec,) = precision_records(auto)
    timed = {p: rec[f"{p}_frames_per_s"] for p in ("fp32", "bf16") if f"{p}_frames_per_s" in rec}
    assert set(timed) == ({"fp32", "bf16"} if cpu_bf16() else {"fp32"})
    assert rec["chosen"] in timed and rec["steps"] >= 1
    assert timed[rec["chosen"]] == max(timed.values())
    assert last_state(auto)["precision"] == rec["chosen"]
    direct = train_here(cfg, f"run.dir={tmp_path / 'direct'}",
                        f"compute.precision={rec['chosen']}", "train.epochs=1")
    assert last_state(direct)["precision"] is None  # only "auto" records a choice
    ca = torch.load(auto / "checkpoints" / "last.pt", weights_only=True)
    cb = torch.load(direct / "checkpoints" / "last.pt", weights_only=True)
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), f"weights {k} differ"
    for i, s in ca["optim"]["state"].items():
        for k, v in s.items():
            assert torch.equal(v, cb["optim"]["state"][i][k]), f"optimizer {i}.{k} differs"


def test_auto_resume_reuses_the_recorded_choice(tmp_path, synth_pair):
    """An "auto" run killed after step 5 (a checkpoint at step 3) and resumed does not time
    again: it trains on in the recorded precision and ends bit-identical to an
    uninterrupted run configured with that precision."""
    cfg = write_config(tmp_path, synth_pair, threads=1)
    run = tmp_path / "killed"
    rc, err = launch(train_cmd(cfg, run, "compute.precision=auto"), pause="step:5")
    (rec,) = precision_records(run)
    rc, err = launch(train_cmd(cfg, run, "compute.precision=auto", "--resume", "auto"))
    assert rc == 0, err[-3000:]
    assert "resumed from" in err and f"{rec['chosen']}, as chosen when the run started" in err
    assert len(precision_records(run)) == 1  # no second timing
    straight = train_here(cfg, f"run.dir={tmp_path / 'straight'}",
                          f"compute.precision={rec['chosen']}")
    ca = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ca["state"]["precision"] == rec["chosen"]
    ca["state"]["precision"] = None  # the one difference the straight run has
    cb = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)
    assert ca["state"] == cb["state"]
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), f"weights {k} differ"


def test_a_cpu_without_bf16_kernels_is_refused_in_one_line_and_auto_picks_fp32(tmp_path,
                                                                               synth_pair):
    """On an AVX2-only CPU (Zen 3, older Xeons) oneDNN cannot build a bf16 LSTM. The CPU is
    made one here with ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN's own cap, which torch's bf16 query
    honours), in real subprocesses: "bf16" is one line and exit 2, not a worker's
    primitive error; "auto" times fp32 alone and trains."""
    cfg = write_config(tmp_path, synth_pair, threads=1)
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    r = run_cli("rnntrain", "train", cfg, f"run.dir={tmp_path / 'bf16'}",
                "compute.precision=bf16", "train.epochs=1", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "no bf16 LSTM on this CPU" in r.stderr.strip().splitlines()[-1]
    r = run_cli("rnntrain", "train", cfg, f"run.dir={tmp_path / 'auto'}",
                "compute.precision=auto", "train.epochs=1", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = precision_records(tmp_path / "auto")
    assert rec["chosen"] == "fp32" and "bf16_frames_per_s" not in rec


def test_precision_choices_and_help():
    """"auto" is a valid choice, listed by --help-config's text; a wrong value names it."""
    assert load_config(None, ["data.train=a.nc", "compute.precision=auto"]
                       ).compute.precision == "auto"
    with pytest.raises(ConfigError, match="compute.precision = 'fast'.*auto"):
        load_config(None, ["data.train=a.nc", "compute.precision=fast"])
    line = next(x for x in explain().splitlines() if x.strip().startswith("precision ="))
    assert "'auto'" in line and "'fp32'" in line


@pytest.mark.mpi
@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not available")
def test_auto_ranks_agree_on_rank_zeros_choice(tmp_path, synth_pair):
    """2 MPI ranks time their own steps; rank 0's choice is broadcast, so both train in
    one precision (the start-up weight checksum and every step's exchange would fail
    otherwise) and end like a 2-rank run configured with it."""
    cfg = write_config(tmp_path, synth_pair, threads=1)
    rc, err = launch(train_cmd(cfg, tmp_path / "auto", "compute.precision=auto",
                               "train.epochs=1", ranks=2))
    assert rc == 0, err[-3000:]
    (rec,) = precision_records(tmp_path / "auto")
    rc, err = launch(train_cmd(cfg, tmp_path / "direct", f"compute.precision={rec['chosen']}",
                               "train.epochs=1", ranks=2))
    assert rc == 0, err[-3000:]
    ca = torch.load(tmp_path / "auto" / "checkpoints" / "last.pt", weights_only=True)
    cb = torch.load(tmp_path / "direct" / "checkpoints" / "last.pt", weights_only=True)
    for k, v in ca["model"].items():
        assert torch.equal(v, cb["model"][k]), f"weights {k} differ"
