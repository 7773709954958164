"""The whole trainer's step, two checkouts side by side, in interleaved rounds, with traces.

    python scripts/update_rounds.py OUT.jsonl ROUNDS ROOT_A ROOT_B [--threads 1 2] [--seqs 2000]

ROOT_A and ROOT_B are two checkouts of rnntrain (e.g. ``git worktree add --detach
/tmp/ab-main main`` and this one); each run imports the package of its own root
(``PYTHONPATH``) under this interpreter. A run is ``bench threads``' whole-trainer row:
``rnntrain train configs/default.toml data.train=SYNTH data.val= train.epochs=1
compute.threads=T compute.intra_threads=1 log.every_steps=5`` on ``--seqs`` sequences of
``rnntrain-data synth`` (seed 1), under ``nice -n 5``, traced over steps 1:37
(``--trace``). In each round every thread count runs A then B, or B then A (alternating
by round). Each JSON line: the steady frames/s (the mean of the metric windows after the
first, as ``bench threads`` reports it), the process's user and system CPU seconds, the
one-minute load average before the run, and the trace's figures
(``scripts/step_overhead.py``: time outside the pool's compute per step, and the medians
of ``--detail``). On a shared machine compare within a round only.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from step_overhead import detail, overhead  # noqa: E402


def run_one(root: Path, data: str, threads: int, tmp: Path) -> dict:
    run_dir, tr = tmp / "run", tmp / "t.json"
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = ["nice", "-n", "5", sys.executable, "-m", "rnntrain", "train",
           str(root / "configs" / "default.toml"), f"data.train={data}", "data.val=",
           "train.epochs=1", f"compute.threads={threads}", "compute.intra_threads=1",
           "log.every_steps=5", f"run.dir={run_dir}", "--trace", str(tr),
           "--trace-steps", "1:37"]
    load = os.getloadavg()[0]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise SystemExit(f"{root}: training failed:\n{p.stderr[-2000:]}")
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if r["split"] == "train"][1:]
    fps = sum(r["frames_per_s"] for r in recs) / max(len(recs), 1)
    o, d = overhead(str(tr)), detail(str(tr))
    for f in (tr, *run_dir.rglob("*")):
        if f.is_file():
            f.unlink()
    return {"threads": threads, "fps": round(fps, 1), "wall_s": round(wall, 2),
            "user_s": round(r1.ru_utime - r0.ru_utime, 2),
            "sys_s": round(r1.ru_stime - r0.ru_stime, 2), "load": round(load, 2),
            "step_ms": round(o["step_ms"], 3), "outside_ms": round(o["serial_ms"], 3),
            **{f"{k}_ms": round(v, 3) for k, v in d.items()}}


def main(argv: list[str]):
    out, rounds, roots = argv[0], int(argv[1]), {"A": Path(argv[2]).resolve(),
                                                 "B": Path(argv[3]).resolve()}
    threads = [1, 2]
    seqs = 2000
    if "--threads" in argv:
        i = argv.index("--threads")
        threads = [int(x) for x in argv[i + 1:] if x.isdigit()]
    if "--seqs" in argv:
        seqs = int(argv[argv.index("--seqs") + 1])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = str(tmp / "train.nc")
        subprocess.run([sys.executable, "-m", "data_tools", "synth", data, "--seqs", str(seqs),
                        "--seed", "1"], check=True, cwd=HERE.parent, capture_output=True)
        with open(out, "a") as fh:
            for k in range(rounds):
                for t in threads:
                    for name in ("AB" if k % 2 == 0 else "BA"):
                        (tmp / name).mkdir(exist_ok=True)
                        rec = {"round": k, "variant": name, "root": str(roots[name]),
                               "time": time.strftime("%H:%M:%S", time.gmtime()),
                               **run_one(roots[name], data, t, tmp / name)}
                        print(json.dumps(rec), flush=True)
                        fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
