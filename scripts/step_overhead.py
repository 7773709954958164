"""Share of the training step's wall time outside the pool's compute, from a trace.

    rnntrain train CONFIG ... --trace t.json --trace-steps 1:51
    python scripts/step_overhead.py t.json

For every traced step (the main thread's phases, "data wait" to "update"), the time when
no task runs on any worker is the step's serial part: the data wait, the task split and
hand-out, the barrier release, the reduce, the exchange, the clip and the optimizer
update, and the loop's own work between steps. Prints the share of the steps' total time
and its mean per step, and the same split by the main thread's phases. Load on the
machine stretches compute and serial work alike, so the share moves less than frames/s.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def overhead(path: str) -> dict:
    ev = json.load(open(path))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    spans = [e for e in ev if e.get("ph") == "X" and e.get("pid", 0) == 0]
    steps: dict[int, list] = defaultdict(list)
    for e in spans:
        if "step" in e.get("args", {}) and e["name"] in ("data wait", "compute",
                                                           "reduce tasks", "allreduce",
                                                           "update"):
            steps[e["args"]["step"]].append(e)
    tasks = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "task")
    order = sorted(steps)
    total = serial = 0.0
    phase = defaultdict(float)
    for i, s in enumerate(order):
        t0 = min(e["ts"] for e in steps[s])
        # a step lasts until the next one starts: the loop's work between steps counts
        t1 = min(e["ts"] for e in steps[order[i + 1]]) if i + 1 < len(order) else \
            max(e["ts"] + e["dur"] for e in steps[s])
        busy, cur = 0.0, t0
        for a, b in tasks:
            a, b = max(a, cur), min(b, t1)
            if b > a:
                busy += b - a
                cur = b
        total += t1 - t0
        serial += (t1 - t0) - busy
        for e in steps[s]:
            phase[e["name"]] += e["dur"]
    n = max(len(order), 1)
    return {"steps": len(order), "step_ms": total / n / 1e3, "serial_ms": serial / n / 1e3,
            "serial_share": serial / max(total, 1e-9),
            "phases_ms": {k: v / n / 1e3 for k, v in phase.items()}}


if __name__ == "__main__":
    for p in sys.argv[1:]:
        r = overhead(p)
        ph = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_ms"].items())
        print(f"{p}: {r['steps']} steps, {r['step_ms']:.1f} ms/step, outside the pool's "
              f"compute {r['serial_ms']:.2f} ms/step = {100 * r['serial_share']:.1f}% "
              f"(main-thread phases, ms/step: {ph})")
