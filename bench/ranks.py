"""Benchmark section: MPI ranks, and torch.distributed (torchrun, gloo) beside them.

1. Speed: 2 ranks x 1 thread vs 1 rank x 1 thread on the default model (2-layer BLSTM,
   128 per direction) and the default synthetic task, as a user runs it (``rnntrain
   train`` under ``mpiexec``), in both exchange modes; exchange time vs step time.
2. Bytes on the wire per step: the exchange alone, forced over TCP loopback (MPICH:
   ``MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self``) so that the kernel's loopback counters
   (/proc/net/dev) measure what MPI really sends; vs the model size and the textbook
   figures (ring allreduce 2(N-1)/N x size per rank; master (N-1) x size into rank 0 and
   the same out again for the weights).
3. Straggler gap (max - min compute time over ranks, per step) with our sharding
   (length-grouped global batches dealt across ranks) vs random sharding (each rank
   batches its own random 1/N of the data) at N = 2 and 4 (4 is oversubscribed on a
   2-core machine: fine for the gap, not for speed).

4. torch.distributed rows: the same 2-rank run under torchrun, and the exchange alone
   over gloo's TCP, beside MPI's; the 2-rank torchrun run with the exchange overlapped
   with backward (``dist.overlap = "on"``) vs not.

    python -m bench.ranks [--quick]
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
INPUTS, LABELS = 20, 20      # the default synthetic task (rnntrain-data synth defaults)

CONFIG = """[data]
train = "{train}"
[train]
epochs = {epochs}

[compute]
threads = 1
intra_threads = 1

[log]
every_steps = 5

[batch]
batch_frames = {batch_frames}
"""


def _mpiexec() -> str | None:
    cand = Path(sys.executable).with_name("mpiexec")
    return str(cand) if cand.exists() else shutil.which("mpiexec")


def _launch(n: int, args: list[str], env: dict | None = None, timeout: float = 1200,
            engine: str = "mpi"):
    """``python ARGS`` alone, under mpiexec, or under torchrun (engine = "torch")."""
    cmd = [sys.executable, *args]
    if n > 1 and engine == "torch":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(n), *args]
    elif n > 1:
        cmd = [_mpiexec(), "-n", str(n), *cmd]
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=e, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


def _metrics(run_dir: Path) -> dict:
    """Steady-state figures of a run: every metric window but the first (warm-up)."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r["split"] == "train"]
    recs = recs[1:] if len(recs) > 1 else recs
    keys = ("frames_per_s", "compute_s", "comm_s", "update_s", "reduce_s", "data_wait_s",
            "straggler_gap_s", "buckets_in_backward")
    out = {k: float(np.mean([r.get(k, 0.0) for r in recs])) for k in keys}
    out["step_s"] = sum(out[k] for k in ("compute_s", "comm_s", "update_s", "reduce_s",
                                         "data_wait_s"))
    return out


# our sharding (length-grouped global batches dealt across ranks) vs the naive random one
# (each rank batches its own random 1/N of the data): ``batch.plan`` strategies
STRATEGY = {"ours": "auto", "random": "random"}


def _train(n: int, config: Path, run_dir: Path, *overrides: str, sharding: str = "ours",
           engine: str = "mpi"):
    args = ["-m", "rnntrain", "train", str(config), f"run.dir={run_dir}",
            f"batch.plan={STRATEGY[sharding]}", *overrides]
    t0 = time.perf_counter()
    _launch(n, args, engine=engine)
    m = _metrics(run_dir)
    m["wall_s"] = time.perf_counter() - t0
    return m


def frame_imbalance(plans: list[list], lengths: np.ndarray) -> float:
    """Mean over steps of (max - min) / mean padded frames over ranks (0 = balanced)."""
    out = []
    for steps in zip(*plans):
        f = np.array([len(s.seqs) * lengths[list(s.seqs)].max() if s.seqs else 0
                      for s in steps])
        out.append((f.max() - f.min()) / max(f.mean(), 1))
    return float(np.mean(out))


def _imbalance(data: Path, batch_frames: int, world: int, sharding: str) -> float:
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import make_plan
    ds = Dataset.open(str(data), 2_000_000)
    keep = ds.feasible(1)
    return frame_imbalance([make_plan(ds, keep, batch_frames, 1, 0, r, world,
                                      strategy=STRATEGY[sharding]) for r in range(world)],
                           ds.lengths)


# ---- the exchange alone, for bytes on the wire and its time

def tcp_bytes(pid: int) -> dict:
    """{(local, peer): (bytes sent, bytes received)} of the TCP sockets of process ``pid``,
    from the kernel (``ss -tinp``)."""
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return {}
    res, cur = {}, None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            f = line.split()
            cur = (f[3], f[4]) if f"pid={pid}," in line else None
        elif cur is not None:
            sent = re.search(r"bytes_sent:(\d+)", line)
            recv = re.search(r"bytes_received:(\d+)", line)
            res[cur] = (int(sent.group(1)) if sent else 0, int(recv.group(1)) if recv else 0)
    return res


def _delta(before: dict, after: dict) -> tuple[int, int]:
    sent = sum(v[0] - before.get(k, (0, 0))[0] for k, v in after.items())
    recv = sum(v[1] - before.get(k, (0, 0))[1] for k, v in after.items())
    return sent, recv


def exchange_worker(mode: str, wire: str, steps: int):
    """Under mpiexec or torchrun: K exchanges of the default model's gradient; rank 0
    prints JSON."""
    import torch
    from rnntrain.parallel import launch as dist
    from rnntrain.config import DistConfig, ModelConfig
    from rnntrain.parallel.exchange import Exchange
    from rnntrain.compute.model import build_model
    from rnntrain.compute.tasks import FlatGrad
    comm = dist.init()
    torch.manual_seed(0)
    model = build_model(ModelConfig(), INPUTS, LABELS)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=1e-9)
    flat = FlatGrad(params, torch.device("cpu"))
    ex = Exchange(comm, DistConfig(mode=mode, wire=wire), flat, params)
    g = torch.randn(flat.numel) * 1e-3

    def one(i):
        flat.grad.copy_(g)
        flat.buf[flat.numel:] = 1.0
        ex.reduce(i)
        ex.apply_update(opt, torch.tensor(True))
        ex.publish(i)
    for i in range(2):
        one(i)
    comm.barrier()
    b0, t0, sent0 = tcp_bytes(os.getpid()), time.perf_counter(), ex.bytes_sent
    for i in range(steps):
        one(i)
    comm.barrier()
    dt, b1 = time.perf_counter() - t0, tcp_bytes(os.getpid())
    wire = comm.allgather(_delta(b0, b1))
    handed = comm.allgather(ex.bytes_sent - sent0)
    if comm.rank == 0:
        print("BENCH", json.dumps({"sent": [w[0] / steps for w in wire],
                                   "recv": [w[1] / steps for w in wire], "s": dt / steps,
                                   "model_bytes": 4 * flat.numel,
                                   "handed": [h / steps for h in handed], "steps": steps}))


def _exchange(n: int, mode: str, wire: str, steps: int, tcp: bool, engine: str = "mpi") -> dict:
    env = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"} if tcp else {}
    if engine == "torch":
        env = {"GLOO_SOCKET_IFNAME": "lo"}  # gloo on the CPU: always TCP
    r = _launch(n, ["-m", "bench.ranks", "--exchange-worker", mode, wire, str(steps)], env,
                engine=engine)
    line = [x for x in r.stdout.splitlines() if x.startswith("BENCH ")][-1]
    return json.loads(line[6:])


def torch_rows(cfg: Path, work: Path, one: dict, two_mpi: dict, steps: int,
               quick: bool) -> list[str]:
    """torch.distributed (torchrun + gloo) beside MPI: 2 ranks vs 1 as a user runs it,
    and the exchange alone (bytes on the wire from the kernel's socket counters)."""
    lines = ["### torch.distributed (torchrun, gloo) beside MPI", "",
             "The same runs started with `torchrun --standalone --nproc_per_node 2` "
             "(dist.backend = auto picks torch.distributed). gloo has no shared-memory path "
             "on the CPU: every byte goes over TCP (here the loopback). The 16-bit wires "
             "have no native reduction in torch.distributed: each rank gathers every "
             "rank's compressed message and sums them in rank order ((N-1) x size/2 "
             "received per rank).", "",
             "| engine | run | frames/s | speed-up vs 1 rank | step s | exchange s (incl. "
             "wait) |", "|---|---|---|---|---|---|"]
    t2 = _train(2, cfg, work / "torch2", engine="torch")
    for eng, name, m in (("-", "1 rank", one), ("MPI", "2 ranks, allreduce", two_mpi),
                         ("torch (gloo)", "2 ranks, allreduce", t2)):
        lines.append(f"| {eng} | {name} | {m['frames_per_s']:.0f} | "
                     f"{m['frames_per_s'] / one['frames_per_s']:.2f}x | {m['step_s']:.3f} | "
                     f"{m['comm_s']:.4f} |")
    lines += overlap_rows(cfg, work, t2)
    lines += ["", "| engine | ranks | mode | wire | rank 0 sent / received | other rank "
              "sent / received | time/exchange (TCP) |", "|---|---|---|---|---|---|---|"]
    combos = (("allreduce", "fp32"), ("master", "fp32"), ("allreduce", "bf16"))
    for engine in ("mpi", "torch"):
        for mode, wire in combos[:1] if quick else combos:
            x = _exchange(2, mode, wire, steps, tcp=True, engine=engine)
            size = x["model_bytes"]
            sent, recv = np.array(x["sent"]) / size, np.array(x["recv"]) / size
            lines.append(f"| {'MPI' if engine == 'mpi' else 'torch (gloo)'} | 2 | {mode} | "
                         f"{wire} | {sent[0]:.2f} / {recv[0]:.2f} | {sent[1]:.2f} / "
                         f"{recv[1]:.2f} | {x['s'] * 1e3:.1f} ms |")
    lines += ["", "Bytes in units of the fp32 gradient size.", ""]
    return lines


OVERLAP_BUCKET_MB = 0.5  # a few buckets for the default model's 2.4 MB gradient


def overlap_rows(cfg: Path, work: Path, plain: dict) -> list[str]:
    """2 torchrun ranks (gloo), the exchange overlapped with the last task's backward
    (``dist.overlap = "on"``) vs after it (``plain``: the torch run just before)."""
    runs = {"off": plain, "on": _train(2, cfg, work / "torch-overlap", "dist.overlap=on",
                                       f"dist.bucket_mb={OVERLAP_BUCKET_MB}", engine="torch")}
    lines = ["", f"Overlap with backward (`dist.overlap`, torch backend, 2 ranks, gloo, "
             f"dist.bucket_mb = {OVERLAP_BUCKET_MB}): compute s includes the last task's "
             "backward, during which the buckets already travel; exchange s is what is left "
             "to wait for after it. On CPU ranks gloo's TCP thread competes with the compute "
             "for the same cores; on a shared machine the figures are indicative only.", "",
             "| dist.overlap | frames/s | step s | compute s | exchange s (incl. wait) | "
             "buckets started in backward |", "|---|---|---|---|---|---|"]
    for name in ("off", "on"):
        m = runs[name]
        early = f"{100 * m['buckets_in_backward']:.0f}%" if name == "on" else "-"
        lines.append(f"| {name} | {m['frames_per_s']:.0f} | {m['step_s']:.3f} | "
                     f"{m['compute_s']:.3f} | {m['comm_s']:.4f} | {early} |")
    return lines


# ---- the paper projection (docs/scaling.md)

NETWORKS = (("10 GbE", 1.25e9, 20e-6), ("100 Gb/s InfiniBand", 12.5e9, 2e-6))


def comm_time(mode: str, n: int, size: float, bw: float, lat: float) -> float:
    """Seconds per step to exchange ``size`` bytes among n ranks (alpha-beta model).

    allreduce: MPI's large-message algorithm (reduce-scatter + allgather, ring or
      Rabenseifner): 2(n-1)/n x size per rank, 2 log2(n) latencies.
    master: our master mode, MPI Reduce to rank 0 + Bcast of the weights, each
      (n-1)/n x size twice (reduce-scatter + gather, scatter + allgather): twice the
      allreduce bytes, 4 log2(n) latencies.
    seed: the seed's gather-update-broadcast through rank 0's one link: (n-1) x size in,
      (n-1) x size out, n latencies.
    """
    lg = np.log2(n)
    if mode == "allreduce":
        return 2 * (n - 1) / n * size / bw + 2 * lg * lat
    if mode == "master":
        return 4 * (n - 1) / n * size / bw + 4 * lg * lat
    return 2 * (n - 1) * size / bw + 2 * n * lat


def projection(compute_s: float, update_s: float, size: float, ranks=(8, 64, 256)) -> list[str]:
    """Weak-scaling efficiency: every rank keeps its batch (compute_s per step), the
    exchange does not overlap compute; efficiency = compute / (compute + exchange +
    update) relative to one rank's compute + update."""
    lines = ["| network | mode | " + " | ".join(f"{n} ranks" for n in ranks) + " |",
             "|---|---|" + "---|" * len(ranks)]
    for net, bw, lat in NETWORKS:
        for mode in ("allreduce", "master", "seed"):
            effs = []
            for n in ranks:
                t = comm_time(mode, n, size, bw, lat)
                effs.append((compute_s + update_s) / (compute_s + update_s + t))
            lines.append(f"| {net} | {mode} | " + " | ".join(f"{100 * e:.0f}%" for e in effs)
                         + " |")
    return lines


# ---- the section

def run(quick: bool = False) -> str:
    if _mpiexec() is None:
        return "## MPI ranks\n\nmpiexec not found: section skipped.\n"
    from data_tools.synth import write_synth
    work = Path(tempfile.mkdtemp(prefix="rnntrain-bench-ranks-"))
    data = work / "train.nc"
    write_synth(str(data), num_seqs=600 if quick else 1200, num_labels=LABELS,
                input_size=INPUTS, seed=1)
    bf = 4000
    cfg = work / "ranks.toml"
    cfg.write_text(CONFIG.format(train=data, epochs=1, batch_frames=bf))
    cmd = f"`python -m bench.ranks{' --quick' if quick else ''}`"
    lines = ["## MPI ranks", "",
             f"Measured with {cmd} (MPICH from pip, one node, shared memory unless said). "
             "Default model (2-layer BLSTM, 128 per direction), default synthetic task "
             f"({'600' if quick else '1200'} sequences), batch_frames = {bf}, 1 thread per "
             "rank; figures are steady-state means over metric windows after the first "
             f"(speed: best of {'1 run' if quick else '2 interleaved runs'} each).", ""]

    # 1. speed: the runs interleaved, best of `rounds` each (the machine is shared)
    rounds = 1 if quick else 2
    best: dict[str, dict] = {}
    for k in range(rounds):
        for name, n, ov in (("one", 1, ()), ("two", 2, ()), ("twom", 2, ("dist.mode=master",))):
            m = _train(n, cfg, work / f"{name}{k}", *ov)
            if name not in best or m["frames_per_s"] > best[name]["frames_per_s"]:
                best[name] = m
    one, two, twom = best["one"], best["two"], best["twom"]
    lines += ["### Speed: 2 ranks x 1 thread vs 1 rank x 1 thread", "",
              "| run | frames/s | speed-up | step s | compute s | exchange s (incl. wait) "
              "| update s | straggler gap s |", "|---|---|---|---|---|---|---|---|"]
    for name, m in (("1 rank", one), ("2 ranks, allreduce", two), ("2 ranks, master", twom)):
        lines.append(f"| {name} | {m['frames_per_s']:.0f} | "
                     f"{m['frames_per_s'] / one['frames_per_s']:.2f}x | {m['step_s']:.3f} | "
                     f"{m['compute_s']:.3f} | {m['comm_s']:.4f} | {m['update_s']:.4f} | "
                     f"{m['straggler_gap_s']:.4f} |")
    lines += ["", f"Goal: >= 1.9x with 2 ranks. Measured "
              f"{two['frames_per_s'] / one['frames_per_s']:.2f}x (allreduce), "
              f"{twom['frames_per_s'] / one['frames_per_s']:.2f}x (master). The exchange "
              "column includes waiting for the slower rank (the straggler gap).", ""]
    lines += ceiling_rows(data, bf, two["frames_per_s"] / one["frames_per_s"], rounds, quick)
    lines += reference_rows(work, rounds, quick)

    # 2. bytes on the wire, exchange time
    steps = 5 if quick else 20
    lines += ["### Bytes on the wire per step", "",
              "The exchange alone (no compute), forced over TCP loopback so that the "
              "kernel's per-socket counters (`ss -tinp`) see every byte each rank sends "
              "and receives; size = the fp32 gradient of the default model. Textbook: ring "
              "allreduce sends 2(N-1)/N x size per rank; the seed's master scheme (gather and "
              "scatter through rank 0) moves (N-1) x size into rank 0 and (N-1) x size of "
              "weights out of it. Our master mode uses MPI_Reduce + MPI_Bcast, which MPICH "
              "runs as reduce-scatter + gather and scatter + allgather: less than the seed's "
              "scheme at rank 0, but about twice the allreduce traffic. The 16-bit wire is "
              "one custom-op element (recursive doubling): log2(N) x size/2 per rank.", "",
              "| ranks | mode | wire | rank 0 sent / received | other ranks sent / received "
              "(max) | textbook per rank | message handed to MPI | time/exchange (TCP) |",
              "|---|---|---|---|---|---|---|---|"]
    size = None
    for n in (2, 4):
        for mode, wire in (("allreduce", "fp32"), ("master", "fp32"), ("allreduce", "bf16")):
            if quick and n == 4 and wire != "fp32":
                continue
            x = _exchange(n, mode, wire, steps, tcp=True)
            size = x["model_bytes"]
            sent, recv = np.array(x["sent"]) / size, np.array(x["recv"]) / size
            if mode == "allreduce":
                book = f"{2 * (n - 1) / n:.2f} sent" + (" (fp32 ring)" if wire != "fp32" else "")
            else:
                book = f"seed's scheme: rank 0 {n - 1} in + {n - 1} out"
            lines.append(f"| {n} | {mode} | {wire} | {sent[0]:.2f} / {recv[0]:.2f} | "
                         f"{sent[1:].max():.2f} / {recv[1:].max():.2f} | {book} | "
                         f"{x['handed'][0] / size:.2f} x size (rank 0) | "
                         f"{x['s'] * 1e3:.1f} ms |")
    shm = _exchange(2, "allreduce", "fp32", steps, tcp=False)
    shm_m = _exchange(2, "master", "fp32", steps, tcp=False)
    lines += ["", f"Model size: {size / 1e6:.2f} MB fp32. Over shared memory (the normal "
              f"one-node path) one exchange takes {shm['s'] * 1e3:.1f} ms (allreduce) and "
              f"{shm_m['s'] * 1e3:.1f} ms (master: reduce + weight broadcast) at 2 ranks, "
              f"vs a {two['step_s'] * 1e3:.0f} ms step: "
              f"{100 * shm['s'] / max(two['step_s'], 1e-9):.1f}% of the step.", ""]

    # 2b. the same under torch.distributed (torchrun, gloo)
    lines += torch_rows(cfg, work, one, two, steps, quick)

    # 3. straggler gap
    lines += ["### Straggler gap: our sharding vs random sharding", "",
              "Gap = per step, max - min compute time over ranks (what the fastest rank "
              "waits at the collective), mean over steps; frame imbalance = (max - min) / "
              "mean padded frames per rank per step, from the plans (exact). N = 4 is "
              "oversubscribed (2 cores): times include scheduling noise.", "",
              "| ranks | sharding | gap s | compute s | gap / compute | frame imbalance |",
              "|---|---|---|---|---|---|"]
    for n in (2, 4):
        for sharding in ("ours", "random"):
            m = _train(n, cfg, work / f"s{n}{sharding}", sharding=sharding)
            imb = _imbalance(data, bf, n, sharding)
            lines.append(f"| {n} | {sharding} | {m['straggler_gap_s']:.4f} | "
                         f"{m['compute_s']:.3f} | "
                         f"{m['straggler_gap_s'] / max(m['compute_s'], 1e-9):.2f} | "
                         f"{imb:.3f} |")
    lines.append("")

    # 4. paper projection from the measured compute per step
    ref = 4 * 3.80e6  # the reference model (3-layer BLSTM 256, 40 in, 30 out): ~3.8M params
    lines += ["### Projection to 8/64/256 ranks (paper, from the measured step)", "",
              f"Weak scaling: each rank keeps {bf} padded frames per step; measured one-rank "
              f"compute {one['compute_s']:.3f} s + update {one['update_s']:.4f} s per step; "
              "exchange not overlapped; alpha-beta model of bench/ranks.py `comm_time` "
              "(see docs/scaling.md). Default model, "
              f"{size / 1e6:.2f} MB gradient:", ""]
    lines += projection(one["compute_s"], one["update_s"], size)
    lines += ["", f"Reference model ({ref / 1e6:.1f} MB gradient) on GPU ranks, assuming (not measured here) 20 ms compute + "
              "update per step:", ""]
    lines += projection(0.02, 0.0, ref)
    lines.append("")
    shutil.rmtree(work, ignore_errors=True)
    return "\n".join(lines)


def ceiling_steps(data: Path, batch_frames: int, world: int, steps: int, epochs: int = 1):
    """(dataset, model, {"1 rank": steps, "N ranks": steps}, their chunks): at most
    ``steps`` global batches of the first ``epochs`` epochs of an N-rank run (one rank
    with ``batch_multiple = N`` plans exactly them), split for one rank's one worker, and
    dealt to N ranks of one worker each (bench/ceiling.py)."""
    from bench import ceiling
    from rnntrain.compute.model import CTCModel
    from rnntrain.compute.tasks import cost_model_for
    from rnntrain.config import ComputeConfig, ModelConfig, TrainConfig
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import make_plan
    ds = Dataset.open(str(data))
    tc, cc, mc = TrainConfig(), ComputeConfig(), ModelConfig()
    model = CTCModel(ds.input_size, ds.num_labels, mc.layers, mc.hidden, mc.bidirectional)
    cost = cost_model_for(model)
    plan = [b for e in range(epochs) for b in make_plan(
        ds, ds.feasible(), batch_frames, tc.seed, e, 0, 1, batch_multiple=world)][:steps]
    batches = [b.seqs for b in plan]
    return ds, model, {"1 rank": ceiling.thread_steps(batches, ds.lengths, 1,
                                                      cc.tasks_per_worker, cost),
                       f"{world} ranks": ceiling.rank_steps(batches, ds.lengths, world,
                                                            cc.tasks_per_worker, cost)}, \
        sorted({b.chunk for b in plan})


def ceiling_rows(data: Path, batch_frames: int, measured: float, rounds: int,
                 quick: bool) -> list[str]:
    """The 2-rank ceiling of the default model's split (bench/ceiling.py) beside the
    measured speed-up, in this process (one thread, the training allocator policy)."""
    from bench import ceiling
    from rnntrain.compute import allocator
    allocator.configure("cache")  # as `rnntrain train` runs (before torch's threads)
    import torch
    allocator.configure("cache")  # once torch is imported: its large-block cache
    from rnntrain.compute.tasks import TaskComputer
    torch.manual_seed(0)
    ds, model, settings, chunks = ceiling_steps(data, batch_frames, 2, 8 if quick else 48,
                                                1 if quick else 3)
    payload = {}
    for k in chunks:
        payload.update(ds.load_chunk(k))
    c = ceiling.measure(TaskComputer(model, torch.device("cpu")), payload, ds.targets,
                        ds.lengths, settings, rounds)
    c1, c2 = c["1 rank"], c["2 ranks"]
    n = len(settings["1 rank"])
    top = c2.fps / c1.fps
    return [f"The ceiling of the split (bench/ceiling.py): {n} global batches of such a "
            f"run (its first epochs), every task timed alone on one thread, once as one "
            f"rank splits each batch ({c1.tasks / n:.2f} tasks per batch) and once as two "
            f"ranks split their shares ({c2.tasks / n:.2f} tasks per batch over both; "
            f"{100 * (c2.busy_s / c1.busy_s - 1):+.1f}% of the work; the slower share "
            f"leaves {100 * c2.balance:.0f}% of both ranks busy): 2 ranks can reach at "
            f"most **{top:.2f}x** one rank with no exchange, no update and no second "
            f"process on the machine; measured {measured:.2f}x = "
            f"{100 * measured / top:.0f}% of it.", ""]


def reference_rows(work: Path, rounds: int, quick: bool) -> list[str]:
    """1 rank vs 2 ranks (allreduce) on the reference model (3x256 BLSTM, 40 inputs, 31
    classes, batch_frames 12000, speech-like lengths), interleaved, best of ``rounds``."""
    from bench import workloads as wl
    n_seqs = 60 if quick else 160
    data = wl.reference_data(work, n_seqs)
    cfg = wl.reference_config(work, data)
    ov = ("train.epochs=2", "compute.threads=1", "compute.intra_threads=1", "log.every_steps=3")
    best: dict[int, dict] = {}
    for k in range(rounds):
        for n in (1, 2):
            m = _train(n, cfg, work / f"ref{n}_{k}", *ov)
            if n not in best or m["frames_per_s"] > best[n]["frames_per_s"]:
                best[n] = m
    one, two = best[1], best[2]
    out = ["Reference model (3x256 BLSTM, 40 inputs, 31 classes; `batch.batch_frames = "
           f"12000`, {n_seqs} sequences of speech-like lengths, two epochs, windows of 3 "
           "steps after the first), the same way:", "",
           "| run | frames/s | speed-up | step s | compute s | exchange s (incl. wait) "
           "| update s | straggler gap s |", "|---|---|---|---|---|---|---|---|"]
    for name, m in (("1 rank", one), ("2 ranks, allreduce", two)):
        out.append(f"| {name} | {m['frames_per_s']:.0f} | "
                   f"{m['frames_per_s'] / one['frames_per_s']:.2f}x | {m['step_s']:.3f} | "
                   f"{m['compute_s']:.3f} | {m['comm_s']:.4f} | {m['update_s']:.4f} | "
                   f"{m['straggler_gap_s']:.4f} |")
    out += ["", f"Goal: >= 1.9x with 2 ranks. Measured "
            f"{two['frames_per_s'] / one['frames_per_s']:.2f}x on the reference model.", ""]
    return out


def _main(argv: list[str]):
    if argv[:1] == ["--exchange-worker"]:
        exchange_worker(argv[1], argv[2], int(argv[3]))
    else:
        print(run(quick="--quick" in argv))


if __name__ == "__main__":
    _main(sys.argv[1:])
