"""Worker threads × intra-op threads: training frames/s of the batch scheduler.

Runs the real training step (WorkerPool → TaskComputer → fixed-order reduce → fused Adam, as
``rnntrain train`` builds it) over the same length-bucketed batches for threads ×
intra_threads ∈ {1×1, 1×2, 2×1}, on the
default model (configs/default.toml: 2×128 BLSTM, 20 inputs, 20 labels, batch_frames 3000)
and on the reference model (3-layer BLSTM, 256 per direction, 40 inputs, 30 labels +
blank, batches of 32 sequences of similar length). Settings are interleaved round by
round so that a change in machine load hits all of them alike; the best round of each is
reported. On the default model, 2 workers also run with the training LER computed as it
was before rapidfuzz (a per-sequence Python loop: best path, then the pure-Python edit
distance DP ``edit_ops_reference``, the test oracle) beside the vectorised best path + one
rapidfuzz call: the step-time cost of that loop. Also: the share of worker time idle at the barrier, the share of wall time the
main thread spends alone in the reduce and optimizer update (workers idle), and the task
cost model fitted to measured single-task times (``scheduler.CostModel.fit``).

Then the whole trainer (``rnntrain train`` in fresh processes), 1 worker, 2 worker threads
and 2 MPI ranks of 1 worker side by side, on the default config and on the reference
model (``whole_trainer_rows``: issue 30's goal), and the step-loop rows again under the
other allocator policy.

    python -m bench.threads [--quick]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rnntrain.compute import allocator

# as `rnntrain train` does (compute.allocator), before torch starts threads; run() repeats
# the rows under the other policy in a child process
ALLOCATOR = os.environ.get("RNNTRAIN_BENCH_ALLOCATOR", "cache")
allocator.configure(ALLOCATOR)
import numpy as np  # noqa: E402
import torch  # noqa: E402

allocator.configure(ALLOCATOR)  # once torch is imported: the large-block cache, if any

from data_tools.synth import write_synth
from rnntrain.data.dataset import Dataset
from rnntrain.compute.model import CTCModel, count_params
from rnntrain.data.plan import group_by_length
from rnntrain.compute.pool import CostModel, Task, WorkerPool, split_tasks
from rnntrain.compute.tasks import FlatGrad, TaskComputer, cost_model_for
from rnntrain.decode.score import edit_ops_reference
from bench import ceiling

SETTINGS = ((1, 1), (1, 2), (2, 1))   # (threads, intra_threads)
TASKS_PER_WORKER = 2                  # compute.tasks_per_worker's default


PY_EDIT = (2, 1, "python")           # 2x1 with the per-sequence Python edit distance


def python_label_errors(best: np.ndarray, lengths: np.ndarray, targets, blank: int
                        ) -> tuple[int, int]:
    """The training LER as computed before rapidfuzz (bench only; same result as
    ``tasks.task_label_errors``): a Python loop over the sequences, best path by numpy,
    edit distance by the pure-Python DP."""
    errors = ref = 0
    for j, t in enumerate(targets):
        path = best[: int(lengths[j]), j]
        keep = np.ones(len(path), bool)
        keep[1:] = path[1:] != path[:-1]
        hyp = [int(p) for p in path[keep] if p != blank]
        errors += sum(edit_ops_reference(t.tolist(), hyp))
        ref += len(t)
    return errors, ref


def _batches(ds: Dataset, kind: str, count: int, rng) -> list[list[int]]:
    ids = np.arange(ds.num_seqs)
    if kind == "frames":      # the training plan's grouping: n × longest ≤ 3000
        groups = group_by_length(ids, ds.lengths, 3000, rng)
    else:                     # buckets of 32 sequences of similar length
        order = ids[np.argsort(ds.lengths, kind="stable")]
        groups = [order[i:i + 32] for i in range(0, len(order) - 31, 32)]
    pick = rng.choice(len(groups), size=min(count, len(groups)), replace=False)
    return [list(map(int, groups[i])) for i in sorted(pick)]


def _measure(model, ds, frames, batches, threads, intra, errors: str = "rapidfuzz") -> dict:
    """Train on ``batches`` once; → frames/s, step time, barrier idle share, tasks per
    batch, label errors counted. ``errors="python"``: the training LER by the per-sequence
    Python loop (``python_label_errors``)."""
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-4, fused=True)  # as `rnntrain train` builds it
    flat = FlatGrad(params, torch.device("cpu"))
    comp = TaskComputer(model, torch.device("cpu"))
    if errors == "python":
        comp.count_errors = python_label_errors
    n_err = n_ref = 0
    cost = cost_model_for(model)
    real = idle = wall_tot = serial = 0.0
    ntasks = []
    with WorkerPool(comp, threads, intra, inline=threads == 1) as pool:  # as train.py does
        t0 = time.perf_counter()
        for step, b in enumerate(batches):
            groups = split_tasks(b, ds.lengths, threads * TASKS_PER_WORKER, cost, threads)
            tasks = [Task(j, g, ([frames[s] for s in g], [ds.targets[s] for s in g]))
                     for j, g in enumerate(groups)]
            comp.ensure_buffers(len(tasks))
            comp.key = (1, 0, step)
            results, timing = pool.run(tasks)
            t1 = time.perf_counter()
            flat.reduce_tasks(comp.buffers[: len(tasks)], results)
            n_err += flat.stats.errors     # the step's training label errors
            n_ref += flat.stats.refs
            flat.normalize_and_clip("sequences", 5.0)
            opt.step()
            serial += time.perf_counter() - t1   # workers idle meanwhile
            real += sum(len(frames[s]) for s in b)
            idle += sum(timing.idle_s)
            wall_tot += timing.wall_s * threads
            ntasks.append(len(tasks))
        dt = time.perf_counter() - t0
    return {"fps": real / dt, "idle": idle / max(wall_tot, 1e-9), "tasks": float(np.mean(ntasks)),
            "serial": serial / dt, "step_ms": 1e3 * dt / len(batches), "errors": n_err,
            "ref_labels": n_ref}


def _fit_cost(model, frames_by_len, rng) -> tuple[CostModel, CostModel]:
    """Time single tasks of N sequences of T frames on one thread; fit a·N·T + b·N + c."""
    torch.set_num_threads(1)
    comp = TaskComputer(model, torch.device("cpu"))
    comp.ensure_buffers(1)
    xs = []
    for n in (1, 4, 12):
        for t in (20, 60, 120):
            seq = frames_by_len(t, n)
            comp(0, Task(0, tuple(range(n)), seq))      # warm-up
            reps = []
            for _ in range(3):
                t0 = time.perf_counter()
                comp(0, Task(0, tuple(range(n)), seq))
                reps.append(time.perf_counter() - t0)
            xs.append((n, t, min(reps)))
    n, t, y = zip(*xs)
    fitted = CostModel.fit(n, t, y)
    a_s = float(np.linalg.lstsq(np.stack([np.multiply(n, t), n, np.ones(len(n))], 1),
                                np.asarray(y), rcond=None)[0][0])
    return fitted, CostModel(1.0, fitted.b * a_s, fitted.c * a_s)  # frame units, seconds


def _section(name, model, ds, batches, rounds, lines, py_edit: bool = False,
             ceiling_too: bool = True):
    rng = np.random.default_rng(0)
    assert len(ds.chunks) == 1, "the bench data fits one chunk"
    frames = ds.load_chunk(0)
    real = sum(int(ds.lengths[s]) for b in batches for s in b)
    padded = sum(len(b) * int(ds.lengths[b].max()) for b in batches)
    settings = SETTINGS + ((PY_EDIT,) if py_edit else ())
    best = {s: None for s in settings}
    init = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(rounds):
        for s in settings:
            model.load_state_dict(init)     # every setting trains the same weights
            r = _measure(model, ds, frames, batches, *s)
            if best[s] is None or r["fps"] > best[s]["fps"]:
                best[s] = r

    def synth_task(t, n):
        return ([rng.normal(size=(t, ds.input_size)).astype(np.float32) for _ in range(n)],
                [rng.integers(0, ds.num_labels, max(1, t // 8)) for _ in range(n)])
    if ceiling_too:  # the same batches' tasks alone (bench/ceiling.py)
        model.load_state_dict(init)
        ceil = ceiling.measure(TaskComputer(model, torch.device("cpu")), frames, ds.targets,
                               ds.lengths, {f"{w}x1": ceiling.thread_steps(
                                   batches, ds.lengths, w, TASKS_PER_WORKER,
                                   cost_model_for(model)) for w in (1, 2)}, rounds)
    fitted, secs = _fit_cost(model, synth_task, rng)
    guess = cost_model_for(model)
    one = best[(1, 1)]["fps"]
    intra_best = max(best[(1, 1)]["fps"], best[(1, 2)]["fps"])
    lines += [f"### {name}", "",
              f"{count_params(model):,} parameters; {len(batches)} batches, {real:,} frames "
              f"(padding {padded / real:.2f}x), best of {rounds} interleaved rounds.", "",
              "| threads x intra_threads | frames/s | vs 1x1 | barrier idle | reduce + update "
              "(main thread) | tasks/batch |",
              "|---|---:|---:|---:|---:|---:|"]
    for s in SETTINGS:
        r = best[s]
        lines.append(f"| {s[0]}x{s[1]} | {r['fps']:,.0f} | {r['fps'] / one:.2f}x | "
                     f"{100 * r['idle']:.1f}% | {100 * r['serial']:.1f}% | {r['tasks']:.1f} |")
    lines += ["", f"2x1 / 1x1 = {best[(2, 1)]['fps'] / one:.2f} (goal >= 1.9); 2x1 / best "
                  f"intra-op-only = {best[(2, 1)]['fps'] / intra_best:.2f} (goal >= 1.0).", ""]
    if ceiling_too:
        c1, c2 = ceil["1x1"], ceil["2x1"]
        top = c2.fps / c1.fps
        lines += [f"The ceiling of these splits (bench/ceiling.py: every task of each split "
                  f"timed alone on one thread, dealt to the workers as the pool deals them; "
                  f"no barrier, reduce or update, no second core): the 2x1 split's "
                  f"{c2.tasks / len(batches):.2f} tasks per batch cost "
                  f"{100 * (c2.busy_s / c1.busy_s - 1):+.1f}% of the 1x1 split's "
                  f"{c1.tasks / len(batches):.2f}, and keep {100 * c2.balance:.0f}% of two "
                  f"workers busy: 2x1 / 1x1 can reach at most **{top:.2f}**; measured "
                  f"{best[(2, 1)]['fps'] / one:.2f} = "
                  f"{100 * best[(2, 1)]['fps'] / one / top:.0f}% of it.", ""]
    lines += [f"Task cost fitted on one thread: {secs.b * 1e6:.0f} us per sequence, "
              f"{secs.c * 1e3:.2f} ms per task = b {fitted.b:.2f}, c {fitted.c:.1f} padded-frame "
              f"equivalents (the built-in guess for this model: b {guess.b:.2f}, "
              f"c {guess.c:.1f}).", ""]
    if py_edit:
        fast, slow = best[(2, 1)], best[PY_EDIT]
        lines += ["Training LER in the step, 2 workers x 1 intra-op thread (same batches, "
                  "same weights, interleaved with the rows above):", "",
                  "| training LER computed by | step time | frames/s | label errors counted |",
                  "|---|---:|---:|---:|",
                  f"| per-sequence Python loop + Python edit distance DP (before) | "
                  f"{slow['step_ms']:.1f} ms | {slow['fps']:,.0f} | {slow['errors']:,} |",
                  f"| vectorised best path + one rapidfuzz call (now) | {fast['step_ms']:.1f} ms "
                  f"| {fast['fps']:,.0f} | {fast['errors']:,} |", "",
                  f"Step time now / before = {fast['step_ms'] / slow['step_ms']:.3f}; training "
                  f"LER of these steps {fast['errors'] / max(fast['ref_labels'], 1):.2f} "
                  f"(an untrained model: hypothesis lengths, and so the DP's cost, differ from "
                  f"a trained one's).", ""]
    return {f"{k[0]}x{k[1]}": best[k]["fps"] for k in SETTINGS}


def _sections(quick: bool, lines: list[str], ceiling_too: bool = True
              ) -> dict[str, dict[str, float]]:
    """Both models' rows (markdown into ``lines``) → {model: {"1x1": frames/s, ...}};
    ``ceiling_too``: also each split's ceiling (bench/ceiling.py; text only)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        # the default model on data like `python -m data_tools synth` writes for it
        path = os.path.join(tmp, "default.nc")
        write_synth(path, num_seqs=400 if quick else 1000, num_labels=20, input_size=20, seed=1)
        ds = Dataset.open(path)
        model = CTCModel(ds.input_size, ds.num_labels, layers=2, hidden=128)
        out["default"] = _section("Default model (2x128 BLSTM, configs/default.toml)", model,
                                  ds, _batches(ds, "frames", 6 if quick else 20, rng),
                                  1 if quick else 2, lines, py_edit=True,
                                  ceiling_too=ceiling_too)
        # the reference model: 40 inputs, 30 labels, batches of 32 similar lengths
        path = os.path.join(tmp, "reference.nc")
        write_synth(path, num_seqs=400 if quick else 800, num_labels=30, input_size=40, seed=2,
                    mean_labels=12.0)
        ds = Dataset.open(path)
        model = CTCModel(ds.input_size, ds.num_labels, layers=3, hidden=256)
        out["reference"] = _section("Reference model (3x256 BLSTM, 40 inputs, 30 labels, "
                                    "batches of 32)", model, ds,
                                    _batches(ds, "count", 2 if quick else 5, rng),
                                    1 if quick else 2, lines, ceiling_too=ceiling_too)
    return out


def _other_allocator(quick: bool) -> tuple[str, dict | str]:
    """The same rows under the other ``compute.allocator`` policy, in a child process (the
    policy is fixed once a process has started its threads) → (policy, rows), or
    (policy, the child's error) when it failed."""
    other = "system" if ALLOCATOR == "cache" else "cache"
    env = dict(os.environ, RNNTRAIN_BENCH_ALLOCATOR=other)
    r = subprocess.run([sys.executable, "-m", "bench.threads", "--json"] +
                       (["--quick"] if quick else []), capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        return other, (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return other, json.loads(r.stdout.strip().splitlines()[-1])


def whole_trainer_rows(quick: bool) -> list[str]:
    """Issue 30's comparison as a user runs it: ``rnntrain train`` on the same data, 1
    worker, 2 worker threads of one process, and 2 MPI ranks of 1 worker (the same global
    batches: the plan deals each batch across the ranks), interleaved round by round;
    steady-state frames/s (every metric window after the first); for the default config
    and the reference model.

    Default config: four epochs a run, as the issue measured: one epoch holds six 5-step
    windows, whose rates differ by 7-18 % within an epoch (2 workers, 4 epochs, the
    windows after each epoch's first), too few for a verdict on 2 %. Reference model (3x256
    BLSTM, ``bench.workloads``' speech-like lengths, batch_frames 12000): two epochs of
    3-step windows."""
    from bench import ranks
    from bench import workloads as wl
    if ranks._mpiexec() is None:
        return ["### Whole trainer: 2 worker threads against 2 MPI ranks", "",
                "mpiexec not found: not measured.", ""]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        seqs, epochs = (600, 1) if quick else (2000, 4)
        data = os.path.join(tmp, "train.nc")
        write_synth(data, num_seqs=seqs, num_labels=20, input_size=20, seed=1)
        lines += _whole_trainer_table(
            "### Whole trainer: 2 worker threads against 2 MPI ranks (default config)",
            ranks.ROOT / "configs" / "default.toml", data, epochs, 5, 1 if quick else 3,
            Path(tmp) / "default",
            f"`rnntrain train configs/default.toml data.train=SYNTH data.val= "
            f"train.epochs={epochs} compute.threads=T compute.intra_threads=1` ({seqs} "
            f"sequences of `rnntrain-data synth`, 2x128 BLSTM, batch_frames 3000)")
        seqs, epochs = (60, 1) if quick else (400, 2)
        data = wl.reference_data(Path(tmp), seqs)
        cfg = wl.reference_config(Path(tmp), data)
        lines += _whole_trainer_table(
            "### Whole trainer: 2 worker threads against 2 MPI ranks (reference model)",
            cfg, str(data), epochs, 3, 1 if quick else 2, Path(tmp) / "reference",
            f"`rnntrain train REF.toml train.epochs={epochs} compute.threads=T "
            f"compute.intra_threads=1` (the reference model of the flops section: 3x256 "
            f"BLSTM, 40 inputs, 31 classes, batch_frames {wl.REF_BATCH_FRAMES}; {seqs} "
            f"sequences of speech-like lengths)")
    return lines


def _whole_trainer_table(title: str, cfg, data: str, epochs: int, every: int, rounds: int,
                         work: Path, what: str) -> list[str]:
    """One model's rows of ``whole_trainer_rows``: 1 worker, 2 workers, 2 MPI ranks of 1
    worker, each in a fresh process, interleaved, best of ``rounds``."""
    from bench import ranks
    settings = (("1 rank x 1 worker", 1, 1), ("1 rank x 2 workers", 1, 2),
                ("2 MPI ranks x 1 worker", 2, 1))
    best: dict[str, dict] = {}
    for k in range(rounds):
        for name, n, threads in settings:
            m = ranks._train(n, cfg, work / f"r{k}-{n}-{threads}",
                             f"data.train={data}", "data.val=", f"train.epochs={epochs}",
                             f"compute.threads={threads}", "compute.intra_threads=1",
                             f"log.every_steps={every}")
            if name not in best or m["frames_per_s"] > best[name]["frames_per_s"]:
                best[name] = m
    one = best[settings[0][0]]["frames_per_s"]
    workers = best[settings[1][0]]["frames_per_s"]
    mpi = best[settings[2][0]]["frames_per_s"]
    lines = [title, "",
             f"{what}, the MPI row under `mpiexec -n 2`; each setting in a fresh process, "
             f"the settings interleaved, best of {rounds} round(s); frames/s = mean of the "
             f"metric windows after the first ({every} steps each).", "",
             "| run | frames/s | vs 1 worker | step s | compute s | exchange s | update s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, _, _ in settings:
        m = best[name]
        lines.append(f"| {name} | {m['frames_per_s']:,.0f} | {m['frames_per_s'] / one:.2f}x | "
                     f"{m['step_s']:.3f} | {m['compute_s']:.3f} | {m['comm_s']:.4f} | "
                     f"{m['update_s']:.4f} |")
    verdict = "met" if workers >= 1.9 * one and workers >= mpi else "not met"
    lines += ["", f"2 workers / 1 worker = {workers / one:.3f} (goal >= 1.9); 2 workers / "
              f"2 MPI ranks = {workers / mpi:.3f} (goal >= 1.0); 2 MPI ranks / 1 worker = "
              f"{mpi / one:.3f}: {verdict}.", ""]
    return lines


def run(quick: bool = False) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = ["## Worker threads x intra-op threads (CPU)", "",
             f"Real training steps (task split, forward, CTC, backward, fixed-order reduce, "
             f"Adam) on {cores} cores, torch {torch.__version__}, memory allocator policy "
             f"`compute.allocator = \"{ALLOCATOR}\"` (what `rnntrain train` uses by default). "
             f"Reproduce: `python -m bench.threads{' --quick' if quick else ''}`.", ""]
    mine = _sections(quick, lines)
    lines += ["`torch.set_num_threads` is process-wide in this torch (measured: a worker that "
              "set 1 runs 2 OpenMP threads once another thread sets 2), so the pool sets the "
              "intra-op count once for all workers.", ""]
    lines += whole_trainer_rows(quick)
    other, rows = _other_allocator(quick)
    if isinstance(rows, str):
        lines += [f"The rows under `compute.allocator = \"{other}\"` were not measured: its "
                  f"child process failed ({rows}).", ""]
    else:
        lines += ["### The same rows under each allocator policy", "",
                  f"`{ALLOCATOR}` above; `{other}` measured right after in a child process "
                  "(same batches, same weights, best of the same rounds). `cache` keeps freed "
                  "memory in the process (rnntrain/compute/allocator.py), `system` is glibc's "
                  "default.", "",
                  "| model | policy | 1x1 | 1x2 | 2x1 | 2x1 / 1x1 |",
                  "|---|---|---:|---:|---:|---:|"]
        for model in mine:
            for pol, r in ((ALLOCATOR, mine[model]), (other, rows[model])):
                lines.append(f"| {model} | {pol} | {r['1x1']:,.0f} | {r['1x2']:,.0f} | "
                             f"{r['2x1']:,.0f} | {r['2x1'] / r['1x1']:.2f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if "--json" in sys.argv[1:]:
        print(json.dumps(_sections("--quick" in sys.argv[1:], [], ceiling_too=False)))
    else:
        print(run(quick="--quick" in sys.argv[1:]))
