"""``python -m bench [NAME ...] [--quick] [--out FILE]``: run benchmark sections.

With no NAME, every section present runs (in SECTIONS order, then any other
``bench/<name>.py`` that defines ``run``) and docs/benchmarks.md is regenerated from
scratch: a header (date, machine, versions, the command), a summary of the sections and
their run times, then each section's markdown. With NAMEs, or with ``--quick``, the
markdown goes to stdout unless ``--out`` is given.

Each section runs in its own fresh process (``run(quick)`` of its module) under a time
budget, so one section's threads, memory and imports cannot disturb the next; a section
that fails or runs out of time is reported in the document, not fatal. The throughput
sections stay within about 27 minutes on the 2-core development machine (the conv +
BLSTM and validation sections included); time to accuracy (first) takes up to 30 more.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rnntrain.fsutil import atomic_write

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent

# (module, title, time budget in seconds on 2 cores); time to accuracy first (the figure a
# user cares about), then the throughput sections within about 27 minutes
SECTIONS = [
    ("accuracy", "Time to accuracy", 1800),
    ("plain_loop", "rnntrain vs a plain PyTorch loop", 420),
    ("flops", "Useful-FLOP rate and memory", 600),
    ("kernels", "LSTM kernel experiments", 300),
    ("threads", "Thread scaling", 600),
    ("validation", "Validation and eval throughput", 150),
    ("ranks", "Rank scaling (MPI, torch.distributed)", 480),
    ("reader", "Reader throughput and data wait", 360),
    ("stragglers", "Stragglers and load balance", 15),
    ("gpu", "GPU", 15),
    ("checkpoint", "Checkpoint", 20),
    ("decode", "Decoding and edit distance", 40),
    ("ocr", "Conv + BLSTM on 2-D data", 150),
    ("infer", "Inference", 60),
    ("augment", "Augmentation cost", 300),
]
TOTAL_BUDGET_S = 89 * 60  # the sum of the budgets above, rounded up
NOT_SECTIONS = {"__init__", "__main__", "workloads"}


def available() -> list[tuple[str, str, float]]:
    """Sections present in bench/: the known ones in order, then any other module."""
    known = {name for name, _, _ in SECTIONS}
    present = [s for s in SECTIONS if (HERE / f"{s[0]}.py").exists()]
    for path in sorted(HERE.glob("*.py")):
        name = path.stem
        if name in known or name in NOT_SECTIONS or name.startswith("_"):
            continue
        if "def run(" in path.read_text():
            present.append((name, name.replace("_", " ").capitalize(), 90))
    return present


_CHILD = ("import sys, importlib\n"
          "m = importlib.import_module('bench.' + sys.argv[1])\n"
          "text = m.run(quick=sys.argv[2] == '1')\n"
          "sys.stdout.write('\\n@@BENCH_SECTION@@\\n' + text)\n")


def run_section(name: str, quick: bool, budget: float) -> tuple[str, float, str]:
    """→ (markdown, seconds, status) where status is "ok", "failed" or "timed out"."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    # its own process group, so a section's own subprocesses (rnntrain train, mpiexec)
    # end with it when it runs out of time instead of disturbing the next section
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, name, "1" if quick else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return _failure(name, f"ran past its time budget of {budget:.0f} s", stderr[-1500:],
                        quick), time.perf_counter() - t0, "timed out"
    r = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    dt = time.perf_counter() - t0
    marker = "\n@@BENCH_SECTION@@\n"
    if r.returncode != 0 or marker not in r.stdout:
        return _failure(name, f"exited with status {r.returncode}", r.stderr[-1500:], quick), \
            dt, "failed"
    return r.stdout.split(marker, 1)[1].strip() + "\n", dt, "ok"


def _failure(name: str, why: str, stderr_tail: str, quick: bool) -> str:
    q = " --quick" if quick else ""
    lines = stderr_tail.strip().splitlines()[-12:]
    return "\n".join([f"## {name}: FAILED", "", f"`python -m bench {name}{q}` {why}; last "
                      "lines of its error output:", "", "```", *lines, "```", ""])


def name_machine(text: str, cpu: str, cores: int) -> str:
    """A section's markdown, with a line under its heading naming the CPU (model and the
    flags that change our figures) unless the section already does: figures differ by
    CPU, so each section's tables say which one they come from."""
    head, sep, rest = text.partition("\n")
    if cpu in text or not head.startswith("#"):
        return text
    return f"{head}\n\nMeasured on {cpu}, {cores} cores.{sep}{rest}"


def machine_header(quick: bool, m: dict) -> str:
    """The document's head; ``m``: ``workloads.machine()``."""
    try:
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return "\n".join([
        "# rnntrain benchmarks", "",
        f"Generated {stamp} by `python -m bench{' --quick' if quick else ''}` "
        "(regenerates this file from scratch; `python -m bench NAME` runs one section). "
        "Every figure below was measured in the run that wrote this file, and the figures "
        "of a row were measured side by side in one process run.", "",
        f"- CPU: {m['cpu']}, {m['cores']} cores (load average at start: {load})",
        f"- torch {m['torch']} ({m['threads']} intra-op threads by default), "
        f"numpy {m['numpy']}, Python {m['python']}",
        *(["- **quick mode**: smaller workloads, figures are a smoke test only"] if quick
          else []),
        ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="sections to run (default: all present)")
    p.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    p.add_argument("--out", help="write the markdown here (default: docs/benchmarks.md for a "
                                 "full run, stdout otherwise)")
    p.add_argument("--budget-scale", type=float, default=1.0,
                   help="multiply every time budget (a slower or busy machine)")
    a = p.parse_args(argv)
    sections = available()
    if a.names:
        by_name = {s[0]: s for s in sections}
        unknown = [n for n in a.names if n not in by_name]
        if unknown:
            print(f"python -m bench: unknown section(s) {', '.join(unknown)}; available: "
                  f"{', '.join(by_name)}", file=sys.stderr)
            return 2
        sections = [by_name[n] for n in a.names]
    out = a.out or (None if a.names or a.quick else str(ROOT / "docs" / "benchmarks.md"))

    t_start = time.perf_counter()
    results = []
    for name, title, budget in sections:
        left = TOTAL_BUDGET_S * a.budget_scale - (time.perf_counter() - t_start)
        budget *= a.budget_scale
        budget = max(10.0, min(budget, left)) if not a.names else budget
        print(f"bench: {name} (budget {budget:.0f} s) ...", file=sys.stderr, flush=True)
        text, dt, status = run_section(name, a.quick, budget)
        print(f"bench: {name} {status} in {dt:.0f} s", file=sys.stderr, flush=True)
        results.append((name, title, text, dt, status))
    total = time.perf_counter() - t_start

    from bench.workloads import machine
    m = machine()
    doc = [machine_header(a.quick, m), "| section | command | status | time |",
           "|---|---|---|---:|"]
    q = " --quick" if a.quick else ""
    for name, title, _, dt, status in results:
        doc.append(f"| {title} | `python -m bench {name}{q}` | {status} | {dt:.0f} s |")
    doc += [f"| **all** | `python -m bench{q}` | | **{total:.0f} s** |", ""]
    doc += [name_machine(text, m["cpu"], m["cores"]) for _, _, text, _, _ in results]
    markdown = "\n".join(doc)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, markdown)
        print(f"bench: wrote {out} in {total:.0f} s", file=sys.stderr)
    else:
        print(markdown)
    return 0 if all(r[4] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
