"""The communicator: the one interface every distributed engine implements (``Comm``),
and the single-process engine (``LocalComm``).

Engines: ``LocalComm`` (here: one process, every collective the identity), ``MPIComm``
(``mpi.py``, the only module that imports mpi4py) and ``TorchComm`` (``torchdist.py``, the
only module that imports torch.distributed). ``launch.init`` picks one; everything above
this package sees a ``Comm`` and never branches on the engine, except on what the protocol
itself declares (``can_overlap``).

Three kinds of collective, each called by every rank at the same point of the run:
- per-step, on numpy buffers, in place (``allreduce_``, ``reduce_``, ``bcast_``,
  ``allgather_``), under the deadline ``timeout_s`` (a rank that does not arrive is named
  and the job ends instead of hanging);
- per-step, on torch tensors where they live (``allreduce_t``, ``reduce_t``): a CUDA
  tensor travels over NCCL under torch.distributed, through a host copy under MPI;
- start-up, on small picklable objects (``allgather``, ``bcast_obj``, ``check_same``,
  ``barrier``, ``roster``).
"""
from __future__ import annotations

import os
import sys
from collections import Counter
from typing import TYPE_CHECKING, Callable, NoReturn, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:  # annotations only: the engines' users have torch loaded already
    import torch

# Combining function of a custom reduction: (incoming bytes, in/out bytes) -> None.
Combine = Callable[[np.ndarray, np.ndarray], None]

# Called with the message just before this process aborts the job (rank 0: the run
# folder's status.json says "failed" with the reason instead of "running" forever).
_ON_ABORT: list[Callable[[str], None]] = []


def on_abort(fn: Callable[[str], None] | None):
    """Register ``fn(message)`` to run before an abort (None clears the registration)."""
    _ON_ABORT.clear()
    if fn is not None:
        _ON_ABORT.append(fn)


def run_abort_hooks(msg: str):
    """Every engine's ``abort`` calls this first (never raises)."""
    for fn in list(_ON_ABORT):
        try:
            fn(msg)
        except Exception:  # never let the record keep the job from ending
            pass


class Overlap(Protocol):
    """The gradient exchange in buckets started during backward (``grad_buckets``)."""
    buckets: list[tuple[int, int]]
    launched_during_backward: int

    def arm(self) -> None:
        """Before the backward whose gradients are final."""

    def finish(self, what: str = "gradient exchange") -> None:
        """Wait for every bucket (under the deadline)."""

    def remove(self) -> None:
        """Remove the gradient hooks (idempotent)."""


@runtime_checkable
class Comm(Protocol):
    """What every engine provides (see the module doc). ``what`` names the collective in
    the message of a rank that does not arrive."""
    rank: int
    """this process's rank, 0 ≤ rank < size"""
    size: int
    """ranks in the job"""
    local_rank: int
    """rank among the ranks on this node (picks the GPU)"""
    local_size: int
    """ranks on this node (share the node's cores)"""
    name: str
    """the engine: "local", "mpi" or "torch" (for messages)"""
    timeout_s: float
    """deadline of a per-step collective (``dist.timeout_s``)"""
    calls: Counter
    """collectives issued so far, by method (stays empty alone)"""
    can_overlap: bool
    """``grad_buckets`` works: bucketed allreduces can start during backward"""

    # ---- per-step, numpy buffers, in place
    def allreduce_(self, buf: np.ndarray, combine: Combine | None = None,
                   what: str = "allreduce") -> np.ndarray:
        """Sum ``buf`` over ranks, in place (``combine``: a custom reduction of raw bytes,
        the whole buffer being one element); returns it."""
        ...

    def reduce_(self, buf: np.ndarray, root: int = 0, combine: Combine | None = None,
                what: str = "reduce") -> np.ndarray:
        """Sum ``buf`` into ``root``'s ``buf`` (other ranks' buffers are left as they are)."""
        ...

    def bcast_(self, buf: np.ndarray, root: int = 0, what: str = "broadcast") -> np.ndarray:
        """``root``'s ``buf`` into every rank's ``buf``."""
        ...

    def allgather_(self, buf: np.ndarray, what: str = "allgather") -> np.ndarray:
        """Every rank's ``buf`` (same shape everywhere) stacked: (size, *buf.shape)."""
        ...

    # ---- per-step, torch tensors where they live
    def allreduce_t(self, t: torch.Tensor, what: str = "allreduce") -> torch.Tensor:
        """Sum the contiguous tensor ``t`` over ranks, in place; returns it."""
        ...

    def reduce_t(self, t: torch.Tensor, root: int = 0, what: str = "reduce") -> torch.Tensor:
        """Sum ``t`` into ``root``'s ``t``."""
        ...

    def grad_buckets(self, params: list[torch.nn.Parameter], msg: torch.Tensor,
                     bucket_bytes: int) -> Overlap:
        """The overlapped exchange of ``msg`` (gradients of ``params``, then the message
        tail); only where ``can_overlap``."""
        ...

    # ---- start-up, small picklable objects
    def allgather(self, obj) -> list:
        """Every rank's ``obj``, in rank order."""
        ...

    def bcast_obj(self, obj, root: int = 0):
        """``root``'s ``obj`` on every rank."""
        ...

    def check_same(self, value, what: str) -> None:
        """Raise a UserError on every rank when ranks disagree on ``value``."""
        ...

    def barrier(self) -> None:
        ...

    def roster(self) -> str:
        """Which process is which rank (to match a launcher's "PID n exited" to a rank)."""
        ...

    # ---- the job
    def abort(self, msg: str, code: int = 1) -> NoReturn:
        """Print ``msg`` and end the whole job (``run_abort_hooks`` first)."""
        ...

    def close(self) -> None:
        ...


class LocalComm:
    """One process: every collective is the identity (implements ``Comm``)."""
    rank, size, local_rank, local_size = 0, 1, 0, 1
    name = "local"
    timeout_s = float("inf")
    can_overlap = False   # nothing to exchange

    def __init__(self):
        self.calls: Counter = Counter()  # alone nothing crosses a process boundary

    def allreduce_(self, buf: np.ndarray, combine: Combine | None = None,
                   what: str = "allreduce") -> np.ndarray:
        return buf

    def reduce_(self, buf: np.ndarray, root: int = 0, combine: Combine | None = None,
                what: str = "reduce") -> np.ndarray:
        return buf

    def bcast_(self, buf: np.ndarray, root: int = 0, what: str = "broadcast") -> np.ndarray:
        return buf

    def allgather_(self, buf: np.ndarray, what: str = "allgather") -> np.ndarray:
        return buf[None].copy()

    def allreduce_t(self, t: torch.Tensor, what: str = "allreduce") -> torch.Tensor:
        return t

    def reduce_t(self, t: torch.Tensor, root: int = 0, what: str = "reduce") -> torch.Tensor:
        return t

    def grad_buckets(self, params: list[torch.nn.Parameter], msg: torch.Tensor,
                     bucket_bytes: int) -> Overlap:
        raise AssertionError("one process: nothing to overlap (exchange.overlap_wanted)")

    def allgather(self, obj) -> list:
        return [obj]

    def bcast_obj(self, obj, root: int = 0):
        return obj

    def check_same(self, value, what: str) -> None:
        pass

    def barrier(self) -> None:
        pass

    def roster(self) -> str:
        return ""

    def abort(self, msg: str, code: int = 1) -> NoReturn:
        run_abort_hooks(msg)
        print(msg, file=sys.stderr, flush=True)
        os._exit(code)

    def close(self) -> None:
        pass
