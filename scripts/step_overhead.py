"""Share of the training step's wall time outside the pool's compute, from a trace.

    rnntrain train CONFIG ... --trace t.json --trace-steps 1:51
    python scripts/step_overhead.py t.json [t2.json ...] [--detail]

For every traced step (the main thread's phases, "data wait" to "update"), the time when
no task runs on any worker is the step's serial part: the data wait, the task split and
hand-out, the barrier release, the reduce, the exchange, the clip and the optimizer
update, and the loop's own work between steps. Prints the share of the steps' total time
and its mean per step, and the same split by the main thread's phases. Load on the
machine stretches compute and serial work alike, so the share moves less than frames/s.

``--detail`` adds, per step (medians over the traced steps but the last, in ms), where a
step's wall time goes from one step's start to the next's: ``data`` (the loop waits for
the reader), ``lead`` (the compute phase's start to the first task's start: the task list,
the hand-out and the first worker's wake-up), ``tasks`` (first task start to last task
end), ``tail`` (last task end to the main thread's barrier release: its wake-up),
``after`` (the reduce, exchange and update on the main thread), ``loop`` (the update's end
to the next step's start: the training loop's bookkeeping, weight average, metrics),
``busy`` (task time per worker), ``spread`` (the last worker's last task end minus the
first's: the barrier wait of the faster worker) and ``load`` (the reader thread's chunk
loads, summed per step).
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

PHASES = ("data wait", "compute", "reduce tasks", "allreduce", "update")


def _events(path: str) -> list[dict]:
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    return [e for e in ev if e.get("ph") == "X" and e.get("pid", 0) == 0]


def _steps(spans: list[dict]) -> dict[int, dict]:
    steps: dict[int, dict] = defaultdict(dict)
    for e in spans:
        if "step" in e.get("args", {}) and e["name"] in PHASES:
            steps[e["args"]["step"]][e["name"]] = e
    return steps


def overhead(path: str) -> dict:
    spans = _events(path)
    steps = _steps(spans)
    tasks = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "task")
    order = sorted(steps)
    total = serial = 0.0
    phase = defaultdict(float)
    for i, s in enumerate(order):
        t0 = min(e["ts"] for e in steps[s].values())
        # a step lasts until the next one starts: the loop's work between steps counts
        t1 = min(e["ts"] for e in steps[order[i + 1]].values()) if i + 1 < len(order) else \
            max(e["ts"] + e["dur"] for e in steps[s].values())
        busy, cur = 0.0, t0
        for a, b in tasks:
            a, b = max(a, cur), min(b, t1)
            if b > a:
                busy += b - a
                cur = b
        total += t1 - t0
        serial += (t1 - t0) - busy
        for e in steps[s].values():
            phase[e["name"]] += e["dur"]
    n = max(len(order), 1)
    return {"steps": len(order), "step_ms": total / n / 1e3, "serial_ms": serial / n / 1e3,
            "serial_share": serial / max(total, 1e-9),
            "phases_ms": {k: v / n / 1e3 for k, v in phase.items()}}


DETAIL_KEYS = ("step", "data", "lead", "tasks", "tail", "after", "loop", "busy", "spread",
               "load")


def detail(path: str) -> dict[str, float]:
    """Medians (ms) over the traced steps but the last of the ``--detail`` figures."""
    spans = _events(path)
    steps = _steps(spans)
    order = [s for s in sorted(steps) if len(steps[s]) == len(PHASES)]
    tasks = [e for e in spans if e["name"] == "task"]
    loads = [e for e in spans if e["name"] == "load chunk"]
    rows = defaultdict(list)
    for s, nxt in zip(order, order[1:]):
        ph = steps[s]
        t0, t1 = ph["data wait"]["ts"], ph["compute"]["ts"]
        t2 = t1 + ph["compute"]["dur"]
        t5 = ph["update"]["ts"] + ph["update"]["dur"]
        t_next = steps[nxt]["data wait"]["ts"]
        mine = [e for e in tasks if t1 <= e["ts"] and e["ts"] + e["dur"] <= t2 + 1]
        if not mine:
            continue
        first = min(e["ts"] for e in mine)
        ends: dict[int, float] = defaultdict(float)
        busy: dict[int, float] = defaultdict(float)
        for e in mine:
            ends[e["tid"]] = max(ends[e["tid"]], e["ts"] + e["dur"])
            busy[e["tid"]] += e["dur"]
        last = max(ends.values())
        workers = max(len(ends), 1)
        load = sum(min(e["ts"] + e["dur"], t_next) - max(e["ts"], t0) for e in loads
                   if e["ts"] < t_next and e["ts"] + e["dur"] > t0)
        for k, v in (("step", t_next - t0), ("data", t1 - t0), ("lead", first - t1),
                     ("tasks", last - first), ("tail", t2 - last), ("after", t5 - t2),
                     ("loop", t_next - t5), ("busy", sum(busy.values()) / workers),
                     ("spread", last - min(ends.values())), ("load", load)):
            rows[k].append(v / 1e3)
    return {k: float(np.median(rows[k])) if rows[k] else float("nan") for k in DETAIL_KEYS}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--detail"]
    for p in args:
        r = overhead(p)
        ph = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_ms"].items())
        print(f"{p}: {r['steps']} steps, {r['step_ms']:.1f} ms/step, outside the pool's "
              f"compute {r['serial_ms']:.2f} ms/step = {100 * r['serial_share']:.1f}% "
              f"(main-thread phases, ms/step: {ph})")
        if "--detail" in sys.argv[1:]:
            d = detail(p)
            print("  median ms/step: " + ", ".join(f"{k} {d[k]:.3f}" for k in DETAIL_KEYS))
