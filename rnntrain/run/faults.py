"""Run-time faults: stop signals, NaN/Inf steps, and the test pause hook.

``StopFlag``: SIGINT/SIGTERM ask the loop to stop at the next step boundary; the loop then
writes a checkpoint and exits 0. Under MPI every rank must stop after the same step (else
the others wait forever in the next collective): the flag travels in the step's gradient
message (``Exchange.reduce``/``publish``), so the ranks agree without a collective of
their own.

``BadSteps``: a step whose loss or gradient norm is NaN/Inf is skipped (no optimizer
update) and counted; ``max_bad`` such steps in a row stop the run naming the sequences.

``pause_point``: a test hook. ``RNNTRAIN_TEST_PAUSE=step:N`` blocks the process after the
update of step N; ``RNNTRAIN_TEST_PAUSE=ckpt:N`` blocks inside the write of the checkpoint
of step N (temp file complete, not yet renamed); ``RNNTRAIN_TEST_PAUSE=best:N`` blocks
at the end of the epoch that ends with step N, after best.pt is written and before
last.pt is. Each prints ``rnntrain: paused at ...``
on stderr first, so that a test can SIGKILL the process at that exact point. Unset, it
costs one dictionary lookup.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from rnntrain.compute.device import NanGuard
from rnntrain.errors import UserError
from rnntrain.run.state import TrainState

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

    @property
    def requested(self) -> bool:
        """This process was signalled (what it puts into the step's message)."""
        return self.signal is not None

    def agree(self, stop: bool) -> bool:
        """The verdict of the step's message (every rank's ``requested``, summed): True on
        every rank when any rank was signalled; names the cause on the others."""
        if stop and self.signal is None:
            self.signal = "a signal on another rank"
        return stop

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()


def resume_hint(config_path, overrides, run_dir, launcher: str = "") -> str:
    """The command line that continues a stopped run (``launcher``: e.g. "mpiexec -n 4",
    the one this run was started with, see ``mpi.launcher_prefix``)."""
    keep = [o for o in overrides if not o.lstrip("-").startswith("run.dir=")]
    return " ".join([*([launcher] if launcher else []), "rnntrain train",
                     *([str(config_path)] if config_path else []), *keep,
                     f"run.dir={run_dir}", "--resume"])


class BadSteps:
    """Counts skipped NaN/Inf steps; the counts live in the checkpointed ``TrainState``
    (``bad_in_row``, ``bad_total``).

    The per-step flag stays on the device (``device.NanGuard``): ``check`` reads it at host
    intervals (every step on CPU, where a read is free; at log intervals and before
    checkpoints on a GPU) and stops the run after ``max_bad`` skipped steps in a row.
    """

    def __init__(self, state: TrainState, max_bad: int, device):
        self.state, self.max_bad = state, max_bad
        self.guard = NanGuard(device)
        self.guard.run.fill_(state.bad_in_row)  # a run of bad steps survives a resume
        self.guard.worst.fill_(state.bad_in_row)

    def add(self, finite):
        """After the update of a step: ``finite`` (0-dim bool tensor) False = skipped."""
        self.guard.add(finite)

    def check(self, step_no: int, seq_names, log):
        """Bring the counts to the host; raise UserError after ``max_bad`` in a row.
        ``seq_names``: the last batch's sequence names, or a function giving them (called
        only when a step was skipped: no per-sequence work on the good steps)."""
        skipped, worst = self.guard.read()
        self.state.bad_in_row = int(self.guard.run)
        if not skipped:
            return
        self.state.bad_total += skipped
        if callable(seq_names):
            seq_names = seq_names()
        names = ", ".join(seq_names[:8]) + (" ..." if len(seq_names) > 8 else "")
        since = f"{skipped} since the last check, " if skipped > 1 else ""
        log.info(f"step {step_no}: loss or gradient is NaN/Inf; update skipped ({since}"
                 f"{self.state.bad_total} so far; last batch: sequences {names})")
        if worst >= self.max_bad:
            raise UserError(f"{worst} steps in a row with NaN/Inf loss or gradient "
                            f"(train.max_bad_steps = {self.max_bad}); last batch: "
                            f"sequences {names}")
