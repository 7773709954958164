"""The device-agnostic step logic, checked on CPU tensors (the CUDA runs: test_cuda.py).

Each test compares against an independent computation: a plain full-batch forward and
backward in PyTorch, numpy arithmetic, or the optimizer's own unmasked step.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from rnntrain.data.dataset import Dataset
from rnntrain.compute.device import (LossScaler, NanGuard, autocast_dtype, cpu_bf16, host_every, masked_step,
                             pick_device)
from rnntrain.errors import UserError
from rnntrain.compute.model import CTCModel
from rnntrain.data.plan import bucket_length, bucket_lengths, make_plan
from rnntrain.compute.pool import Task, WorkerPool, task_settings
from rnntrain.compute.tasks import FlatGrad, TaskComputer

CPU = torch.device("cpu")


def batch(synth_pair, n=6, shortest=False):
    """n feasible sequences (the first, or the shortest) of the synthetic training file:
    frames, targets."""
    ds = Dataset.open(str(synth_pair[0]))
    payload = ds.load_chunk(0)
    ids = [i for i in sorted(payload) if ds.feasible()[i]]
    if shortest:
        ids.sort(key=lambda i: len(payload[i]))
    ids = ids[:n]
    return [payload[i] for i in ids], [ds.targets[i] for i in ids]


def reference_grads(model, frames, targets):
    """Full-batch loss and gradient, computed the plain way (unsorted pack, one call)."""
    lengths = torch.tensor([len(f) for f in frames])
    x = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(f) for f in frames])
    lp, out_len = model(x, lengths)
    tg = torch.cat([torch.as_tensor(t, dtype=torch.long) for t in targets])
    tl = torch.tensor([len(t) for t in targets])
    loss = F.ctc_loss(lp, tg, out_len, tl, blank=model.blank, reduction="sum")
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return float(loss.detach()), torch.cat([g.reshape(-1) for g in grads])


def run_tasks(computer, frames, targets, splits):
    tasks = [Task(j, tuple(g), ([frames[s] for s in g], [targets[s] for s in g]))
             for j, g in enumerate(splits)]
    computer.ensure_buffers(len(tasks))
    computer.begin_step()
    return [computer(0, t) for t in tasks]


@pytest.mark.parametrize("round_lengths", [0, 4])
def test_task_buffers_sum_to_full_batch_gradient(synth_pair, round_lengths):
    frames, targets = batch(synth_pair)
    torch.manual_seed(0)
    model = CTCModel(frames[0].shape[1], 6, layers=2, hidden=12)
    ref_loss, ref_grad = reference_grads(model, frames, targets)
    computer = TaskComputer(model, CPU, round_lengths=round_lengths)
    fences = run_tasks(computer, frames, targets, [[0, 3, 5], [1, 2], [4]])
    flat = FlatGrad(list(model.parameters()), CPU)
    flat.reduce_tasks(computer.buffers[:3], fences)
    loss, seqs, nframes, errors, ref = flat.stats
    assert seqs == 6 and nframes == sum(len(f) for f in frames)
    assert ref == sum(len(t) for t in targets) and 0 <= errors <= ref + nframes
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    torch.testing.assert_close(flat.grad, ref_grad, rtol=1e-4, atol=1e-5)


def test_task_buffer_holds_the_task_gradient_bit_for_bit(synth_pair):
    """Each task buffer's gradient part is its task's ``autograd.grad`` output, parameter
    after parameter in ``model.parameters()`` order (the per-parameter views the gradients
    are copied into by one call), to the bit; the other task's buffer is its own."""
    from rnntrain.compute.model import ctc_loss_sum
    from rnntrain.compute.tasks import collate
    frames, targets = batch(synth_pair)
    torch.manual_seed(0)
    model = CTCModel(frames[0].shape[1], 6, layers=2, hidden=12)
    splits = [[0, 3, 5], [1, 2, 4]]
    computer = TaskComputer(model, CPU)
    run_tasks(computer, frames, targets, splits)
    numel = sum(p.numel() for p in model.parameters())
    for buf, split in zip(computer.buffers, splits):
        order = sorted(split, key=lambda j: -len(frames[j]))  # as the task sorts them
        x, lengths = collate([frames[j] for j in order])
        lp, out_len = model(x, lengths)
        loss = ctc_loss_sum(lp, out_len, [targets[j] for j in order], model.blank)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        assert torch.equal(buf[:numel], torch.cat([g.reshape(-1) for g in grads]))


def test_errors_only_when_asked(synth_pair):
    frames, targets = batch(synth_pair, 4)
    model = CTCModel(frames[0].shape[1], 6, layers=1, hidden=8)
    computer = TaskComputer(model, CPU)
    computer.want_errors = False
    run_tasks(computer, frames, targets, [[0, 1, 2, 3]])
    assert computer.buffers[0][-2:].tolist() == [0.0, 0.0]  # errors, reference labels
    computer.want_errors = True
    run_tasks(computer, frames, targets, [[0, 1, 2, 3]])
    assert computer.buffers[0][-1].item() == sum(len(t) for t in targets)


def test_tasks_through_the_worker_pool_match_serial(synth_pair):
    """Bit-identical to the same tasks run serially on the main thread under the pool's
    own task settings (intra-op threads, denormals): with torch's default thread count the
    float sums split differently, and whether they then agree depends on the CPU."""
    frames, targets = batch(synth_pair)
    model = CTCModel(frames[0].shape[1], 6, layers=1, hidden=8)
    splits = [[0, 1], [2, 3], [4, 5]]
    threaded = TaskComputer(model, CPU)
    threaded.ensure_buffers(3)
    threaded.begin_step()
    tasks = [Task(j, tuple(g), ([frames[s] for s in g], [targets[s] for s in g]))
             for j, g in enumerate(splits)]
    with WorkerPool(threaded, 2) as pool:
        fences, _ = pool.run(tasks)
        serial = TaskComputer(model, CPU)
        with task_settings(pool.intra_threads):
            run_tasks(serial, frames, targets, splits)
    for a, b in zip(serial.buffers, threaded.buffers):
        assert torch.equal(a, b)


def test_normalize_and_clip_against_numpy():
    rng = np.random.default_rng(3)
    params = [torch.nn.Parameter(torch.zeros(7)), torch.nn.Parameter(torch.zeros(2, 3))]
    flat = FlatGrad(params, CPU)
    g = rng.normal(size=13).astype(np.float32) * 10
    flat.buf.copy_(torch.from_numpy(np.concatenate([g, [4.5, 3, 40, 2, 9]]).astype(np.float32)))
    norm, finite = flat.normalize_and_clip("sequences", clip_norm=1.0)
    want = g / 3
    assert norm.item() == pytest.approx(np.linalg.norm(want), rel=1e-5) and finite.item()
    want = want * (1.0 / (np.linalg.norm(want) + 1e-6))
    np.testing.assert_allclose(flat.grad.numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(params[1].grad.numpy(), want[7:].reshape(2, 3), rtol=1e-5)
    # below the limit the gradient is untouched; "frames" divides by the frame count
    flat.buf.copy_(torch.from_numpy(np.concatenate([g, [4.5, 3, 40, 2, 9]]).astype(np.float32)))
    norm, finite = flat.normalize_and_clip("frames", clip_norm=1e6)
    np.testing.assert_allclose(flat.grad.numpy(), g / 40, rtol=1e-6)
    # bit for bit the division alone (the multiply by exactly 1 is skipped on the CPU)
    assert np.array_equal(flat.grad.numpy().view(np.int32), (g / np.float32(40)).view(np.int32))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_reduce_tasks_is_the_left_fold_in_task_order(n):
    """The reduce sums the task buffers as ((b0 + b1) + b2) + ...: bit for bit numpy's
    float32 left fold (an empty batch: zeros)."""
    rng = np.random.default_rng(n)
    params = [torch.nn.Parameter(torch.zeros(1000)), torch.nn.Parameter(torch.zeros(3, 7))]
    flat = FlatGrad(params, CPU)
    flat.buf.fill_(7.0)  # what the last step left
    bufs = [rng.normal(size=1021 + 5).astype(np.float32) * 10 ** rng.uniform(-3, 3, 1026)
            .astype(np.float32) for _ in range(n)]
    flat.reduce_tasks([torch.from_numpy(b) for b in bufs])
    want = np.zeros(1026, np.float32)
    if bufs:
        want = bufs[0].copy()
        for b in bufs[1:]:
            want = want + b
    assert np.array_equal(flat.buf.numpy().view(np.int32), want.view(np.int32))


def test_nonfinite_loss_or_gradient_is_flagged_on_device():
    params = [torch.nn.Parameter(torch.zeros(4))]
    flat = FlatGrad(params, CPU)
    for bad_at in (1, 4):  # a gradient entry, then the loss slot
        flat.buf.copy_(torch.tensor([1.0, 2, 3, 4, 5.0, 1, 10, 0, 0]))
        flat.buf[bad_at] = math.inf if bad_at < 4 else math.nan
        norm, finite = flat.normalize_and_clip("sequences", clip_norm=1.0)
        assert finite.dtype == torch.bool and finite.dim() == 0 and not finite.item()


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_masked_step_skips_without_touching_state(name):
    """A fused optimizer takes the finite flag as a tensor: a NaN step leaves weights,
    moments and the step count as they were; a finite step equals the unfused step."""
    torch.manual_seed(1)
    w0 = torch.randn(10)

    def make(fused):
        p = torch.nn.Parameter(w0.clone())
        cls = torch.optim.Adam if name == "adam" else torch.optim.SGD
        kw = {"lr": 0.1} if name == "adam" else {"lr": 0.1, "momentum": 0.9}
        return p, cls([p], fused=fused, **kw)

    p, opt = make(True)
    q, ref = make(None)
    for k, g in enumerate([torch.randn(10), torch.full((10,), math.nan), torch.randn(10)]):
        p.grad = g.clone()
        finite = torch.isfinite(g).all()
        before = {k2: v.clone() for k2, v in opt.state[p].items()} if opt.state else {}
        w = p.detach().clone()
        masked_step(opt, finite)
        if not finite:
            assert torch.equal(p.detach(), w)
            for k2, v in before.items():
                assert torch.equal(opt.state[p][k2], v), k2
        else:
            q.grad = g.clone()
            ref.step()
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    assert not hasattr(opt, "found_inf")


def test_masked_step_after_loading_an_unfused_state():
    p = torch.nn.Parameter(torch.ones(3))
    plain = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(3)
    plain.step()
    q = torch.nn.Parameter(p.detach().clone())
    opt = torch.optim.Adam([q], lr=0.1, fused=True)
    opt.load_state_dict(plain.state_dict())  # the saved groups say fused = None
    q.grad = torch.full((3,), math.nan)
    masked_step(opt, torch.isfinite(q.grad).all())
    assert torch.equal(q.detach(), p.detach())
    q.grad = torch.ones(3)
    masked_step(opt, torch.tensor(True))
    plain.step()
    torch.testing.assert_close(q.detach(), p.detach())


def test_nan_guard_counts_runs():
    guard = NanGuard(CPU)
    flags = [True, False, False, True, False, False, False]
    for f in flags[:4]:
        guard.add(torch.tensor(f))
    assert guard.read() == (2, 2)
    for f in flags[4:]:
        guard.add(torch.tensor(f))
    assert guard.read() == (3, 3)
    guard.add(torch.tensor(False))  # the run goes on across reads
    assert guard.read() == (1, 4)


def test_loss_scaler_backoff_growth_and_unscale(synth_pair):
    scaler = LossScaler(CPU, enabled=True, init=2.0 ** 10, interval=3)
    seq = [True, False, True, True, True, False, False]
    scales = []
    for f in seq:
        tolerated = scaler.update(torch.tensor(f), torch.tensor(1.0))
        assert tolerated.item() == (not f)  # an overflow the scale can still absorb
        scales.append(scaler.scale.item())
    assert scales == [2.0 ** 10, 2.0 ** 9, 2.0 ** 9, 2.0 ** 9, 2.0 ** 10, 2.0 ** 9, 2.0 ** 8]
    assert not scaler.update(torch.tensor(False), torch.tensor(math.nan)).item()  # bad loss
    floor = LossScaler(CPU, enabled=True, init=1.0)
    assert not floor.update(torch.tensor(False), torch.tensor(1.0)).item()  # nothing to back off
    assert floor.scale.item() == 1.0
    off = LossScaler(CPU, enabled=False)
    assert not off.update(torch.tensor(False), torch.tensor(1.0)).item()
    assert off.scale.item() == 1.0
    # the scaled task gradient, unscaled in normalize_and_clip, equals the plain one
    frames, targets = batch(synth_pair, 4)
    model = CTCModel(frames[0].shape[1], 6, layers=1, hidden=8)
    _, ref_grad = reference_grads(model, frames, targets)
    computer = TaskComputer(model, CPU)
    computer.scaler = LossScaler(CPU, enabled=True, init=2.0 ** 12)
    fences = run_tasks(computer, frames, targets, [[0, 1], [2, 3]])
    flat = FlatGrad(list(model.parameters()), CPU)
    flat.reduce_tasks(computer.buffers[:2], fences)
    assert flat.grad.abs().max() > 100 * ref_grad.abs().max()  # really scaled
    norm, finite = flat.normalize_and_clip("sum", 0.0, computer.scaler.scale)
    assert finite.item()
    torch.testing.assert_close(flat.grad, ref_grad, rtol=1e-4, atol=1e-5)
    # an injected Inf: step flagged non-finite, so skipped, and the scale backs off
    flat.reduce_tasks(computer.buffers[:2])
    flat.grad[5] = math.inf
    _, finite = flat.normalize_and_clip("sum", 0.0, computer.scaler.scale)
    tolerated = computer.scaler.update(finite, flat.stats_tensor[0])
    assert not finite.item() and tolerated.item() and computer.scaler.scale.item() == 2.0 ** 11


def test_device_choice_and_precision_policy():
    assert pick_device("cpu") == CPU
    assert host_every(CPU, 20) == 1
    assert autocast_dtype("fp32", CPU) is None
    if cpu_bf16():
        assert autocast_dtype("bf16", CPU) == torch.bfloat16
    else:  # an AVX2-only CPU (Zen 3, older Xeons): one line, not oneDNN's primitive error
        with pytest.raises(UserError, match="no bf16 LSTM on this CPU"):
            autocast_dtype("bf16", CPU)
    with pytest.raises(UserError, match="fp16"):
        autocast_dtype("fp16", CPU)
    with pytest.raises(UserError, match="choose"):
        pick_device("gpu")
    if not torch.cuda.is_available():
        assert pick_device("auto") == CPU
        with pytest.raises(UserError, match="CUDA is not available"):
            pick_device("cuda:0")


def test_bf16_training_lowers_the_loss(synth_pair):
    if not cpu_bf16():  # the refusal on such a CPU: test_device_choice_and_precision_policy
        pytest.skip("oneDNN runs no bf16 LSTM on this CPU (AVX2 only)")
    frames, targets = batch(synth_pair, 4, shortest=True)  # bf16 LSTM is slow on CPU
    torch.manual_seed(0)
    model = CTCModel(frames[0].shape[1], 6, layers=1, hidden=16)
    computer = TaskComputer(model, CPU, precision="bf16")
    flat = FlatGrad(list(model.parameters()), CPU)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(4):
        fences = run_tasks(computer, frames, targets, [[0, 1], [2, 3]])
        flat.reduce_tasks(computer.buffers[:2], fences)
        losses.append(flat.stats.loss)
        _, finite = flat.normalize_and_clip("sequences", 1.0)
        masked_step(opt, finite)
    assert losses[-1] < 0.6 * losses[0] and all(np.isfinite(losses))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 100_000), k=st.integers(1, 8))
def test_bucket_length_properties(n, k):
    b = bucket_length(n, k)
    assert b >= n and b % 8 == 0
    assert b <= math.ceil(n * 2 ** (1 / k)) + 8
    assert bucket_length(n + 1, k) >= b
    assert bucket_length(b, k) == b  # a bucket size is its own bucket


def test_bucket_ladder_is_short():
    sizes = set(bucket_lengths(np.arange(1, 4097), 4).tolist())
    assert len(sizes) <= 4 * 12 + 1  # about per_octave sizes per doubling
    assert bucket_length(100, 0) == 100


def test_plan_budget_counts_bucket_lengths(synth_pair):
    ds = Dataset.open(str(synth_pair[0]))
    keep = ds.feasible()
    rounded = bucket_lengths(ds.lengths, 2)
    plan = make_plan(ds, keep, 400, seed=1, epoch=0, round_lengths=2)
    seen = sorted(s for step in plan for s in step.seqs)
    assert seen == sorted(np.flatnonzero(keep).tolist())
    for step in plan:
        ids = list(step.seqs)
        assert len(ids) == 1 or len(ids) * rounded[ids].max() <= 400
    assert len(plan) >= len(make_plan(ds, keep, 400, seed=1, epoch=0))


def test_training_loop_same_weights_whatever_the_threads(synth_pair, tmp_path):
    """The loop with device-side figures and bucket rounding: two runs whose two worker
    threads race differently give bit-identical weights and metric lines."""
    import json
    from rnntrain.run.checkpoint import read
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    runs = []
    for run, (threads, per_worker) in enumerate(((2, 1), (2, 1))):
        d = tmp_path / f"t{run}"
        cfg = load_config(None, [f"data.train={json.dumps(str(synth_pair[0]))}",
                                 "model.hidden=12", "model.layers=1", "train.epochs=1",
                                 "batch.batch_frames=1500", "batch.round_lengths=4",
                                 f"compute.threads={threads}", "log.every_steps=2",
                                 f"compute.tasks_per_worker={per_worker}",
                                 f"run.dir={json.dumps(str(d))}"])
        train(cfg)
        recs = [json.loads(x) for x in open(d / "metrics.jsonl")]
        runs.append((read(d / "checkpoints" / "last.pt").parts["model"],
                     [(r["step"], r["loss"], r["ler"], r["seqs"]) for r in recs]))
    (w1, m1), (w2, m2) = runs
    assert m1 == m2 and len(m1) >= 2 and all(np.isfinite(r[1]) for r in m1)
    assert sum(r[3] for r in m1) == int(Dataset.open(str(synth_pair[0])).feasible().sum())
    for k in w1:
        assert torch.equal(w1[k], w2[k]), k
