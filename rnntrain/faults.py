"""Run-time faults: stop signals, NaN/Inf steps, and the test pause hook.

``StopFlag``: SIGINT/SIGTERM ask the loop to stop at the next step boundary; the loop then
writes a checkpoint and exits 0. Under MPI every rank must stop after the same step (else
the others wait forever in the next collective), so ``should_stop`` agrees over ranks.

``BadSteps``: a step whose loss or gradient norm is NaN/Inf is skipped (no optimizer
update) and counted; ``max_bad`` such steps in a row stop the run naming the sequences.

``pause_point``: a test hook. ``RNNTRAIN_TEST_PAUSE=step:N`` blocks the process after the
update of step N; ``RNNTRAIN_TEST_PAUSE=ckpt:N`` blocks inside the write of the checkpoint
of step N (temp file complete, not yet renamed). Either prints ``rnntrain: paused at ...``
on stderr first, so that a test can SIGKILL the process at that exact point. Unset, it
costs one dictionary lookup.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

import numpy as np

from .errors import UserError

PAUSE_ENV = "RNNTRAIN_TEST_PAUSE"


def pause_point(kind: str, step: int):
    want = os.environ.get(PAUSE_ENV)
    if want and want == f"{kind}:{step}":
        print(f"rnntrain: paused at {want} (pid {os.getpid()})", file=sys.stderr, flush=True)
        threading.Event().wait()  # until killed


class StopFlag:
    """SIGINT/SIGTERM ask the loop to stop at the next step boundary (with a checkpoint).

    A second signal while stopping raises KeyboardInterrupt (stop now, no checkpoint).
    """

    def __init__(self):
        self.signal: str | None = None
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)

    def _handle(self, signum, _frame):
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def should_stop(self, comm) -> bool:
        """True on every rank when any rank was signalled (one 4-byte collective)."""
        if comm.size == 1:
            return self.signal is not None
        flag = np.array([1 if self.signal else 0], dtype=np.int32)
        comm.allreduce_(flag)
        if flag[0] and self.signal is None:
            self.signal = "a signal on another rank"
        return bool(flag[0])

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()


def resume_hint(config_path, overrides, run_dir) -> str:
    """The command line that continues a stopped run."""
    keep = [o for o in overrides if not o.lstrip("-").startswith("run.dir=")]
    return " ".join(["rnntrain train", str(config_path or "CONFIG"), *keep,
                     f"run.dir={run_dir}", "--resume"])


class BadSteps:
    """Counts skipped NaN/Inf steps; state lives in the checkpointed ``state`` dict."""

    def __init__(self, state: dict, max_bad: int):
        self.state, self.max_bad = state, max_bad
        state.setdefault("bad_in_row", 0)
        state.setdefault("bad_total", 0)

    def record(self, finite: bool, step_no: int, seq_names: list[str], log) -> bool:
        """Update the counts after the reduce; True when the update may be applied."""
        if finite:
            self.state["bad_in_row"] = 0
            return True
        self.state["bad_in_row"] += 1
        self.state["bad_total"] += 1
        names = ", ".join(seq_names[:8]) + (" ..." if len(seq_names) > 8 else "")
        log.info(f"step {step_no}: loss or gradient is NaN/Inf; update skipped "
                 f"({self.state['bad_total']} skipped so far; sequences: {names})")
        if self.state["bad_in_row"] >= self.max_bad:
            raise UserError(f"{self.state['bad_in_row']} steps in a row with NaN/Inf loss or "
                            f"gradient (train.max_bad_steps = {self.max_bad}); last batch: "
                            f"sequences {names}")
        return False
