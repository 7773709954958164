"""The worker pool and the training step it runs: gradients against an independent
serial computation, bit-identical repeats, a barrier stress test, error propagation,
clean shutdown, task sizing, and SIGINT/SIGTERM at a batch boundary."""
from __future__ import annotations

import faulthandler
import itertools
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from rnntrain.compute.model import CTCModel, ctc_loss_sum
from rnntrain.compute.pool import (BrokenPool, CostModel, Task, TaskError, WorkerPool,
                                default_threads, split_tasks)
from rnntrain.compute.tasks import FlatGrad, TaskComputer, cost_model_for

from conftest import ROOT


def _batch(seed=0, n=14, f=6, labels=5):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, 30, n)
    frames = [rng.normal(size=(t, f)).astype(np.float32) for t in lengths]
    targets = [rng.integers(0, labels, int(rng.integers(1, t // 3 + 1))) for t in lengths]
    return lengths, frames, targets


def _model(seed=0):
    torch.manual_seed(seed)
    return CTCModel(6, 5, layers=2, hidden=12, bidirectional=True)


def _pool_gradient(model, lengths, frames, targets, workers, n_tasks, inline=False):
    """The training step's gradient: tasks on the pool, fixed-order reduce."""
    comp = TaskComputer(model, torch.device("cpu"))
    flat = FlatGrad(list(model.parameters()), torch.device("cpu"))
    groups = split_tasks(range(len(lengths)), lengths, n_tasks)
    tasks = [Task(j, g, ([frames[s] for s in g], [targets[s] for s in g]))
             for j, g in enumerate(groups)]
    comp.ensure_buffers(len(tasks))
    with WorkerPool(comp, workers, inline=inline) as pool:
        results, _ = pool.run(tasks)
    flat.reduce_tasks(comp.buffers[: len(tasks)], results)
    return flat.grad.clone(), flat.stats


def _serial_gradient(model, frames, targets):
    """Independent reference: each sequence alone (no padding, no pool, no task split),
    float64, plain backward; summed over the batch."""
    ref = CTCModel(6, 5, layers=2, hidden=12, bidirectional=True).double()
    ref.load_state_dict(model.state_dict())
    ref.train()
    loss_sum = 0.0
    for x, t in zip(frames, targets):
        lp, ol = ref(torch.from_numpy(x).double().unsqueeze(1), torch.tensor([len(x)]))
        loss = ctc_loss_sum(lp, ol, [t], ref.blank)
        loss.backward()
        loss_sum += float(loss.detach())
    return torch.cat([p.grad.reshape(-1) for p in ref.parameters()]), loss_sum


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_pool_gradient_equals_serial_gradient(workers):
    lengths, frames, targets = _batch()
    model = _model()
    grad, stats = _pool_gradient(model, lengths, frames, targets, workers, 2 * workers)
    ref, ref_loss = _serial_gradient(model, frames, targets)
    rel = float(torch.linalg.vector_norm(grad.double() - ref) / torch.linalg.vector_norm(ref))
    assert rel <= 1e-6, rel
    assert stats.loss == pytest.approx(ref_loss, rel=1e-6)
    assert (stats.seqs, stats.frames) == (len(frames), int(lengths.sum()))


def test_gradient_bit_identical_across_runs_and_worker_counts():
    """Same tasks → the same bits whatever the number of workers or the thread timing."""
    lengths, frames, targets = _batch(seed=1, n=20)
    model = _model(1)
    first, _ = _pool_gradient(model, lengths, frames, targets, 1, 6)
    for workers in (1, 2, 8, 2, 8):
        again, _ = _pool_gradient(model, lengths, frames, targets, workers, 6)
        assert torch.equal(again, first), workers
    inline, _ = _pool_gradient(model, lengths, frames, targets, 1, 6, inline=True)
    assert torch.equal(inline, first)


def test_inline_pool_runs_on_the_caller_and_reports_failures():
    before = set(threading.enumerate())
    calls = []

    def fn(w, task):
        calls.append((w, threading.current_thread().name, task.index))
        if 13 in task.seqs:
            raise ValueError("bad frame")
        return sum(task.seqs)
    started = []
    with WorkerPool(fn, 1, inline=True, on_start=started.append) as pool:
        assert set(threading.enumerate()) == before          # no thread started
        res, timing = pool.run([Task(0, (1, 2)), Task(1, (3,))])
        assert res == [3, 3] and len(timing.busy_s) == 1
        with pytest.raises(TaskError, match=r"worker 0 failed on task 1 \(sequences \[13\]\)"
                                            r".*ValueError: bad frame"):
            pool.run([Task(0, (4,)), Task(1, (13,)), Task(2, (5,))])
        assert pool.run([Task(0, (7,))])[0] == [7]
    me = threading.current_thread().name
    assert started == [0] and {c[:2] for c in calls} == {(0, me)}
    assert [c[2] for c in calls] == [0, 1, 0, 1, 0]   # stops at the failing task
    with pytest.raises(AssertionError):
        WorkerPool(fn, 2, inline=True)


def test_input_noise_keeps_padding_zero_and_is_deterministic():
    lengths, frames, targets = _batch(seed=2, n=6)
    model = _model(2)
    seen = []
    orig = model.forward

    def spy(x, lens, gen=None):
        seen.append(x.clone())
        return orig(x, lens, gen)
    model.forward = spy
    comp = TaskComputer(model, torch.device("cpu"), input_noise=0.5)
    comp.ensure_buffers(1)
    comp.key = (1, 0, 3)
    task = Task(0, tuple(range(6)), (frames, targets))
    comp(0, task)
    comp(0, task)
    x = seen[0]
    assert torch.equal(seen[0], seen[1])
    order = sorted(range(len(frames)), key=lambda j: -len(frames[j]))  # the worker's order
    for col, i in enumerate(order):
        n = len(frames[i])
        assert not x[n:, col].any()
        assert not torch.equal(x[:n, col], torch.from_numpy(frames[i]))


def test_stress_random_delays_no_deadlock_no_loss_no_early_release():
    """8 workers, thousands of tiny batches, random delays: every task runs exactly once,
    within its own batch, and run() returns only with every worker idle."""
    workers, batches = 8, 2000
    state = {"batch": -1}
    log_lock = threading.Lock()
    done: list[tuple[int, int]] = []
    violations: list[str] = []
    rng = random.Random(4)
    delays = [rng.random() * 2e-4 for _ in range(997)]

    def fn(w, task):
        b, i = task.payload
        if state["batch"] != b:
            violations.append(f"task {b}/{i} started outside its batch")
        if delays[(b * 31 + i) % len(delays)] > 1e-4:
            time.sleep(delays[(b * 31 + i) % len(delays)])  # a slow task
        with log_lock:
            done.append((b, i))
        if state["batch"] != b:
            violations.append(f"task {b}/{i} still running after the barrier")
        return (b, i, w)

    faulthandler.dump_traceback_later(120, exit=True)  # a deadlock fails, never hangs
    try:
        pool = WorkerPool(fn, workers)
        sizes = [rng.choice([1, 1, 2, 3, 8, 9, 17]) for _ in range(batches)]
        for b, n in enumerate(sizes):
            state["batch"] = b
            results, timing = pool.run([Task(i, (i,), (b, i)) for i in range(n)])
            with pool._lock:
                assert pool._idle == workers and pool._pending == 0 and not pool._queue
            state["batch"] = -1
            assert [r[:2] for r in results] == [(b, i) for i in range(n)]
            assert len(timing.busy_s) == workers and all(x >= 0 for x in timing.idle_s)
        pool.close()
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert not violations, violations[:5]
    assert sorted(done) == [(b, i) for b, n in enumerate(sizes) for i in range(n)]


def test_failing_task_names_worker_and_sequences_pool_stays_usable():
    def fn(w, task):
        if 13 in task.seqs:
            raise ValueError("bad frame")
        return sum(task.seqs)

    before = set(threading.enumerate())
    pool = WorkerPool(fn, 3, name="failpool")
    tasks = [Task(i, (10 + 2 * i, 11 + 2 * i)) for i in range(6)]
    with pytest.raises(TaskError, match=r"worker \d+ failed on task 1 \(sequences \[12, 13\]\)"
                                        r".*ValueError: bad frame"):
        pool.run(tasks)
    results, _ = pool.run([Task(0, (1, 2)), Task(1, (3,))])
    assert results == [3, 3]
    pool.close()
    assert set(threading.enumerate()) == before


def _within(seconds, fn):
    """fn() on a daemon thread: its exception (or None), failing the test if it has not
    returned after ``seconds`` (a hang fails, never blocks the suite)."""
    out = {}

    def body():
        try:
            fn()
        except BaseException as e:
            out["error"] = e
    t = threading.Thread(target=body, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s: the pool hangs"
    return out.get("error"), time.monotonic() - t0


@pytest.mark.parametrize("workers,inline", [(3, False), (1, False), (1, True)])
def test_raising_start_up_hook_breaks_the_pool_and_raises_in_the_caller(workers, inline):
    """A worker whose start-up hook raises (it can on CUDA: no stream, no memory) used to
    leave the constructor waiting forever for it to become idle."""
    bad = workers - 1

    def on_start(w):
        if w == bad:
            raise RuntimeError("cannot create a CUDA stream")
    pattern = (rf"worker pool broken: worker {bad} failed in its start-up hook: "
               r"RuntimeError: cannot create a CUDA stream")
    before = set(threading.enumerate())
    pools = []

    def use():
        pool = WorkerPool(lambda w, t: sum(t.seqs), workers, name="brokenstart",
                          on_start=on_start, inline=inline)
        pools.append(pool)
        pool.run([Task(0, (1, 2))])   # inline: the hook runs on the first batch
    err, took = _within(30, use)
    assert isinstance(err, BrokenPool), err
    assert re.search(pattern, str(err)) and isinstance(err.__cause__, RuntimeError)
    assert took < 10
    assert not [t for t in set(threading.enumerate()) - before
                if t.name.startswith("brokenstart")]   # the other workers were joined
    for pool in pools:                                  # and it stays broken
        with pytest.raises(BrokenPool, match=pattern):
            pool.run([Task(0, (1,))])
        pool.close()


def test_worker_that_dies_in_a_task_breaks_the_pool_and_raises_in_the_caller():
    """A task that ends its worker thread (SystemExit, KeyboardInterrupt: not a task's
    error) breaks the pool: ``wait`` raises at once instead of waiting for a barrier the
    dead worker never reaches; an ordinary exception stays a TaskError (test above)."""
    def fn(w, task):
        if 13 in task.seqs:
            raise SystemExit("worker told to exit")
        time.sleep(0.01)
        return sum(task.seqs)
    before = set(threading.enumerate())
    pool = WorkerPool(fn, 2, name="brokenbody")
    assert pool.run([Task(0, (1,)), Task(1, (2,))])[0] == [1, 2]   # healthy until then
    pattern = r"worker pool broken: worker \d failed in its worker loop: SystemExit: worker told to exit"
    err, took = _within(30, lambda: pool.run([Task(i, (10 + i,)) for i in range(6)]))
    assert isinstance(err, BrokenPool) and re.search(pattern, str(err)), err
    assert took < 10
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("brokenbody")]
    with pytest.raises(BrokenPool, match=pattern):
        pool.submit([Task(0, (1,))])
    pool.close()


@pytest.mark.parametrize("inline", [False, True])
def test_submit_returns_while_the_tasks_run_and_wait_gives_them_in_order(inline):
    """The step splits the next batch between submit and wait: the workers must already
    be computing (here they block until the caller, after submit, lets them go)."""
    go = threading.Event()

    def fn(w, task):
        assert inline or go.wait(30), "submit did not return while the task was pending"
        return task.seqs[0] * 10

    workers = 1 if inline else 2
    with WorkerPool(fn, workers, inline=inline) as pool:
        for rnd in range(3):
            go.clear()
            pool.submit([Task(i, (i + rnd,)) for i in range(5)])
            go.set()  # reached only because submit returned with the tasks queued
            results, timing = pool.wait()
            assert results == [10 * (i + rnd) for i in range(5)]
            assert len(timing.busy_s) == workers


def test_wait_for_a_free_worker_returns_when_a_worker_has_no_task_left():
    """The step splits the next batch once a worker is left without a task: not while
    every worker still has one (or one is queued), at once when a task has no taker, and
    the batch's results still come in task order."""
    gates = [threading.Event() for _ in range(3)]

    def fn(w, task):
        assert gates[task.index].wait(30), "the test never released this task"
        return task.index

    with WorkerPool(fn, 2) as pool:
        pool.submit([Task(i, (i,)) for i in range(3)])   # 2 running, 1 queued
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (pool.wait_for_a_free_worker(), done.set()))
        waiter.start()
        assert not done.wait(0.3)          # both busy, one task queued
        gates[0].set()                     # a worker takes the queued task: none free yet
        assert not done.wait(0.3)
        gates[1].set()                     # a worker finishes with nothing left to take
        assert done.wait(30)
        waiter.join()
        gates[2].set()
        assert pool.wait()[0] == [0, 1, 2]
        for g in gates:
            g.clear()
        pool.submit([Task(0, (0,))])       # one task, two workers: one is free at once
        pool.wait_for_a_free_worker()
        assert not gates[0].is_set()
        gates[0].set()
        assert pool.wait()[0] == [0]
    with WorkerPool(lambda w, t: t.index, 1, inline=True) as pool:
        pool.submit([Task(0, (0,))])
        pool.wait_for_a_free_worker()      # inline: the task runs in wait
        assert pool.wait()[0] == [0]


def test_close_joins_every_thread_and_is_idempotent():
    pool = WorkerPool(lambda w, t: w, 8, name="joinpool")
    names = {t.name for t in threading.enumerate()}
    assert {f"joinpool-{w}" for w in range(8)} <= names
    pool.run([Task(i, (i,)) for i in range(20)])
    pool.close()
    pool.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("joinpool")]


def test_on_start_runs_once_on_each_worker_thread():
    seen = []
    lock = threading.Lock()

    def on_start(w):
        with lock:
            seen.append((w, threading.current_thread().name))
    with WorkerPool(lambda w, t: threading.current_thread().name, 4, name="st",
                    on_start=on_start) as pool:
        res, _ = pool.run([Task(i, ()) for i in range(12)])
    assert sorted(seen) == [(w, f"st-{w}") for w in range(4)]
    assert set(res) <= {f"st-{w}" for w in range(4)}


def test_workers_flush_denormals_main_thread_untouched():
    # a float32 denormal times one: kept by default IEEE arithmetic, zero under FTZ/DAZ
    def tiny():
        x = torch.tensor([2.0 ** -140], dtype=torch.float32)
        return float((x * torch.tensor([1.0]))[0])
    with WorkerPool(lambda w, t: tiny(), 2, name="ftz") as pool:
        res, _ = pool.run([Task(i, ()) for i in range(4)])
    assert res == [0.0] * 4
    assert tiny() == 2.0 ** -140   # the test can tell: this thread keeps denormals


# ---- task sizing -------------------------------------------------------------------

def _brute_bottleneck(lens, k, cost):
    """Smallest possible costliest group over every contiguous cut into <= k groups."""
    best = float("inf")
    n = len(lens)
    for g in range(1, min(k, n) + 1):
        for cuts in itertools.combinations(range(1, n), g - 1):
            b = (0, *cuts, n)
            worst = max(cost(b[i + 1] - b[i], lens[b[i]]) for i in range(g))
            best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_split_tasks_partitions_and_is_balanced(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, 9)
    cost = CostModel(1.0, float(rng.uniform(0, 3)), 0.0)
    seqs = [int(s) for s in rng.permutation(9)]
    k = int(rng.integers(1, 6))
    groups = split_tasks(seqs, lengths, k, cost)
    flat = [s for g in groups for s in g]
    assert sorted(flat) == sorted(seqs) and len(groups) <= k
    order = sorted(seqs, key=lambda s: (-lengths[s], s))
    assert flat == order  # contiguous runs of the longest-first order
    lens = [int(lengths[s]) for s in order]
    worst = max(cost(len(g), int(lengths[g[0]])) for g in groups)
    assert worst <= _brute_bottleneck(lens, k, cost) * (1 + 1e-5)
    assert split_tasks(seqs, lengths, k, cost) == groups


def _scan_cuts(lens, k, cost):
    """The greedy fill as a scan over every sequence (the form the fast fill replaced)."""
    def fill(limit):
        cuts, start = [], 0
        for i in range(1, len(lens) + 1):
            if i == len(lens) or cost(i + 1 - start, lens[start]) > limit:
                cuts.append(i)
                start = i
                if len(cuts) > k:
                    return None
        return cuts

    lo, hi = max(cost(1, n) for n in lens), cost(len(lens), lens[0])
    cuts = fill(hi)
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        c = fill(mid)
        if c is None:
            lo = mid
        else:
            hi, cuts = mid, c
    return cuts


@pytest.mark.parametrize("seed", range(6))
def test_min_max_cuts_equal_a_scan_over_every_sequence(seed):
    """Task boundaries decide the gradient's summation order: the fast fill must cut
    exactly where the scan does, for any cost model (fp32, bf16, per-task heavy)."""
    from rnntrain.compute.pool import _min_max_cuts
    rng = np.random.default_rng(seed)
    models = [CostModel(), CostModel(1.0, 0.3, 40.0, 0.0), CostModel(1.0, 2.0, 500.0, 12.0),
              CostModel.for_model(1e6, 500_000, 6, "bf16")]
    for _ in range(40):
        n = int(rng.integers(1, 120))
        lens = sorted(rng.integers(1, int(rng.choice([5, 60, 900])), n).tolist(), reverse=True)
        if rng.random() < 0.3:
            lens = [lens[0]] * n  # ties: many equal costs at the limit
        for cost in models:
            for k in range(1, 6):
                assert _min_max_cuts(lens, k, cost) == _scan_cuts(lens, k, cost), (lens, k, cost)


def test_split_tasks_no_pointless_tiny_tasks():
    """A task is only added when it shortens the predicted batch time (overhead c)."""
    lengths = np.array([10, 9, 9, 8, 8, 7])
    cost = CostModel(1.0, 0.0, 20.0)  # a task's overhead: 20 frames
    # one worker: splitting only adds overhead
    assert split_tasks(range(6), lengths, 8, cost, workers=1) == [tuple(range(6))]
    # two workers: 2 tasks (50 and 44) beat 1 (71) and 3 (40 + 38 | 36 → 74)
    assert split_tasks(range(6), lengths, 8, cost, workers=2) == [(0, 1, 2), (3, 4, 5)]
    # no overhead, three workers: three tasks (20, 18, 16) beat two (30, 24)
    assert len(split_tasks(range(6), lengths, 3, CostModel(), workers=3)) == 3
    big = np.full(40, 100)  # 8 tasks of 520 beat 16 of 270 on 8 workers (2 rounds: 540)
    assert len(split_tasks(range(40), big, 16, cost, workers=8)) == 8
    assert split_tasks([], lengths, 4, cost) == []


def test_cost_model_fit_recovers_coefficients():
    rng = np.random.default_rng(0)
    n = rng.integers(1, 30, 40)
    t = rng.integers(5, 300, 40)
    y = 2e-6 * n * t + 5e-5 * n + 1e-3 + 4e-6 * t
    m = CostModel.fit(n, t, y)
    assert m.a == 1.0
    assert m.b == pytest.approx(25.0, rel=1e-6) and m.c == pytest.approx(500.0, rel=1e-6)
    assert m.d == pytest.approx(2.0, rel=1e-6)


def test_per_step_cost_keeps_tasks_wide():
    """With a per-time-step cost (bf16), cutting a batch into more tasks than workers
    only repeats the steps: 2 workers get 2 tasks, not 4; without it, 4 balance better."""
    lengths = np.array([300] * 20 + [150] * 20)
    seqs = range(len(lengths))
    flat = split_tasks(seqs, lengths, 4, CostModel(1.0, 0.0, 50.0), workers=2)
    steps = split_tasks(seqs, lengths, 4, CostModel(1.0, 0.0, 50.0, 10.0), workers=2)
    assert len(flat) == 4 and len(steps) == 2
    assert sorted(s for g in steps for s in g) == list(seqs)


def test_bf16_cost_model_has_a_step_term_fp32_none():
    model = CTCModel(40, 30, layers=3, hidden=256, bidirectional=True)
    fp32, bf16 = cost_model_for(model, "fp32"), cost_model_for(model, "bf16")
    assert fp32.d == 0.0 and 5.0 < bf16.d < 20.0   # measured ~10 frames per step
    assert fp32.c > 0 and bf16.c > fp32.c


def test_default_threads_fill_the_cores():
    import os
    cores = len(os.sched_getaffinity(0))
    assert default_threads(0, 1) == cores
    assert default_threads(0, 2) == max(1, cores // 2)
    assert default_threads(3, 1) == 3
    assert default_threads(0, 1, ranks_per_node=cores * 2) == 1


# ---- stop at a batch boundary ------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_cleanly_at_a_batch_boundary(synth_pair, tmp_path, sig):
    train, val = synth_pair
    cfg = tmp_path / "exp.toml"
    cfg.write_text(f'[data]\ntrain = "{train}"\nval = "{val}"\n[model]\nlayers = 1\n'
                   f'hidden = 8\n[train]\nepochs = 200\n[batch]\nbatch_frames = 300\n'
                   f'[log]\nevery_steps = 1\n[compute]\nthreads = 2\n')
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "rnntrain", "train", str(cfg),
                             f"run.dir={run}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    log = (run / "train.log").read_text()
    assert f"stopped by {sig.name} after step" in log
    step = int(log.split(f"stopped by {sig.name} after step ")[1].split(";")[0])
    assert (run / "checkpoints" / f"step-{step:08d}.pt").exists()
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    train_recs = [r for r in recs if r.get("split") == "train"]
    assert train_recs[-1]["step"] == step  # the last finished step was logged, no partial one
    assert "Traceback" not in err
    r = train_recs[-1]
    assert len(r["worker_compute_s"]) == 2 and r["barrier_wait_s"] >= 0


def test_training_runs_are_bit_identical_with_two_workers(synth_pair, tmp_path):
    """Same config and seed → the same weights, whatever the worker threads' timing."""
    from conftest import run_cli
    train, val = synth_pair
    cfg = tmp_path / "exp.toml"
    cfg.write_text(f'[data]\ntrain = "{train}"\n[model]\nlayers = 2\nhidden = 64\n'
                   f'[train]\nepochs = 2\ninput_noise = 0.1\n[batch]\nbatch_frames = 3000\n'
                   f'[compute]\nthreads = 2\n[log]\nevery_steps = 1\n')
    weights = []
    for name in ("a", "b"):
        r = run_cli("rnntrain", "train", cfg, f"run.dir={tmp_path / name}")
        assert r.returncode == 0, r.stderr
        ck = torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)
        weights.append(ck["model"])
        recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().split("\n")
                if '"train"' in x]
        # both workers computed in every step of 2+ sequences: the batches really were split
        assert all(min(r["worker_compute_s"]) > 0 for r in recs if r["seqs"] > 1)
        assert sum(r["seqs"] > 1 for r in recs) >= 3
    assert weights[0].keys() == weights[1].keys()
    for k in weights[0]:
        assert torch.equal(weights[0][k], weights[1][k]), k


def test_intra_threads_context_restores():
    from rnntrain.compute.pool import intra_threads, set_intra_threads
    set_intra_threads(1)
    with intra_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1
