"""The benchmark's own arithmetic: FLOP count, the plain baseline loop, section discovery.

(Speed itself is measured by ``python -m bench``, never asserted in tests.)
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rnntrain.config import ModelConfig, OptimConfig
from rnntrain.compute.model import CTCModel, training_flops_per_frame
from rnntrain.data.dataset import min_frames
from rnntrain.errors import UserError
from rnntrain.data.ncdata import read_header
from tests.conftest import ROOT


def test_training_flops_per_frame_counts_every_weight_matrix_once():
    """Per frame, an LSTM/linear layer does one multiply-add per weight-matrix entry;
    training = forward + backward = 3 x forward, 2 FLOPs per multiply-add."""
    for inputs, labels, layers, hidden, bidir in [(40, 30, 3, 256, True), (20, 20, 2, 128, True),
                                                   (13, 5, 1, 32, False)]:
        model = CTCModel(inputs, labels, layers, hidden, bidir)
        entries = sum(p.numel() for n, p in model.named_parameters() if "weight" in n)
        assert training_flops_per_frame(inputs, hidden, layers, bidir, labels + 1) == 6 * entries
    ref = training_flops_per_frame(40, 256, 3, True, 31)
    assert abs(ref / 22.4e6 - 1) < 0.01  # the figure for the reference model


def test_plain_loop_trains_every_frame_and_pads_more_than_length_grouping(synth_pair):
    """Every variant of the plain loop (fp32, bf16 autocast, the stock packed model)
    trains each trainable frame once per epoch; length grouping pads less than it."""
    from bench.plain_loop import plain_loop, rnntrain_padding
    train, _ = synth_pair
    h = read_header(str(train))
    real = sum(int(n) for n, t in zip(h.lengths, h.targets) if n >= min_frames(t))
    from rnntrain.compute.device import cpu_bf16
    threads = torch.get_num_threads()
    variants = [("fp32", {}), ("bf16", {"precision": "bf16"}), ("stock", {"stock": True})]
    if not cpu_bf16():  # an AVX2-only CPU: bf16 is refused in one line, not run
        with pytest.raises(UserError, match="no bf16 LSTM"):
            plain_loop(train, ModelConfig(layers=2, hidden=8), OptimConfig(), precision="bf16")
        variants.pop(1)
    try:
        runs = {name: plain_loop(train, ModelConfig(layers=2, hidden=8),
                                 OptimConfig(clip_norm=1.0), seed=1, max_s=300, threads=1, **kw)
                for name, kw in variants}
    finally:
        torch.set_num_threads(threads)  # plain_loop sets the process-wide thread count
    for name, res in runs.items():
        assert res["frames"] == real and res["epoch_share"] >= 1.0, name
        assert np.isfinite(res["frames_per_s"]) and res["frames_per_s"] > 0, name
    # same number of sequences per batch on average: grouping by length pads less
    ours = rnntrain_padding(train, batch_frames=int(32 * h.lengths.mean()))
    assert 1.0 <= ours < runs["fp32"]["padding"]


def test_stock_baseline_is_the_same_model_as_ctcmodel():
    """The plain loop's textbook model (one multi-layer nn.LSTM over a PackedSequence)
    computes what rnntrain's CTCModel computes, given the same weights."""
    from bench.plain_loop import StockModel
    torch.manual_seed(0)
    ours = CTCModel(5, 4, layers=2, hidden=6, bidirectional=True).double()
    stock = StockModel(5, 4, layers=2, hidden=6, bidirectional=True).double()
    with torch.no_grad():
        for i, rnn in enumerate(ours.rnns):
            for name, p in rnn.named_parameters():   # weight_ih_l0(_reverse) -> ..._l{i}...
                getattr(stock.lstm, name.replace("_l0", f"_l{i}")).copy_(p)
        stock.out.load_state_dict(ours.out.state_dict())
    lengths = torch.tensor([9, 4, 7, 2])
    x = torch.randn(9, 4, 5, dtype=torch.double)
    x[torch.arange(9).unsqueeze(1) >= lengths.unsqueeze(0)] = 0.0
    a, _ = ours(x, lengths)
    b, _ = stock(x, lengths)
    valid = torch.arange(9).unsqueeze(1) < lengths.unsqueeze(0)
    assert torch.allclose(a[valid], b[valid], atol=1e-12)


def test_suite_lists_sections_in_fixed_order():
    from bench.__main__ import SECTIONS, TOTAL_BUDGET_S, available
    names = [s[0] for s in available()]
    assert names[:3] == ["accuracy", "plain_loop", "flops"] and "workloads" not in names
    assert sum(b for _, _, b in SECTIONS) <= TOTAL_BUDGET_S


def test_peak_rss_of_a_child_is_its_own_not_its_parents():
    """The benches measure a training process's peak memory in the child itself; a parent
    that once held 300 MB must not show up in the child's figure (ru_maxrss carries it
    over vfork + exec on Linux: the cause of two sections disagreeing 2x)."""
    import subprocess
    import sys

    from bench.workloads import PEAK_RSS_CODE
    held = np.ones(300 * 2**20, dtype=np.uint8)  # touched: resident in this process
    code = PEAK_RSS_CODE + ("import resource\n"
                            "print(_peak_rss_kb(), "
                            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    ours, inherited = map(int, subprocess.run([sys.executable, "-c", code], check=True,
                                              capture_output=True, text=True).stdout.split())
    assert held.sum() == held.size
    assert ours < 150 * 1024  # a bare interpreter: tens of MB
    # documents the reason for the helper; where the kernel does not carry it, both agree
    assert inherited >= ours


def test_kernel_experiments_compute_the_same_layer_as_training():
    """The hand-written BLSTM layer of ``bench.kernels`` (one input GEMM, both directions
    per step) gives the output and input gradient of the training path (``lstm_padded``)
    on unequal lengths, so its timings compare like with like."""
    import torch
    from bench import kernels
    torch.manual_seed(0)
    rnn = torch.nn.LSTM(kernels.F, kernels.H, bidirectional=True)
    x, lengths = kernels._task(4, 30, equal=False, seed=1)
    assert len(set(lengths.tolist())) > 1   # padding inside the task: the case that matters
    fn = lambda a, b: kernels.handwritten(rnn, a, b)   # noqa: E731
    assert kernels._check(rnn, x, lengths, fn, 1e-4) < 1e-4
    from rnntrain.compute import lstmscan
    if lstmscan.unavailable() is None:   # the default kernel against oneDNN's, likewise
        fn = lambda a, b: lstmscan.lstm_scan(rnn, a, b)   # noqa: E731
        assert kernels._check(rnn, x, lengths, fn, 1e-4) < 1e-4
        rows = kernels.training_shapes(quick=True)   # both kernels on training's shapes
        assert [r.split(" |")[0] for r in rows[2:-1]] == ["| 9 x 150", "| 23 x 64", "| all"]


def test_threads_bench_python_edit_distance_counts_what_the_step_counts():
    """bench threads' 'before' switch (per-sequence loop, pure-Python DP) and the step's
    vectorised best path + rapidfuzz give the same (errors, reference labels)."""
    from bench.threads import python_label_errors
    from rnntrain.compute.tasks import task_label_errors
    rng = np.random.default_rng(5)
    for _ in range(5):
        n = 9
        best = rng.integers(0, 6, size=(50, n))          # (T', N) argmaxes, blank = 5
        lengths = rng.integers(0, 51, size=n)
        targets = [rng.integers(0, 5, size=int(k)) for k in rng.integers(1, 30, size=n)]
        assert python_label_errors(best, lengths, targets, 5) == \
            task_label_errors(best, lengths, targets, 5)


def test_flops_same_tasks_replay_trains_every_planned_sequence_once(tmp_path):
    """bench flops' yardstick (the loop's own tasks run alone) covers exactly the epoch's
    plan: every batch, every kept sequence once, and a balance that is a share."""
    from bench import flops, workloads as wl
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import make_plan
    path = wl.reference_data(tmp_path, 10)
    ds = Dataset.open(str(path))
    plan = make_plan(ds, ds.feasible(), wl.REF_BATCH_FRAMES, wl.REF_SEED, 1)
    r = flops.same_tasks_gflops(path, "fp32", 2)
    assert r["batches"] == len(plan)
    assert round(r["tasks"] * r["seqs_per_task"]) == sum(len(b.seqs) for b in plan) == \
        int(ds.feasible().sum())
    assert 0.5 <= r["balance"] <= 1.0 and r["gflops"] > 0


def test_rank_ceiling_deals_each_global_batch_as_the_ranks_plans_do(synth_pair):
    """bench ranks' ceiling: one rank's steps cover each global batch once, and the
    2-rank steps give rank r exactly its share of an independent 2-rank plan."""
    from bench.ranks import ceiling_steps
    from rnntrain.config import TrainConfig
    from rnntrain.data.plan import make_plan
    train, _ = synth_pair
    ds, _, settings, _ = ceiling_steps(train, 300, 2, 1000)
    one, two = settings["1 rank"], settings["2 ranks"]
    shares = [make_plan(ds, ds.feasible(), 300, TrainConfig().seed, 0, r, 2) for r in (0, 1)]
    assert len(one) == len(two) == len(shares[0]) == len(shares[1]) > 5
    for i, (a, b) in enumerate(zip(one, two)):
        (w, groups), = a
        assert w == 1
        both = [sorted(s for g in gs for s in g) for _, gs in b]
        assert [lane[0] for lane in b] == [1, 1]
        assert both == [sorted(shares[r][i].seqs) for r in (0, 1)]
        assert sorted(s for g in groups for s in g) == sorted(both[0] + both[1])


@pytest.mark.parametrize("clock", ["perf_counter", "thread_time"])
def test_ceiling_times_every_task_once_and_deals_them_as_the_pool_does(synth_pair, clock):
    """bench/ceiling.py runs each task of each setting once per round through the training
    TaskComputer; one worker's wall is its busy time, two workers' lies between half and
    all of it, and the rate counts every real frame of the batches. The same on either
    clock (wall time, or the thread's CPU time)."""
    import time
    from bench import ceiling
    from rnntrain.compute.model import CTCModel
    from rnntrain.compute.tasks import TaskComputer, cost_model_for
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import group_by_length
    train, _ = synth_pair
    ds = Dataset.open(str(train))
    model = CTCModel(ds.input_size, ds.num_labels, layers=1, hidden=8)
    payload = ds.load_chunk(0)
    batches = group_by_length(np.arange(ds.num_seqs), ds.lengths, 400)[:6]
    settings = {f"{w}x1": ceiling.thread_steps(batches, ds.lengths, w, 2, cost_model_for(model))
                for w in (1, 2)}
    seen = []

    class Counting(TaskComputer):  # the real computer, recording what it ran
        def __call__(self, worker, task):
            seen.append(task.seqs)
            return super().__call__(worker, task)

    c = ceiling.measure(Counting(model, torch.device("cpu")), payload, ds.targets,
                        ds.lengths, settings, rounds=2, clock=getattr(time, clock))
    frames = sum(int(ds.lengths[list(b)].sum()) for b in batches)
    for name, w in (("1x1", 1), ("2x1", 2)):
        groups = [g for st in settings[name] for _, gs in st for g in gs]
        assert sorted(s for g in groups for s in g) == sorted(int(s) for b in batches for s in b)
        assert c[name].tasks == len(groups) and c[name].lanes == w
        assert c[name].frames == frames
    assert c["1x1"].wall_s == pytest.approx(c["1x1"].busy_s, rel=1e-12)
    assert c["2x1"].busy_s / 2 <= c["2x1"].wall_s <= c["2x1"].busy_s
    n_tasks = sum(c[k].tasks for k in c)
    assert len(seen) == 1 + 2 * n_tasks  # a warm-up, then every task once per round


def test_flops_allocator_policies_pair_runs_of_the_same_round():
    """bench flops' allocator comparison: each policy's speed is the median of its
    frames/s over `cache`'s run of the same round, so a machine that slows down between
    rounds (here 2x, then 3x) moves no ratio; RSS and frames/s are plain medians."""
    from bench.flops import policy_rows, policy_summary
    slow = [1.0, 2.0, 3.0]                     # the machine's drift, round by round
    share = {"cache": [1.0] * 3, "capped": [0.90, 0.96, 0.93], "system": [0.85, 0.87, 0.86]}
    rss = {"cache": [2200, 2100, 2300], "capped": [1300, 1250, 1400], "system": [1350, 1330, 1320]}
    runs = {pol: [{"frames_per_s": 7000 * f / d, "maxrss_mb": m, "cpu_s": 60 / f,
                   "load": d} for f, d, m in zip(share[pol], slow, rss[pol])]
            for pol in share}
    for r in runs["capped"]:  # the run log's allocator line (with its cache, or why not)
        r["note"] = "allocator: capped, blocks of 4 MiB and more cached by size"
    s = policy_summary(runs)
    assert s["capped"]["note"].startswith("allocator: capped") and s["cache"]["note"] == ""
    assert s["capped"]["speed"] == pytest.approx((0.93, 0.90, 0.96))
    assert s["system"]["speed"] == pytest.approx((0.86, 0.85, 0.87))
    assert s["capped"]["cpu"] == pytest.approx((0.93, 0.90, 0.96))
    assert s["cache"]["speed"] == pytest.approx((1.0, 1.0, 1.0))
    assert s["capped"]["rss"] == (1300, 1250, 1400) and s["system"]["load"] == (1.0, 3.0)
    # the ratio of the medians would have been 0.96 * 7000/2 / (7000/2): a drift, not a policy
    assert s["capped"]["fps"][0] == pytest.approx(7000 * 0.96 / 2)
    rows = policy_rows(s)
    assert len(rows) == 3 and "-2% vs `system`'s" in rows[1] and "93% of `cache`'s" in rows[1]


def test_every_section_names_the_cpu_it_ran_on():
    """bench's document: a section that does not name the CPU gets a line under its
    heading that does; one that already names it, or a failure's text, is left alone."""
    from bench.__main__ import name_machine
    cpu = "AMD EPYC [no AMX, avx512_bf16, avx512f]"
    out = name_machine("## Inference\n\n| a | b |\n|---|---|\n", cpu, 2)
    assert out.splitlines()[:3] == ["## Inference", "",
                                    f"Measured on {cpu}, 2 cores."]
    assert out.endswith("\n| a | b |\n|---|---|\n")
    named = f"## Flops\n\n`python -m bench.flops` on {cpu}, 2 cores.\n"
    assert name_machine(named, cpu, 2) == named
    assert name_machine("no heading", cpu, 2) == "no heading"


def test_augment_bench_times_every_frame_of_the_data(synth_pair):
    """bench augment's augmenter figure covers each sequence of the file once."""
    from bench.augment import augmenter_cost
    from rnntrain.data.dataset import Dataset
    us, frames = augmenter_cost(synth_pair[0], "speech",
                                ROOT / "configs" / "fsdd_digits.toml")
    assert frames == int(Dataset.open(str(synth_pair[0])).lengths.sum()) and us > 0


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 9354
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 9354
cpu MHz\t\t: 3700.000
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16
"""


def test_cpuinfo_gives_widths_and_the_theoretical_peak():
    """The first processor's entry is read; Zen 4 (AMD family 25 with AVX-512): two
    256-bit pipes, 8 fp32 lanes each, 2 FLOPs per FMA, at 2.6 GHz = 83.2 GFLOP/s a core;
    the same flags on family 26 (Zen 5): two 512-bit pipes; AVX2 only: 256-bit."""
    from bench.peak import CpuInfo, theoretical_gflops
    info = CpuInfo.parse(CPUINFO)
    assert (info.model, info.family, info.mhz) == ("AMD EPYC 9354", 25, 2600.0)
    assert info.widths() == [512, 256]
    assert theoretical_gflops(info) == pytest.approx(2 * 8 * 2 * 2.6)
    assert theoretical_gflops(info, cores=2) == pytest.approx(2 * 2 * 8 * 2 * 2.6)
    zen5 = CpuInfo.parse(CPUINFO.replace("family\t: 25", "family\t: 26"))
    assert theoretical_gflops(zen5) == pytest.approx(2 * 16 * 2 * 2.6)
    avx2 = CpuInfo.parse(CPUINFO.replace(" avx512f avx512_bf16", ""))
    assert avx2.widths() == [256] and theoretical_gflops(avx2) == pytest.approx(83.2)


def test_fma_loop_computes_the_multiply_adds_it_counts(tmp_path):
    """The peak loop's accumulators end where the recurrence c = c * a + b, run in float64,
    ends after iters x reps steps from 0..11: the FMAs it counts are really executed."""
    from bench.peak import CpuInfo, compile_fma_loop, run_fma_loop
    widths = CpuInfo.read().widths()
    if not widths:
        pytest.skip("no FMA instructions on this CPU")
    exe = compile_fma_loop(widths[-1], tmp_path)
    if exe is None:
        pytest.skip("no C compiler")
    a, b, steps = 0.999, 0.01, 300 * 2
    gflops, acc = run_fma_loop(exe, iters=300, reps=2, a=a, b=b)
    want = np.arange(12, dtype=np.float64)
    for _ in range(steps):
        want = want * np.float32(a) + np.float32(b)
    assert gflops > 0
    np.testing.assert_allclose(acc, want, rtol=1e-4)


def test_verbose_parsing_on_a_real_mkl_and_onednn_run():
    """``dispatch`` runs a real subprocess with MKL_VERBOSE / ONEDNN_VERBOSE: the parsed
    ISA is the one on oneDNN's "isa:" line and each implementation named for the LSTM is
    the one on an executed rnn line of that run."""
    import os
    import subprocess
    import sys
    from bench.peak import _PROBE, parse_verbose
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout + r.stderr
    d = parse_verbose(text)
    isa_lines = [ln for ln in text.splitlines() if ",isa:" in ln]
    assert d["onednn_isa"] and isa_lines and isa_lines[0].endswith("isa:" + d["onednn_isa"])
    rnn = [ln.split(",") for ln in text.splitlines() if ",exec,cpu,rnn," in ln]
    assert rnn, "oneDNN ran no LSTM"
    for key in ("rnn forward_training f32", "rnn backward f32"):
        prop = key.split()[1]
        impls = {p[p.index("rnn") + 1] for p in rnn if p[p.index("rnn") + 2] == prop
                 and "src_layer:f32" in ",".join(p)}
        assert d["impl"][key] in impls, key
    if "MKL_VERBOSE" in text:  # torch built with MKL: its banner, not a GEMM call line
        assert d["mkl"] and "GEMM(" not in d["mkl"]


def test_predicted_ceiling_deals_the_cost_models_task_costs(synth_pair):
    """bench/ceiling.py's prediction: one worker's time is the sum of every task's
    predicted cost, two workers' the sum over batches of the slower worker when each task
    goes to the first free one (written out here for two workers); frames are real frames."""
    from bench import ceiling
    from rnntrain.compute.pool import CostModel
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import group_by_length
    train, _ = synth_pair
    ds = Dataset.open(str(train))
    batches = group_by_length(np.arange(ds.num_seqs), ds.lengths, 400)
    cost = CostModel(1.0, 3.0, 50.0, 0.5)
    frames = sum(int(ds.lengths[list(b)].sum()) for b in batches)

    def c(g):
        return 1.0 * len(g) * ds.lengths[list(g)].max() + 3.0 * len(g) + 50.0 \
            + 0.5 * ds.lengths[list(g)].max()
    one = ceiling.thread_steps(batches, ds.lengths, 1, 2, cost)
    assert ceiling.predicted_fps(one, ds.lengths, cost) == pytest.approx(
        frames / sum(c(g) for st in one for _, gs in st for g in gs), rel=1e-12)
    two = ceiling.thread_steps(batches, ds.lengths, 2, 2, cost)
    wall = 0.0
    for st in two:
        (_, groups), = st
        a = b = 0.0
        for g in groups:          # the first free worker takes the next task (ties: a)
            if a <= b:
                a += c(g)
            else:
                b += c(g)
        wall += max(a, b)
    assert any(len(gs) > 1 for st in two for _, gs in st)
    assert ceiling.predicted_fps(two, ds.lengths, cost) == pytest.approx(frames / wall,
                                                                          rel=1e-12)
