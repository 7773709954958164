"""Useful-FLOP rate of training against the machine's measured fp32 matmul peak.

Peak: ``torch.mm`` on large square fp32 matrices with 1 thread and with all cores (best of
several). Useful FLOPs: ``rnntrain.compute.model.training_flops_per_frame`` (the model's matmul
multiply-adds x 2 x 3 for forward + backward) times real (unpadded) frames per second of
``rnntrain train`` on the reference model, in fp32 and in bf16 (``compute.precision``). To
show where the gap to the cap is, the model's step alone (forward, CTC, backward of one
fixed-shape batch on one thread, no loop around it) is timed too: what torch's LSTM
kernels reach here, and so are the loop's own tasks alone (``same_tasks_gflops``: the
yardstick of the loop goals, measured right before and after each loop run). Also: peak
resident memory, and the peephole cell (RNNLIB's LSTM) against the built-in cell on the
same data.

Every throughput is also shown as a share of the CPU's own measured peak (``bench.peak``: a
tight FMA loop per core at each vector width the CPU has, beside the theoretical figure
from /proc/cpuinfo), and the section names the ISA the BLAS and oneDNN dispatch.

Run alone: ``python -m bench.flops [--quick]``.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

from rnntrain.compute import allocator

# the step alone runs under the policy `rnntrain train` uses (compute.allocator), so that
# the two rows compare the loop, not the memory allocator
allocator.configure("cache")
import torch  # noqa: E402
allocator.configure("cache")  # once torch is imported: its large-block cache

from bench import peak as pk, workloads as wl  # noqa: E402

SHAPES = ((2, 1500), (5, 600), (10, 300), (20, 300))  # (N, T): one task of 3000-6000 frames


def timed_fps(result: dict) -> float:
    """Real frames/s of the timed epochs: the mean over all but the first (it builds
    oneDNN's kernels and fills the allocator); every epoch trains the same frames."""
    recs = result["records"][1:] or result["records"]
    return sum(r["frames_per_s"] for r in recs) / len(recs)


POLICIES = ("cache", "capped", "system")  # compute.allocator, in each round's order
POLICY_ROUNDS = 3  # rounds of the policy comparison (one under --quick)


def policy_rounds(cfg, folder, rounds: int, epochs: int = 2) -> dict[str, list[dict]]:
    """fp32 training of ``cfg`` under each ``compute.allocator`` policy, interleaved:
    cache, capped, system, cache, capped, system ... (``rounds`` runs of each, ``epochs``
    epochs: the first fills the heap and builds oneDNN's kernels, the rest are timed).
    On a shared or drifting machine a single run of each policy ranked them by the moment
    it ran (full runs gave `capped` 81 %, 96 % and 85 % of `cache`'s frames/s); within a
    round the three run a minute apart. Each run: ``wl.run_rnntrain``'s figures,
    frames_per_s the timed epochs' mean, and ``load``: the 1-minute load average after it."""
    runs = {pol: [] for pol in POLICIES}
    for i in range(rounds):
        for pol in POLICIES:
            r = wl.run_rnntrain(cfg, [f"train.epochs={epochs}", f"compute.allocator={pol}"],
                                folder / f"run_fp32_{pol}_{i}")
            r.update(frames_per_s=timed_fps(r), load=os.getloadavg()[0])
            log = folder / f"run_fp32_{pol}_{i}" / "train.log"  # "capped": with its cache?
            notes = [ln.split(" ", 1)[1] for ln in (log.read_text().splitlines()
                                                   if log.is_file() else [])
                     if ln.split(" ", 1)[-1].startswith("allocator:")]
            r["note"] = notes[0] if notes else ""
            runs[pol].append(r)
    return runs


def policy_summary(runs: dict[str, list[dict]], base: str = "cache") -> dict[str, dict]:
    """Per policy, over its rounds: ``rss`` and ``fps`` (median, min, max) of peak RSS (MB)
    and frames/s; ``speed`` (median, min, max) of its frames/s over ``base``'s in the same
    round, and ``cpu`` the same of ``base``'s CPU seconds over its own (what the policy
    costs whatever else the machine ran: on an idle machine the speed ratio); ``load``
    (min, max) of the load averages after its runs. Ratios pair runs of the same round:
    not the ratio of two medians, which a drift between rounds would move."""
    def stats(xs):
        return statistics.median(xs), min(xs), max(xs)
    out = {}
    for pol, rs in runs.items():
        pairs = list(zip(rs, runs[base]))
        out[pol] = {"rss": stats([r["maxrss_mb"] for r in rs]),
                    "fps": stats([r["frames_per_s"] for r in rs]),
                    "speed": stats([r["frames_per_s"] / b["frames_per_s"] for r, b in pairs]),
                    "cpu": stats([b["cpu_s"] / r["cpu_s"] for r, b in pairs]),
                    "load": (min(r["load"] for r in rs), max(r["load"] for r in rs)),
                    "rounds": len(rs), "note": rs[0].get("note", "")}
    return out


def matmul_gflops(threads: int, n: int, reps: int, dtype=torch.float32) -> float:
    """Best-of-``reps`` GFLOP/s of an n x n @ n x n product on ``threads`` threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
        c = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=c)  # warm-up (page faults, thread pool start)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t0)
        return 2.0 * n ** 3 / best / 1e9
    finally:
        torch.set_num_threads(old)


def kernel_gflops(precision: str, n: int = 20, t: int = 300, reps: int = 3) -> float:
    """Useful GFLOP/s of the reference model's training step alone, on one thread: one
    (T=t, N=n) batch of equal lengths, forward + CTC + backward, best of ``reps``."""
    from rnntrain.compute.model import CTCModel, ctc_loss_sum, training_flops_per_frame
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        model = CTCModel(wl.REF_INPUTS, wl.REF_LABELS, wl.REF_LAYERS, wl.REF_HIDDEN, True)
        x = torch.randn(t, n, wl.REF_INPUTS, generator=g)
        lengths = torch.full((n,), t)
        targets = torch.randint(wl.REF_LABELS, (n, t // 10), generator=g).tolist()
        best = float("inf")
        for _ in range(reps + 1):  # the first builds the kernels
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                log_probs, out_len = model(x, lengths)
            loss = ctc_loss_sum(log_probs, out_len, targets, model.blank)
            torch.autograd.grad(loss, list(model.parameters()))
            best = min(best, time.perf_counter() - t0)
        fpf = training_flops_per_frame(wl.REF_INPUTS, wl.REF_HIDDEN, wl.REF_LAYERS, True,
                                       wl.REF_LABELS + 1)
        return n * t * fpf / best / 1e9
    finally:
        torch.set_num_threads(old)


def same_tasks_gflops(data: "os.PathLike", precision: str, workers: int, epoch: int = 1
                      ) -> dict:
    """The loop's own tasks, run alone: epoch ``epoch`` of the reference config's plan (as
    ``rnntrain train`` plans it for one rank), each batch split into tasks exactly as the
    step splits it for ``workers`` workers (``split_tasks``, the precision's cost model,
    ``compute.tasks_per_worker``'s default), every task computed by the training
    ``TaskComputer`` on one thread, one after the other, with no pool, reduce or update
    around it.
    → useful GFLOP/s over the real frames, tasks, batches, mean sequences per task, and
    the balance: the busy time over ``workers`` x the batches' makespans when these task
    times are dealt to the workers in queue order (as the pool does), i.e. what the
    split's imbalance alone leaves of ``workers`` x this rate."""
    import numpy as np
    from bench import ceiling
    from rnntrain.compute.model import CTCModel, training_flops_per_frame
    from rnntrain.compute.tasks import TaskComputer, cost_model_for
    from rnntrain.config import ComputeConfig
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import make_plan
    torch.manual_seed(0)
    ds = Dataset.open(str(data))
    model = CTCModel(ds.input_size, ds.num_labels, wl.REF_LAYERS, wl.REF_HIDDEN, True)
    model.train()
    comp = TaskComputer(model, torch.device("cpu"), precision=precision)
    per_worker = ComputeConfig().tasks_per_worker  # the reference config leaves it at that
    keep = ds.feasible()  # as training keeps them (no subsampling here)
    plan = make_plan(ds, keep, wl.REF_BATCH_FRAMES, wl.REF_SEED, epoch)
    payload = {}
    for c in sorted({b.chunk for b in plan}):
        payload.update(ds.load_chunk(c))
    steps = ceiling.thread_steps([b.seqs for b in plan], ds.lengths, workers, per_worker,
                                 cost_model_for(model, precision))
    # one round: the caller brackets the loop run with two of these
    r = ceiling.measure(comp, payload, ds.targets, ds.lengths, {"tasks": steps}, rounds=1,
                        seed=wl.REF_SEED, epoch=epoch)["tasks"]
    sizes = [len(g) for st in steps for _, gs in st for g in gs]
    fpf = training_flops_per_frame(wl.REF_INPUTS, wl.REF_HIDDEN, wl.REF_LAYERS, True,
                                   wl.REF_LABELS + 1)
    return {"gflops": r.frames * fpf / r.busy_s / 1e9, "tasks": r.tasks,
            "batches": len(plan), "seqs_per_task": float(np.mean(sizes)),
            "balance": r.balance}


def fp_widths(fma: dict) -> str:
    """The FMA loop's rates by width, e.g. "118.2 GFLOP/s (512-bit), 118.2 (256-bit)"."""
    if not fma:
        return "not measured (no C compiler)"
    return ", ".join(f"{g:.1f}{' GFLOP/s' if i == 0 else ''} ({w}-bit)"
                     for i, (w, g) in enumerate(fma.items()))


def implied_clock(phys: float, info) -> str:
    """The clock the measured peak implies at the FMA datapath's FLOPs per cycle."""
    pipes, bits, _ = pk.fma_datapath(info)
    per_cycle = pipes * bits // 32 * 2
    return f"; the measured peak implies {phys / per_cycle:.2f} GHz" if per_cycle else ""


def blas_verdict(mm_best: float, phys: float) -> str:
    """Whether the BLAS reaches the FMA units' rate (MKL names no code path on AMD CPUs,
    so its rate against the loop's is the evidence)."""
    if not phys:
        return ""
    share = mm_best / phys
    if share >= 0.7:
        return (f"`torch.mm` at its best shape reaches {share:.0%} of the FMA loop's rate: "
                "the BLAS runs the FMA units near their peak; the distance to the peak "
                "is in the LSTM kernels (the model's step alone, above).")
    return (f"`torch.mm` at its best shape reaches only {share:.0%} of the FMA loop's rate: "
            "the BLAS's code path leaves the FMA units idle on this CPU.")


def policy_rows(policies: dict[str, dict]) -> list[str]:
    """The table rows of ``policy_summary``'s figures: each policy's peak RSS and speed,
    `capped` against the goal (peak within +10 % of `system`'s at >= 95 % of `cache`'s
    frames/s)."""
    def rng(t, fmt):
        return f"{fmt.format(t[0])} ({fmt.format(t[1])}-{fmt.format(t[2])})"
    rows, sysrss = [], policies["system"]["rss"][0]
    for pol, r in policies.items():
        head = (f"| fp32 under `compute.allocator = \"{pol}\"`, {r['rounds']} interleaved "
                f"round(s): median (range) | {rng(r['rss'], '{:,.0f}')} MB peak RSS")
        if pol != "system":
            goal = " (goal <= +10%)" if pol == "capped" else ""
            head += f" = **{r['rss'][0] / sysrss - 1:+.0%} vs `system`'s**{goal}"
        if pol == "cache":
            rows.append(f"{head}; {rng(r['fps'], '{:,.0f}')} frames/s | |")
            continue
        goal = " (goal >= 95%)" if pol == "capped" else ""
        rows.append(f"{head}; {rng(r['fps'], '{:,.0f}')} frames/s = **{r['speed'][0]:.0%} of "
                    f"`cache`'s** in the same round ({r['speed'][1]:.0%}-{r['speed'][2]:.0%})"
                    f"{goal}; CPU seconds: `cache`'s are {rng(r['cpu'], '{:.0%}')} of its "
                    f"own | |")
    return rows


def run(quick: bool = False) -> str:
    from rnntrain.compute.model import training_flops_per_frame
    cores = os.cpu_count() or 1
    n, reps = (1024, 3) if quick else (3072, 5)
    # the physical yardstick first, on a machine not yet warmed by our own runs
    info = pk.CpuInfo.read()
    fma = pk.fma_loop_gflops(info.widths(), reps=50 if quick else 200)
    theory = pk.theoretical_gflops(info)
    phys = max(fma.values()) if fma else theory  # one core's fp32 peak, GFLOP/s
    mm_best, mm_n = pk.mm_best_gflops(reps=10 if quick else 40)
    disp = pk.dispatch()
    peak1 = matmul_gflops(1, n, reps)
    peakn = matmul_gflops(cores, n, reps)
    peak_bf16 = matmul_gflops(1, n, reps, torch.bfloat16)
    kern = {p: kernel_gflops(p, reps=1 if quick else 3) for p in ("fp32", "bf16")}
    fpf = training_flops_per_frame(wl.REF_INPUTS, wl.REF_HIDDEN, wl.REF_LAYERS, True,
                                   wl.REF_LABELS + 1)
    cap_gflops = cores * peak1          # the goal's yardstick: cores x one thread's peak
    cap_fps = cap_gflops * 1e9 / fpf

    folder = wl.workdir()
    ref = wl.reference_data(folder, 60 if quick else 240)
    cfg = wl.reference_config(folder, ref, "lstm")
    # three epochs, the last two timed: the first pays oneDNN's one-off kernel builds.
    # Each loop run is bracketed by its own tasks run alone (before and after, averaged):
    # this VM's speed drifts by 10-20 % within minutes, so the yardstick is measured
    # next to the figure it divides
    epochs = 2 if quick else 3
    loops, alone = {}, {}
    for p in ("fp32", "bf16"):
        before = same_tasks_gflops(ref, p, cores)
        loops[p] = wl.run_rnntrain(cfg, [f"train.epochs={epochs}", f"compute.precision={p}"],
                                   folder / f"run_{p}")
        after = same_tasks_gflops(ref, p, cores)
        loops[p]["frames_per_s"] = timed_fps(loops[p])
        alone[p] = dict(before, gflops=(before["gflops"] + after["gflops"]) / 2,
                        spread=(before["gflops"], after["gflops"]))
    lstm, bf16 = loops["fp32"], loops["bf16"]
    # every allocator policy's fp32 run, in interleaved rounds right after: peak RSS and
    # speed of each beside `cache`'s (compute.allocator; docs/benchmarks.md, memory)
    rounds = 1 if quick else POLICY_ROUNDS
    policies = policy_summary(policy_rounds(cfg, folder, rounds))
    shapes = {(n, t): {p: kernel_gflops(p, n, t, reps=1 if quick else 2)
                       for p in ("fp32", "bf16")} for n, t in SHAPES}
    small = wl.reference_data(folder, 30 if quick else 80, seed=8)
    peep_lstm = wl.run_rnntrain(wl.reference_config(folder, small, "lstm"), [],
                                folder / "run_small_lstm")
    peep = wl.run_rnntrain(wl.reference_config(folder, small, "peephole"), [],
                           folder / "run_small_peep")
    useful = {p: loops[p]["frames_per_s"] * fpf / 1e9 for p in loops}
    issue_cap_fps = 8500  # the issue: 95 GFLOP/s per thread x 2 cores / 22.4 MFLOP
    goal = {"fp32": 0.95, "bf16": 0.90}
    m = wl.machine()
    q = " --quick" if quick else ""

    def of_peak(gflops, used=1):
        """The share of ``used`` cores' measured fp32 peak."""
        return f"{gflops / (used * phys):.0%}" if phys else "-"

    def alone_row(p):
        a = alone[p]
        return (f"| the loop's own tasks alone, {p}, 1 thread ({a['tasks']} tasks of epoch 2, "
                f"{a['seqs_per_task']:.1f} sequences each; before / after the loop run) | "
                f"{a['gflops']:.1f} GFLOP/s ({a['spread'][0]:.1f} / {a['spread'][1]:.1f}); "
                f"the split's balance on {cores} workers {a['balance']:.0%} | "
                f"{of_peak(a['gflops'])} |")

    def loop_row(p, label):
        u, a = useful[p], alone[p]["gflops"]
        return (f"| rnntrain, reference model, {label} | {loops[p]['frames_per_s']:,.0f} frames/s "
                f"= {u:.1f} useful GFLOP/s = **{u / (cores * a):.0%} of {cores} x its tasks "
                f"alone** (goal >= {goal[p]:.0%}); {u / (cores * kern[p]):.0%} of {cores} x the "
                f"fixed-shape step | {of_peak(u, cores)} |")

    return "\n".join([
        "## Useful-FLOP rate and memory (reference model)", "",
        f"`python -m bench.flops{q}` on {m['cpu']}, {cores} cores, torch {m['torch']}.", "",
        "| figure | value | share of the CPU's measured fp32 peak |", "|---|---:|---:|",
        f"| **CPU fp32 peak, 1 core, measured**: FMA loop (12 accumulators), by vector "
        f"width | {fp_widths(fma)} | 100% |",
        f"| theoretical, 1 core: {pk.fma_datapath(info)[2]} x 2 FLOPs x {info.mhz:.0f} MHz "
        f"(/proc/cpuinfo's clock) | {theory:.1f} GFLOP/s{implied_clock(phys, info)} | "
        f"{of_peak(theory)} |",
        f"| `torch.mm` fp32, 1 thread, best square shape (n={mm_n}, best of many short "
        f"runs) | {mm_best:.1f} GFLOP/s | {of_peak(mm_best)} |",
        f"| fp32 matmul peak, 1 thread (`torch.mm` {n}x{n}; the cap's yardstick) | "
        f"{peak1:.1f} GFLOP/s | {of_peak(peak1)} |",
        f"| fp32 matmul peak, {cores} threads | {peakn:.1f} GFLOP/s "
        f"({peakn / peak1:.2f}x one thread) | {of_peak(peakn, cores)} |",
        f"| training FLOPs per frame (`training_flops_per_frame`) | {fpf / 1e6:.2f} MFLOP | |",
        f"| cap: {cores} x one-thread peak / FLOPs per frame | {cap_fps:,.0f} frames/s | "
        f"{of_peak(cap_gflops, cores)} |",
        f"| the model's step alone, fp32, 1 thread, fixed shape (N=20, T=300) | "
        f"{kern['fp32']:.1f} GFLOP/s = {kern['fp32'] / peak1:.0%} of the fp32 peak | "
        f"{of_peak(kern['fp32'])} |",
        alone_row("fp32"),
        loop_row("fp32", "fp32"),
        f"| **fp32: share of the cap** (goal >= 85%) | **{useful['fp32'] / cap_gflops:.0%}** "
        f"({lstm['frames_per_s'] / issue_cap_fps:.0%} of the issue's 8,500 frames/s) | "
        f"**{of_peak(useful['fp32'], cores)}** |",
        f"| bf16 matmul peak, 1 thread (AMX/AVX-512 where the CPU has them) | "
        f"{peak_bf16:.1f} GFLOP/s ({peak_bf16 / peak1:.1f}x fp32) | {of_peak(peak_bf16)} |",
        f"| the model's step alone, bf16, 1 thread, fixed shape (N=20, T=300) | "
        f"{kern['bf16']:.1f} GFLOP/s ({kern['bf16'] / kern['fp32']:.2f}x fp32) | "
        f"{of_peak(kern['bf16'])} |",
        alone_row("bf16"),
        loop_row("bf16", '`compute.precision = "bf16"`'),
        f"| **bf16: share of the fp32 cap** | **{useful['bf16'] / cap_gflops:.0%}** "
        f"({bf16['frames_per_s'] / issue_cap_fps:.0%} of the issue's 8,500 frames/s) | "
        f"**{of_peak(useful['bf16'], cores)}** |",
        f"| peak RSS of `rnntrain train` (whole process) | {lstm['maxrss_mb']:,.0f} MB fp32, "
        f"{bf16['maxrss_mb']:,.0f} MB bf16 | |",
        *policy_rows(policies),
        f"| peephole cell (RNNLIB's LSTM) vs built-in nn.LSTM, same data | "
        f"{peep['frames_per_s']:,.0f} vs {peep_lstm['frames_per_s']:,.0f} frames/s = "
        f"**{peep['frames_per_s'] / peep_lstm['frames_per_s']:.2f}x** (goal >= 0.5x) | |", "",
        f"- the physical yardstick: one core's fp32 FMA rate measured by a C loop "
        f"(`bench/peak.py`, built with the system's C compiler at bench time; best of many "
        f"~1 ms repetitions, which a busy machine rarely preempts), at each width the CPU "
        f"has. The last column divides each rate by that peak x the cores the row uses "
        f"(bf16 rows too: avx512_bf16's dot product does two multiply-adds per fp32 lane, "
        f"so bf16's own peak is twice this). Which ISA runs: {pk.describe_dispatch(disp)}. "
        f"{blas_verdict(mm_best, phys)}",
        "- reference model: 3-layer BLSTM, 256 per direction, 40 inputs, 30 labels + blank; "
        f"{'60' if quick else '240'} sequences of speech-like lengths (median 300 frames), "
        f"`batch.batch_frames = {wl.REF_BATCH_FRAMES}`, {epochs} epochs (the mean of all but "
        "the first timed), Adam, `compute.allocator = \"cache\"` (the default; the steps "
        "alone run under the same policy). Useful FLOPs count only the matmuls of the model "
        "on real frames (no padding, no elementwise gate math), forward + backward = 3 x "
        "forward; the issue quotes 22.4 MFLOP per frame, this formula gives "
        f"{fpf / 1e6:.2f} ({(fpf - 6 * 2 * wl.REF_HIDDEN * (wl.REF_LABELS + 1)) / 1e6:.2f} "
        "without the output layer).",
        "- the yardstick of the loop goals: the loop's own tasks alone. Epoch 2's plan, "
        "each batch split into tasks as the step splits it for this many workers (the "
        "precision's cost model), every task run by the training `TaskComputer` on one "
        "thread, one after the other: no pool, barrier, reduce, update or reader around "
        "them. Measured right before and right after each loop run and averaged, since "
        "this machine's speed drifts within minutes (the two figures are in the row). "
        "What the loop loses against it is its own: the barrier (the split's balance "
        "above is what the imbalance of the tasks alone would cost), the reduce and "
        "update on the main thread, the reader, and two tasks sharing the memory system. "
        "The fixed-shape step (N=20, T=300: bf16's best case) is the kernels' "
        "yardstick, shown for comparison: the loop's tasks differ from it in width.",
        "- where the time goes: in fp32 the recurrence is rnntrain's own "
        "(`compute.lstm = \"scan\"`, docs/threads.md): at 256 cells each time step is a "
        "product of a few sequences' state by 1 MB of weights per direction, read from L2 "
        "at every step, and the gate math is memory-bound, so even one well-shaped batch "
        "stays well below the matmul peak (the model's step alone, above). bf16 runs "
        "oneDNN's bf16 kernels (the table below sets them beside fp32 by task shape; "
        "narrow tasks, long sequences few per batch, lose most): which precision wins "
        "depends on the data's lengths and the CPU, so `compute.precision = \"auto\"` "
        "times both on the run's own first batches (README, *Precision on the CPU*). Here "
        "oneDNN ran the bf16 LSTM's forward with "
        f"`{disp['impl'].get('rnn forward_training bf16', '?')}`, and its fp32 one (what "
        "`compute.lstm = \"onednn\"` runs) with "
        f"`{disp['impl'].get('rnn forward_training f32', '?')}`.",
        "- allocator policies (rnntrain/compute/allocator.py): the same fp32 training "
        f"under each, {rounds} round(s) of `cache`, `capped`, `system` in turn (2 epochs "
        "each, the second timed), so that a busy or drifting machine slows the three "
        "alike; the speed ratio pairs runs of the same round, and the CPU-seconds ratio "
        "(user + system of the training process) is what the policy costs whatever else "
        "ran (the system time is the kernel zeroing the pages a policy gives back and "
        "faults in again). 1-minute load average after the runs: "
        f"{min(r['load'][0] for r in policies.values()):.1f}-"
        f"{max(r['load'][1] for r in policies.values()):.1f} on {cores} cores. `capped`'s "
        "run log: " + (policies["capped"]["note"] or "(no allocator line)") + ".",
        f"- peephole row: {'30' if quick else '80'} sequences, both cells in rnntrain with "
        "the same config; the peephole cell runs a Python-level time loop with a "
        "hand-written backward (`rnntrain/compute/peephole.py`).", "",
        "The step alone by task shape (one thread, useful GFLOP/s; a batch of long "
        "sequences holds few of them, so its tasks are narrow):", "",
        "| task N x T | fp32 | bf16 | bf16 / fp32 |", "|---|---:|---:|---:|",
        *[f"| {n} x {t} | {g['fp32']:.1f} | {g['bf16']:.1f} | {g['bf16'] / g['fp32']:.2f}x |"
          for (n, t), g in shapes.items()], ""])


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
