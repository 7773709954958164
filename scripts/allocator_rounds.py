"""Peak RSS and cost of glibc malloc settings on the reference model, in interleaved rounds.

    python scripts/allocator_rounds.py [--seqs N] [--epochs E] OUT.jsonl THREADS ROUNDS VARIANT...

VARIANT is ``system``, ``cache`` or ``capped`` (``compute.allocator`` as rnntrain applies
it) or a raw setting tried beside them: comma-separated ``thr=MiB`` (``M_MMAP_THRESHOLD``;
without it no block is mapped, as under ``cache``), ``trim=MiB`` (``M_TRIM_THRESHOLD``;
default: never), ``arena=N`` (``M_ARENA_MAX``, ``d`` = glibc's default; default 1), and a
``+huge`` suffix for ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``. ``thr=32`` is ``capped``
before the heap's top was trimmed. Each run is ``rnntrain train`` of the reference model
(bench.workloads: 3 x BLSTM-256, 120 sequences of ``reference_data``, batch_frames 12000)
for 2 epochs (``--seqs 240 --epochs 3``: ``bench flops``'s own workload),
``compute.threads=THREADS``, one intra-op thread, under ``nice -n 5``; the variants run one
after the other in each round (A B C A B C ...). Each JSON line: the last epoch's frames/s
(``fps``) and the mean over all epochs but the first (``timed_fps``, as ``bench flops``
reports it), peak RSS
(``VmHWM``, bench.workloads.PEAK_RSS_CODE), minor faults, user and system CPU seconds of
the training process, and under ``capped`` the large-block cache's books (``cpucache.stats()``:
hits, fits, remaps, misses and the bytes each path's users faulted in, the page moves and the
bytes moved, the fills and the bytes filled; ``capped:fill=0`` is ``capped`` without fills,
``capped:move=0`` without page moves (nor fills), as where userfaultfd is
missing). ``VARIANT@DIR`` runs it with the rnntrain of another checkout in DIR (e.g. the
code before a change, unpacked with ``git archive``), so that both run in the same rounds.
On a shared machine compare within a round only; the CPU seconds
(user + system) are the load-robust cost: user time hardly changes with the policy, the
system time is the kernel zeroing pages faulted in again. docs/benchmarks.md, "Peak RSS by
allocator policy", has the figures.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import workloads as wl  # noqa: E402

RUNNER = wl.PEAK_RSS_CODE + r'''
import ctypes, json, os, sys, resource
spec = dict(kv.split("=") for kv in sys.argv[1].split(",") if kv)
from rnntrain.compute import allocator
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -3, -4, -8
if spec.get("base") in ("cache", "capped"):
    from rnntrain.compute import cpucache
    cpucache.THRESHOLD = int(float(spec.get("cthr", cpucache.THRESHOLD / 2**20)) * 2**20)
    cpucache.SLACK = int(float(spec.get("slack", cpucache.SLACK / 2**20)) * 2**20)
    cpucache.FIT_DIV = int(spec.get("fit", cpucache.FIT_DIV))
    cpucache.AHEAD = int(spec.get("ahead", cpucache.AHEAD))
    cpucache.MOVE = spec.get("move", "1") != "0"
    if hasattr(cpucache, "FILL"):
        cpucache.FILL = spec.get("fill", "1") != "0"
    assert allocator.configure(spec["base"])
    if spec.get("heap") == "keep":  # under capped: glibc's part as under cache
        libc = ctypes.CDLL("libc.so.6")
        assert libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    import torch  # noqa: F401  (as `rnntrain train`: the policy, torch, then the cache)
    assert allocator.configure(spec["base"]) and (allocator.note() or "").find("without") < 0
elif spec:
    libc = ctypes.CDLL("libc.so.6")
    ps = ([(M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, int(float(spec["thr"]) * 2**20))]
          if "thr" in spec else [(M_MMAP_MAX, 0)])
    if spec.get("arena", "1") != "d":
        ps.append((M_ARENA_MAX, int(spec.get("arena", "1"))))
    trim = spec.get("trim", "never")
    ps.append((M_TRIM_THRESHOLD, 2**31 - 1 if trim == "never" else int(float(trim) * 2**20)))
    for p, v in ps:
        assert libc.mallopt(p, v) == 1, (p, v)
    allocator._applied = "capped"  # the chunk-switch trim, as under the policies
from rnntrain.cli import main
rc = main(sys.argv[2:])
ru = resource.getrusage(resource.RUSAGE_SELF)
print("BENCH_MAXRSS_KB", _peak_rss_kb(), ru.ru_minflt, ru.ru_stime, ru.ru_utime, file=sys.stderr)
from rnntrain.compute import cpucache
print("BENCH_CPUCACHE", json.dumps(cpucache.stats() if cpucache.active() else {}), file=sys.stderr)
sys.exit(rc)
'''


def run(cfg: Path, variant: str, threads: int, run_dir: Path, epochs: int = 2) -> dict:
    variant, _, tree = variant.partition("@")  # VARIANT@DIR: rnntrain from another checkout
    root = Path(tree) if tree else ROOT
    name = variant.removesuffix("+huge")
    spec = {"system": "", "cache": "base=cache", "capped": "base=capped"}.get(name, name)
    if name.startswith("capped:"):  # the cache's own settings: capped:cthr=MiB,slack=MiB,fit=N,ahead=%,heap=keep,move=0
        spec = "base=capped," + name.split(":", 1)[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    if variant.endswith("+huge"):
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    args = ["train", str(cfg), f"train.epochs={epochs}", f"compute.threads={threads}",
            "compute.intra_threads=1", "compute.allocator=system", f"run.dir={run_dir}",
            "log.every_steps=1000000"]
    r = subprocess.run(["nice", "-n", "5", sys.executable, "-c", RUNNER, spec, *args],
                       capture_output=True, text=True, timeout=1800, env=env, cwd=root)
    if r.returncode:
        raise RuntimeError(f"{variant}: {r.stderr[-1500:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in recs if x["split"] == "train"]
    ln = [x for x in r.stderr.splitlines() if x.startswith("BENCH_MAXRSS_KB")][0].split()
    cache = [x for x in r.stderr.splitlines() if x.startswith("BENCH_CPUCACHE")][0]
    timed = [x["frames_per_s"] for x in train[1:]] or [train[-1]["frames_per_s"]]
    return {"fps": train[-1]["frames_per_s"], "timed_fps": sum(timed) / len(timed),
            "rss_mb": int(ln[1]) / 1024, "minflt": int(ln[2]), "stime": float(ln[3]), "utime": float(ln[4]),
            "cpucache": json.loads(cache.split(" ", 1)[1])}


def main() -> None:
    argv, opts = sys.argv[1:], {"--seqs": 120, "--epochs": 2}
    while argv and argv[0] in opts:
        opts[argv[0]], argv = int(argv[1]), argv[2:]
    out, threads, rounds, variants = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3:]
    folder = Path(tempfile.mkdtemp(prefix="rnntrain-alloc-"))
    cfg = wl.reference_config(folder, wl.reference_data(folder, opts["--seqs"]))
    for rnd in range(rounds):
        for v in variants:
            run_dir = folder / f"run_{rnd}_{len(os.listdir(folder))}"
            res = run(cfg, v, threads, run_dir, opts["--epochs"])
            shutil.rmtree(run_dir, ignore_errors=True)
            res.update(variant=v, threads=threads, round=rnd,
                       utc=time.strftime("%H:%M:%S", time.gmtime()),
                       load=float(open("/proc/loadavg").read().split()[0]))
            with open(out, "a") as f:
                f.write(json.dumps(res) + "\n")
            print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
