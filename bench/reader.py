"""Datasets larger than memory: the chunk reader's memory, speed, data wait and padding.

Four measurements, each side by side in one run:

1. Peak RSS of a training epoch (tiny model) on a dataset and on one 10x larger, same
   chunk size, under ``compute.allocator = "cache"`` (the default) and ``"capped"``, in
   interleaved rounds: memory is bounded by two chunks, not by the corpus.
2. The data-wait share of step time inside training with the default model
   (configs/default.toml), from a single .nc file cut in virtual chunks and from a
   sharded manifest (sha256 verified on load).
3. Reader throughput (MB/s of float32 frames delivered) vs reading the whole file with
   netCDF4 in one call.
4. Padding ratio (padded / real frames) of the default batch plan vs random batches.

    python -m bench.reader [--quick]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import workloads as wl
from rnntrain.data import ncdata
from rnntrain.data.dataset import Dataset, virtual_chunks
from rnntrain.data.plan import make_plan, padding_ratio
from rnntrain.data.reader import ChunkReader

ROOT = Path(__file__).resolve().parents[1]


def write_random(path: Path, frames: int, features: int, seed: int, median: int = 300) -> Path:
    """Speech-like lengths (log-normal around ``median``), Gaussian frames, one label per
    ~10 frames (always feasible), written streaming."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < frames:
        lengths.append(int(np.clip(rng.lognormal(np.log(median), 0.5), 20, 10 * median)))
    labels = [f"L{i}" for i in range(20)]
    targets = [" ".join(labels[k] for k in rng.integers(20, size=max(1, n // 10)))
               for n in lengths]
    with ncdata.NcWriter(path, labels, features, lengths, targets,
                         [f"u{i:07d}" for i in range(len(lengths))]) as w:
        for n in lengths:
            w.append(rng.standard_normal((n, features), dtype=np.float32))
    return path


def train_cli(args: list[str]) -> tuple[int, float]:
    """Run ``rnntrain train`` in a fresh process → (peak RSS bytes, wall seconds)."""
    code = (wl.PEAK_RSS_CODE + "import sys\nfrom rnntrain.cli import main\n"
            "rc = main(sys.argv[1:])\nprint('MAXRSS', _peak_rss_kb())\nsys.exit(rc)")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, "train", *args], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                       text=True)
    if r.returncode:
        raise RuntimeError(f"rnntrain train failed:\n{r.stderr[-3000:]}")
    rss = int(r.stdout.split("MAXRSS")[-1].split()[0]) * 1024
    return rss, time.perf_counter() - t0


POLICIES = ("cache", "capped")  # compute.allocator values measured by rss_section


def _allocator_line(run_dir: Path) -> str:
    """The run log's ``allocator:`` line (``capped``: with its large-block cache or why
    not), or "" when the run wrote none."""
    log = run_dir / "train.log"
    lines = [ln for ln in log.read_text().splitlines() if "allocator:" in ln] \
        if log.is_file() else []
    return lines[0].split("allocator:", 1)[1].strip() if lines else ""


def rss_section(work: Path, quick: bool) -> list[str]:
    small_mb = 120 if quick else 200
    # 800 bytes per frame, 40 MB chunks, read into the reader's two reused mappings
    # (rnntrain.data.chunkbuf) under every policy: the heap holds the steps' blocks only,
    # and the loop's trim at each chunk switch (allocator.trim) hands back what they left
    # free; under "capped" the large-block cache is trimmed at the switch too.
    features, chunk_frames = 200, 50_000
    frames = small_mb * 1_000_000 // (4 * features)
    small = write_random(work / "small.nc", frames, features, 1)
    large = write_random(work / "large.nc", 10 * frames, features, 2)
    common = ["configs/default.toml", "data.val=", "model.layers=1", "model.hidden=16",
              "model.bidirectional=false", "train.epochs=1", "batch.batch_frames=20000",
              f"data.chunk_frames={chunk_frames}", "log.every_steps=1000"]
    try:                       # capped's library compiled now, not inside a timed run
        from rnntrain.compute import cpucache
        cpucache.build()
    except Exception:          # noqa: BLE001 (the run log's allocator line says why)
        pass
    # rounds: one run is one draw of the heap's layout (docs/threads.md, "Peak RSS and
    # the number of chunks"); the goal is per round, so every round's growth is reported
    rounds = 2 if quick else 3
    res, note = {}, {}
    for r in range(rounds):
        for pol in POLICIES:
            for name, path in (("small", small), ("large", large)):
                run_dir = work / f"rss-{pol}-{name}-{r}"
                res.setdefault((pol, name), []).append(train_cli(
                    common + [f"compute.allocator={pol}", f"data.train={path}",
                              f"run.dir={run_dir}"]))
                note[pol] = note.get(pol) or _allocator_line(run_dir)
    size = {k: os.path.getsize(p) for k, p in (("small", small), ("large", large))}
    growth = {pol: [lg[0] / sm[0] - 1 for sm, lg in zip(res[pol, "small"], res[pol, "large"])]
              for pol in POLICIES}

    def mb(runs) -> str:
        rss = sorted(r[0] / 1e6 for r in runs)
        return f"{float(np.median(rss)):,.0f} MB ({rss[0]:,.0f}-{rss[-1]:,.0f})"

    def pct(g: list[float]) -> str:
        over = sum(x > 0.10 for x in g)
        return (f"{100 * float(np.median(g)):+.1f}% in the median, "
                + ", ".join(f"{100 * x:+.1f}%" for x in g)
                + f" by round (goal ≤ +10%: over it in {over} of {len(g)})")
    cmd = " ".join(common[1:])
    return [
        "### Peak RSS of a training epoch: 10x the data, same chunk size", "",
        f"Tiny model ({cmd} compute.allocator=POLICY), one epoch over random speech-like data "
        f"({features} features, float32), chunks of {chunk_frames:,} frames "
        f"({chunk_frames * features * 4 / 1e6:.0f} MB); peak RSS of the whole training "
        "process image (`VmHWM`, see `bench.workloads.PEAK_RSS_CODE`). "
        f"{rounds} rounds, each running every policy's two datasets one after the other; "
        "median (range) over the rounds, and the large set's growth over the small one's "
        "in each round.", "",
        "| compute.allocator | dataset | inputs on disk | peak RSS | epoch wall time |",
        "|---|---|---:|---:|---:|",
        *[f"| {pol} | {k} | {size[k] / 1e6:,.0f} MB | {mb(res[pol, k])} | "
          f"{float(np.median([r[1] for r in res[pol, k]])):.0f} s |"
          for pol in POLICIES for k in ("small", "large")], "",
        *[f"- `{pol}`, 10x the data: peak RSS {pct(growth[pol])}"
          + (f"; run log: \"allocator: {note[pol]}\"" if note[pol] else "")
          for pol in POLICIES], "",
        f"RNNLIB would hold the large set in memory as double: {2 * size['large'] / 1e6:,.0f} MB.",
        ""]


def wait_section(work: Path, quick: bool) -> list[str]:
    from data_tools.shard import shard
    from data_tools.synth import write_synth
    seqs = 500 if quick else 2000
    train = work / "synth_train.nc"
    write_synth(str(train), num_seqs=seqs, num_labels=20, input_size=20, seed=1)
    man = shard([str(train)], 1, str(work / "synth_sharded"), chunk_frames=10_000)
    rows = []
    for name, data, extra in (("single .nc, virtual chunks of 10,000 frames", train,
                               ["data.chunk_frames=10000"]),
                              ("manifest, chunks of 10,000 frames (sha256 checked)", man, [])):
        run_dir = work / f"wait-{len(rows)}"
        args = ["configs/default.toml", f"data.train={data}", "data.val=", "train.epochs=1",
                "log.every_steps=1", f"run.dir={run_dir}", *extra]
        train_cli(args)
        recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        recs = [r for r in recs if r["split"] == "train"]
        parts = ("data_wait_s", "compute_s", "reduce_s", "comm_s", "update_s")
        wait = sum(r["data_wait_s"] for r in recs)
        total = sum(r[p] for r in recs for p in parts)
        first = recs[0]["data_wait_s"]
        rows.append((name, len(recs), wait, total, first))
    out = ["### Data wait inside training (default model)", "",
           f"`configs/default.toml` (2x128 BLSTM), one epoch of the default synthetic task "
           f"({seqs} sequences); share of step time (wait + compute + reduce + comm + update, "
           "from metrics.jsonl) spent waiting for the reader. The first step's wait is the "
           "first chunk's load, which nothing can overlap.", "",
           "| data | steps | data wait | of step time | after the first step |",
           "|---|---:|---:|---:|---:|"]
    for name, n, wait, total, first in rows:
        out.append(f"| {name} | {n} | {wait:.3f} s | {100 * wait / total:.2f}% | "
                   f"{100 * (wait - first) / total:.2f}% |")
    return out + [""]


def throughput_section(work: Path, quick: bool) -> list[str]:
    from data_tools.shard import shard
    mb = 40 if quick else 200
    features = 40
    path = write_random(work / "speed.nc", mb * 1_000_000 // (4 * features), features, 3)
    man = shard([str(path)], 1, str(work / "speed_sharded"), chunk_frames=100_000)
    h = ncdata.read_header(path)
    nbytes = h.total_frames * features * 4

    def whole():
        return ncdata.read_rows(path, 0, h.total_frames)

    def reader(ds):
        def go():
            with ChunkReader(ds.load_chunk, list(range(len(ds.chunks)))) as r:
                for _ in ds.chunks:
                    r.next()
        return go

    ways = [("netCDF4, whole file in one call (`inputs[:]`)", whole),
            ("chunk reader, single .nc, virtual chunks of 100,000 frames",
             reader(Dataset.open(str(path), 100_000))),
            ("chunk reader, manifest, chunks of 100,000 frames + sha256",
             reader(Dataset.open(str(man))))]
    best = {name: float("inf") for name, _ in ways}
    whole()                                            # warm the page cache for all
    for _ in range(3):                                 # interleaved rounds, best of 3
        for name, fn in ways:
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    base = nbytes / best[ways[0][0]] / 1e6
    out = ["### Reader throughput", "",
           f"{nbytes / 1e6:.0f} MB of float32 frames ({features} features), file in the page "
           "cache; best of 3 interleaved rounds. The reader also splits the frames into "
           "sequences and checks them for NaN/Inf.", "",
           "| read | MB/s | vs whole file |", "|---|---:|---:|"]
    for name, _ in ways:
        v = nbytes / best[name] / 1e6
        out.append(f"| {name} | {v:,.0f} | {v / base:.2f}x |")
    return out + [""]


def random_batches(ids: np.ndarray, sizes: list[int], rng) -> list[np.ndarray]:
    perm = rng.permutation(ids)
    cuts = np.cumsum([0] + sizes)
    return [perm[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def padding_section(quick: bool) -> list[str]:
    from bench.stragglers import speech_lengths
    from data_tools.synth import make_sequences
    rng = np.random.default_rng(0)
    synth = np.array([len(x) for x, _ in make_sequences(2000, 20, 20, 1)])   # the default task
    speech = speech_lengths(20_000 if quick else 100_000)
    out = ["### Padding ratio of the batch plan", "",
           "Padded frames (n × longest per batch) / real frames over an epoch; random "
           "batches have the same sizes as the plan's, filled with random sequences.", "",
           "| lengths | budget (padded frames per batch) | default plan | random batches |",
           "|---|---:|---:|---:|"]
    for name, lengths, budget in (("default synthetic task (configs/default.toml)", synth, 3000),
                                  ("speech-like (log-normal, median 300)", speech, 8000)):
        n = len(lengths)
        chunks = virtual_chunks("sim", lengths, 2_000_000)   # data.chunk_frames' default
        ds = Dataset("sim", ["a"], 1, lengths, [np.zeros(1, np.int32)] * n, [""] * n, chunks,
                     [list(range(len(chunks)))])
        plan = make_plan(ds, np.ones(n, bool), budget, 1, 0)
        sizes = [len(s.seqs) for s in plan]
        rand = random_batches(np.arange(n), sizes, rng)
        pr = sum(len(b) * lengths[b].max() for b in rand) / lengths.sum()
        out.append(f"| {name}, {n:,} sequences | {budget:,} | "
                   f"{padding_ratio(plan, lengths):.3f} | {pr:.2f} |")
    return out + [""]


def run(quick: bool = False) -> str:
    work = Path(tempfile.mkdtemp(prefix="rnntrain-bench-reader-"))
    try:
        parts = ["## Datasets larger than memory: the chunk reader", ""]
        parts += padding_section(quick)
        parts += throughput_section(work, quick)
        parts += wait_section(work, quick)
        parts += rss_section(work, quick)
        parts += [f"Reproduce: `python -m bench.reader{' --quick' if quick else ''}`", ""]
        return "\n".join(parts)
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
