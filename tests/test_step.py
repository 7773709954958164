"""The step as one unit (StepRunner), the typed training state, and where collectives live.

- Only rnntrain/parallel/ issues collectives, only parallel/mpi.py imports mpi4py and
  only parallel/torchdist.py torch.distributed (an AST scan of every module, with a
  positive control so the scan itself can fail).
- TrainState: round trip, and the dicts of older checkpoints keep loading.
- fp16 resume is exact: a run with dynamic loss scaling stopped, checkpointed and resumed
  ends with the same weights, scale and growth counter as the uninterrupted run (on CPU:
  the LossScaler and the step are the same code; the fp16 autocast itself needs CUDA).
"""
from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from rnntrain.compute.device import LossScaler
from rnntrain.compute.model import build_model
from rnntrain.compute.optim import build_optimizer
from rnntrain.config import Config, to_dict
from rnntrain.data.dataset import Dataset
from rnntrain.data.plan import BatchPlanner, PlanSettings, make_plan
from rnntrain.parallel.comm import LocalComm
from rnntrain.run import checkpoint as ckpt
from rnntrain.artifact.runfolder import RunFolder
from rnntrain.run.state import TrainState
from rnntrain.run.step import EpochFeed, StepRunner
from rnntrain.run.train import save_checkpoint, training_parts

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")

# the communicator's collectives (rnntrain.parallel.mpi) and mpi4py's own
COLLECTIVES = {"allreduce_", "reduce_", "bcast_", "allgather_", "allgather", "bcast_obj",
               "check_same", "barrier", "roster", "Allreduce", "Iallreduce", "Reduce",
               "Ireduce", "Bcast", "Ibcast", "Allgather", "Iallgather", "Barrier", "bcast",
               "all_reduce", "broadcast", "all_gather", "reduce_scatter"}


def collective_uses(source: str) -> list[str]:
    """Calls of a collective method and imports of mpi4py / torch.distributed in
    ``source``: ["line: what", ...]."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in COLLECTIVES:
            found.append(f"{node.lineno}: .{node.func.attr}()")
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [f"{node.lineno}: import {n}" for n in names
                  if n.split(".")[0] == "mpi4py" or n.startswith("torch.distributed")]
    return found


def test_only_the_parallel_layer_calls_collectives():
    files = sorted((ROOT / "rnntrain").rglob("*.py")) + sorted((ROOT / "data_tools").rglob("*.py"))
    outside = {}
    for p in files:
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith("rnntrain/parallel/"):
            continue
        if uses := collective_uses(p.read_text()):
            outside[rel] = uses
    assert not outside, f"collectives outside rnntrain/parallel/: {outside}"
    # mpi4py only in the MPI layer itself, torch.distributed only in its transport
    owner = {"mpi.py": "import mpi4py", "torchdist.py": "import torch.distributed"}
    for p in (ROOT / "rnntrain" / "parallel").glob("*.py"):
        imports = [u for u in collective_uses(p.read_text()) if "import" in u]
        assert all(u.endswith(owner.get(p.name, "-")) for u in imports), (p, imports)
    # positive controls: the scan sees the exchange's collectives and a stray one
    assert any("allreduce_" in u for u in collective_uses(
        (ROOT / "rnntrain/parallel/exchange.py").read_text()))
    assert collective_uses("def f(comm):\n    comm.allreduce_(x)\n") == ["2: .allreduce_()"]
    assert collective_uses("from mpi4py import MPI\n") == ["1: import mpi4py"]


def test_train_state_round_trip_and_old_checkpoint_dicts():
    s = TrainState(epoch=2, pos=7, step=31, best_ler=0.25, best_loss=3.5, since_best=1,
                   bad_in_row=2, bad_total=4, loss_scale={"scale": 512.0, "good": 17})
    d = s.state_dict()
    assert TrainState.from_dict(d) == s
    assert d["loss_scale"] is not s.loss_scale  # a copy: later changes do not leak back
    # a checkpoint written before best_loss, the bad-step counts and the loss scale
    old = TrainState.from_dict({"epoch": 1, "pos": 0, "step": 12, "best_ler": 0.5,
                                "since_best": 0})
    assert (old.epoch, old.pos, old.step, old.best_ler) == (1, 0, 12, 0.5)
    assert old.best_loss == math.inf and old.bad_total == 0 and old.loss_scale is None
    # validation bookkeeping: ties in LER go to the lower loss; patience counts the rest
    assert old.record_validation(0.5, 2.0) and old.since_best == 0
    assert not old.record_validation(0.5, 2.5) and old.since_best == 1
    assert old.record_validation(0.4, 9.0) and (old.best_ler, old.best_loss) == (0.4, 9.0)


def test_loss_scaler_state_round_trips_exactly():
    a = LossScaler(CPU, enabled=True, init=2.0 ** 10, interval=3)
    flags = [True, True, False, True, True, True, True, False, True]
    for f in flags[:5]:
        a.update(torch.tensor(f), torch.tensor(1.0))
    b = LossScaler(CPU, enabled=True, interval=3)
    b.load_state_dict(TrainState.from_dict(
        TrainState(loss_scale=a.state_dict()).state_dict()).loss_scale)
    for f in flags[5:]:
        a.update(torch.tensor(f), torch.tensor(1.0))
        b.update(torch.tensor(f), torch.tensor(1.0))
    assert a.state_dict() == b.state_dict() and a.state_dict()["scale"] != 2.0 ** 10


def _tiny(synth_pair):
    cfg = Config()
    cfg.model.layers, cfg.model.hidden = 1, 16
    cfg.optim.clip_norm, cfg.optim.lr = 5.0, 3e-3
    cfg.batch.batch_frames, cfg.compute.threads, cfg.train.seed = 600, 1, 3
    ds = Dataset.open(str(synth_pair[0]), cfg.data.chunk_frames)
    return cfg, ds, ds.feasible(1)


def _build(cfg, ds, total):
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, ds.input_size, ds.num_labels).train()
    opt = build_optimizer(cfg.optim, model.parameters())
    # fp16's dynamic scaling on an fp32 step: powers of two scale and unscale exactly
    scaler = LossScaler(CPU, enabled=True, init=2.0 ** 4, interval=2)
    planner = BatchPlanner(ds, ds.feasible(1), PlanSettings.from_config(cfg))
    return model, opt, StepRunner(cfg, model, opt, LocalComm(), CPU, 1, planner, total, scaler)


def _steps(runner, ds, keep, cfg, state, n):
    plan = make_plan(ds, keep, cfg.batch.batch_frames, cfg.train.seed, state.epoch)
    feed = EpochFeed(ds, plan, state.epoch, state.pos, state.step)
    try:
        for fed in feed:
            if n == 0:
                break
            res = runner.run(fed, state.step, want_errors=True, stop=False)
            assert bool(res.finite) and not res.stop
            state.advance(fed.index + 1)
            n -= 1
    finally:
        feed.close()


def test_fp16_loss_scale_resume_is_exact(synth_pair, tmp_path):
    cfg, ds, keep = _tiny(synth_pair)
    n, k = 7, 3
    model, opt, runner = _build(cfg, ds, total=n)
    try:
        state = runner.start(model, TrainState())
        _steps(runner, ds, keep, cfg, state, n)
        want_w = [p.detach().clone() for p in model.parameters()]
        want_scale = runner.loss_scale_state()
    finally:
        runner.close()
    assert want_scale["scale"] > 2.0 ** 4  # the scale grew: the state matters

    model, opt, runner = _build(cfg, ds, total=n)
    run = RunFolder(tmp_path / "run")
    run.make()
    card = ckpt.ModelCard.of_data(ds, to_dict(cfg))
    try:
        state = runner.start(model, TrainState())
        _steps(runner, ds, keep, cfg, state, k)
        save_checkpoint(run, card, training_parts(model, opt), cfg, runner, state,
                        "step-00000003.pt")
    finally:
        runner.close()

    ck = ckpt.read(run.step(3), training=True)
    assert ck.state().loss_scale is not None and ck.state().step == k
    model, opt, runner = _build(cfg, ds, total=n)  # a fresh process: the initial scale
    try:
        ck.restore(training_parts(model, opt))
        state = runner.start(model, ck.state())
        assert runner.loss_scale_state() == ck.state().loss_scale
        _steps(runner, ds, keep, cfg, state, n - k)
        got_scale = runner.loss_scale_state()
    finally:
        runner.close()
    assert state.step == n
    assert got_scale == want_scale
    for a, b in zip(want_w, model.parameters()):
        assert torch.equal(a, b.detach())
