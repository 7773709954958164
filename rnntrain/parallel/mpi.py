"""The MPI layer: the only module that imports mpi4py.

``init()`` returns a ``comm.Comm`` whether the job runs under an MPI launcher (MPIComm)
or alone (``comm.LocalComm``), so nothing else in the trainer branches on MPI. Buffers
are numpy arrays and travel with mpi4py's uppercase, buffer-based methods (never pickle)
except for small start-up objects (``bcast_obj``); torch tensors go through host memory.

Every per-step collective (``allreduce_``, ``reduce_``, ``bcast_``, ``allgather_``) runs
under a deadline (``dist.timeout_s``): a rank that does not arrive (killed, stuck) is named
and the whole job is aborted instead of hanging forever.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import Counter
from typing import TYPE_CHECKING, Mapping, NoReturn

import numpy as np

from rnntrain.errors import SharedError, UserError
from rnntrain.parallel.comm import Combine, Comm, LocalComm, run_abort_hooks

if TYPE_CHECKING:
    import torch

# Variables that MPI launchers put into each rank's environment. Presence of one means
# "started by a launcher, initialise MPI"; the world size then comes from MPI itself.
_LAUNCHER_ENV = (
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",   # Open MPI (mpirun/prterun)
    "PMI_SIZE", "PMI_RANK",                            # MPICH/Intel MPI Hydra, PMI-1/2
    "PMIX_RANK", "PMIX_NAMESPACE",                     # PMIx (Open MPI 5, srun --mpi=pmix)
    "MV2_COMM_WORLD_SIZE",                             # MVAPICH2
    "PALS_RANKID", "ALPS_APP_PE",                      # HPE/Cray PALS and ALPS
    "MPI_LOCALNRANKS",                                 # MPICH Hydra (local)
)

# Roll-call tags on the control communicator (see MPIComm._wait); _TAG_FAIL carries a
# failing rank's error to rank 0, which records it and ends the job (see ``fail``).
_TAG_ROLL, _TAG_ALIVE, _TAG_FAIL = 71, 72, 73

def launched_by_mpi(environ: Mapping[str, str] = os.environ) -> bool:
    """True when an MPI launcher (mpiexec/mpirun of MPICH, Open MPI, Intel MPI, MVAPICH,
    srun under Slurm, PALS/ALPS) started this process."""
    if any(v in environ for v in _LAUNCHER_ENV):
        return True
    # srun sets SLURM_STEP_ID/SLURM_PROCID for each task; a plain `python` inside an
    # sbatch script has SLURM_NTASKS but no step id, and must not initialise MPI.
    return "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ \
        and int(environ.get("SLURM_STEP_NUM_TASKS", environ.get("SLURM_NTASKS", "1"))) > 1


def launcher_prefix(size: int, environ: Mapping[str, str] = os.environ) -> str:
    """The launcher command line that starts ``size`` ranks like this job ("" alone), for
    the resume hint: Slurm's srun, Open MPI's mpirun, else mpiexec (MPICH, Intel MPI)."""
    if size <= 1:
        return ""
    if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ:
        return f"srun -n {size}"
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return f"mpirun -n {size}"
    return f"mpiexec -n {size}"


_SPIN_S = 0.02  # busy-progress window of a collective before backing off (see _wait)


class MPIComm:
    """The MPI engine (implements ``comm.Comm``): numpy buffers travel with mpi4py's
    buffer methods under a deadline; torch tensors through a host copy."""
    name = "mpi"
    can_overlap = False  # bucketed exchange during backward: torch.distributed only

    def __init__(self, mpi, timeout_s: float = 120.0):
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()
        # roll calls travel on their own communicator so they never match data messages
        self.ctl = self.comm.Dup()
        self.timeout_s = timeout_s
        # collectives issued so far, by method: the documented schedule (docs/scaling.md,
        # "Which collectives run when") is checked against these by tests/test_mpi.py
        self.calls: Counter[str] = Counter()
        self._ops: dict = {}
        self._staging: dict = {}  # pinned host copies of device tensors, by (numel, dtype)
        self._idle = threading.Event()  # never set: a bounded sleep between Tests

    # ---- per-step collectives, all non-blocking + deadline
    def allreduce_(self, buf, combine=None, what="allreduce"):
        assert buf.flags.c_contiguous
        self.calls["allreduce_"] += 1
        if combine is None:
            req = self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        else:
            dtype, op = self._custom(combine, buf.nbytes)
            req = self.comm.Iallreduce(self.MPI.IN_PLACE, [buf, 1, dtype], op=op)
        self._wait(req, what)
        return buf

    def reduce_(self, buf, root=0, combine=None, what="reduce"):
        assert buf.flags.c_contiguous
        self.calls["reduce_"] += 1
        send = self.MPI.IN_PLACE if self.rank == root else buf
        if combine is None:
            recv = buf if self.rank == root else None
            req = self.comm.Ireduce(send, recv, op=self.MPI.SUM, root=root)
        else:
            dtype, op = self._custom(combine, buf.nbytes)
            msg = [buf, 1, dtype]
            req = self.comm.Ireduce(self.MPI.IN_PLACE if self.rank == root else msg,
                                    msg if self.rank == root else None, op=op, root=root)
        self._wait(req, what)
        return buf

    def bcast_(self, buf, root=0, what="broadcast"):
        assert buf.flags.c_contiguous
        self.calls["bcast_"] += 1
        self._wait(self.comm.Ibcast(buf, root=root), what)
        return buf

    def allgather_(self, buf, what="allgather"):
        self.calls["allgather_"] += 1
        buf = np.ascontiguousarray(buf)
        out = np.empty((self.size, *buf.shape), buf.dtype)
        self._wait(self.comm.Iallgather(buf, out), what)
        return out

    # ---- torch tensors: summed through host memory (MPI reads host memory unless it is
    # CUDA-aware); a CPU tensor's own storage is the buffer (no copy)
    def allreduce_t(self, t: torch.Tensor, what: str = "allreduce") -> torch.Tensor:
        host = self._host(t)
        self.allreduce_(host, what=what)
        self._back(t, host)
        return t

    def reduce_t(self, t: torch.Tensor, root: int = 0, what: str = "reduce") -> torch.Tensor:
        host = self._host(t)
        self.reduce_(host, root, what=what)
        self._back(t, host)
        return t

    def _host(self, t: torch.Tensor) -> np.ndarray:
        assert t.is_contiguous()
        if t.device.type == "cpu":
            return t.numpy()
        key = (t.numel(), t.dtype)
        if key not in self._staging:  # pinned: the copies run at full bus speed
            import torch
            self._staging[key] = torch.empty(t.numel(), dtype=t.dtype, pin_memory=True)
        stage = self._staging[key]
        stage.copy_(t.reshape(-1))
        return stage.numpy()

    @staticmethod
    def _back(t: torch.Tensor, host: np.ndarray):
        if t.device.type != "cpu":
            import torch
            t.copy_(torch.from_numpy(host).reshape(t.shape), non_blocking=False)

    def grad_buckets(self, params, msg, bucket_bytes):
        raise AssertionError("MPI has no overlapped exchange (exchange.overlap_wanted)")

    # ---- start-up (blocking, small)
    def allgather(self, obj) -> list:
        self.calls["allgather"] += 1
        return self.comm.allgather(obj)

    def bcast_obj(self, obj, root: int = 0):
        self.calls["bcast_obj"] += 1
        return self.comm.bcast(obj, root=root)

    def check_same(self, value, what: str):
        self.calls["check_same"] += 1
        values = self.comm.allgather(value)
        if any(v != values[0] for v in values):
            raise SharedError(f"ranks disagree on {what}: " +
                            ", ".join(f"rank {r}: {v}" for r, v in enumerate(values)))

    def barrier(self):
        self.calls["barrier"] += 1
        self.comm.Barrier()

    def roster(self) -> str:
        self.calls["roster"] += 1
        ids = self.comm.allgather((os.getpid(), self.MPI.Get_processor_name()))
        return f"{self.size} MPI ranks: " + ", ".join(
            f"rank {r} = pid {pid} on {host}" for r, (pid, host) in enumerate(ids))

    def abort(self, msg: str, code: int = 1) -> NoReturn:
        run_abort_hooks(f"rank {self.rank} of {self.size}: {msg}")
        print(f"[rank {self.rank}/{self.size}] {msg}", file=sys.stderr, flush=True)
        time.sleep(0.2)  # let the launcher forward the message before it kills the job
        self.comm.Abort(code)
        os._exit(code)  # MPICH's Abort can return after notifying the launcher

    def close(self):
        for dtype, op in self._ops.values():
            dtype.Free()
            op.Free()
        self._ops.clear()

    # ---- internals
    def _custom(self, combine: Combine, nbytes: int):
        """A datatype covering the whole message as ONE element, and an MPI op running
        ``combine`` on it: MPI never splits an element, so the combine function always
        sees the complete message (header and payload) and can decode it."""
        key = (combine, nbytes)
        if key not in self._ops:
            dtype = self.MPI.BYTE.Create_contiguous(nbytes).Commit()

            def fn(inbuf, inoutbuf, _dtype):
                combine(np.frombuffer(inbuf, np.uint8, nbytes),
                        np.frombuffer(inoutbuf, np.uint8, nbytes))
            self._ops[key] = (dtype, self.MPI.Op.Create(fn, commute=True))
        return self._ops[key]

    def _wait(self, req, what: str):
        """Complete ``req`` or abort the job naming the ranks that did not arrive.

        MPI has no timed wait, so we Test in a loop. Test also drives MPI progress (a
        large message moves in several rounds, each needing a Test), so for the first
        ``_SPIN_S`` we only yield the core between tries; after that a short, growing
        Event-wait (at most 2 ms: small next to a step, and it leaves the core to the
        other ranks of an oversubscribed node) until the deadline.
        """
        if req.Test():
            return
        start = time.monotonic()
        while time.monotonic() - start < _SPIN_S:
            os.sched_yield()
            if req.Test():
                return
        deadline, delay, asked = start + self.timeout_s, 2e-5, False
        grace = min(5.0, max(1.0, self.timeout_s / 4))
        while not req.Test():
            now = time.monotonic()
            if now - start > 0.05 and self.rank != 0 and self._answer_roll_call():
                asked = True
            if self.rank == 0:
                self._take_over_failure()
            if now > deadline:
                if self.rank == 0:
                    self._roll_call(what, grace)  # aborts the job
                elif now > deadline + grace * (3 if asked else 1) + 0.5 * min(self.rank, 10):
                    # (staggered by rank: the lowest live rank reports alone; two
                    # simultaneous aborts can lose both messages in the launcher)
                    # rank 0 would have called the roll and ended the job by now: it is
                    # the one that did not arrive (or it is stuck itself)
                    self.abort(f"error: rank 0 did not arrive at the {what} within "
                               f"dist.timeout_s = {self.timeout_s:g} s; aborting the job")
            self._idle.wait(delay)
            delay = min(delay * 2, 2e-3)

    def report_failure(self, msg: str, code: int, wait_s: float = 5.0):
        """A rank other than 0 failed: hand the message to rank 0, which records it in
        the run folder and ends the job (``_take_over_failure``); abort ourselves if rank
        0 does not within ``wait_s`` (it may be stuck, or busy outside a collective)."""
        data = np.frombuffer(f"{code}\n{msg}".encode("utf-8", "replace")[:8000], np.uint8)
        req = self.ctl.Isend(data.copy(), dest=0, tag=_TAG_FAIL)
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            req.Test()
            self._idle.wait(0.01)
        self.comm.Abort(code)  # (the message is printed already)
        os._exit(code)

    def _take_over_failure(self):
        """Rank 0: another rank reported a failure; end the job with its message."""
        st = self.MPI.Status()
        if not self.ctl.Iprobe(source=self.MPI.ANY_SOURCE, tag=_TAG_FAIL, status=st):
            return
        buf = np.zeros(st.Get_count(self.MPI.BYTE), np.uint8)
        self.ctl.Recv(buf, source=st.Get_source(), tag=_TAG_FAIL)
        code, _, msg = bytes(buf).decode("utf-8", "replace").partition("\n")
        src = st.Get_source()
        run_abort_hooks(f"rank {src} of {self.size}: {msg}")
        print(f"[rank 0/{self.size}] rank {src} failed; ending the job", file=sys.stderr,
              flush=True)
        time.sleep(0.2)
        self.comm.Abort(int(code) if code.isdigit() else 1)
        os._exit(1)

    def _answer_roll_call(self) -> bool:
        """Non-root ranks: answer rank 0's roll call if one is pending."""
        if not self.ctl.Iprobe(source=0, tag=_TAG_ROLL):
            return False
        token = np.zeros(1, np.int64)
        self.ctl.Recv(token, source=0, tag=_TAG_ROLL)
        self.ctl.Send(np.array([self.rank], np.int64), dest=0, tag=_TAG_ALIVE)
        return True

    def _roll_call(self, what: str, grace: float):
        """Rank 0, past the deadline: ask every rank whether it waits in the same
        collective; those that do not answer within ``grace`` are the missing ones."""
        token = np.zeros(1, np.int64)
        sends = [self.ctl.Isend(token, dest=r, tag=_TAG_ROLL) for r in range(1, self.size)]
        alive, end = {0}, time.monotonic() + grace
        while time.monotonic() < end and len(alive) < self.size:
            if self.ctl.Iprobe(source=self.MPI.ANY_SOURCE, tag=_TAG_ALIVE):
                who = np.zeros(1, np.int64)
                self.ctl.Recv(who, source=self.MPI.ANY_SOURCE, tag=_TAG_ALIVE)
                alive.add(int(who[0]))
            else:
                self._idle.wait(0.01)
        missing = sorted(set(range(self.size)) - alive)
        del sends  # never completed for dead ranks; the job ends below
        self.abort(f"error: rank(s) {', '.join(map(str, missing)) or '(none?)'} of "
                   f"{self.size} did not arrive at the {what} within dist.timeout_s = "
                   f"{self.timeout_s:g} s (killed or stuck); aborting the job")


_COMM: Comm | None = None


def init(dcfg=None) -> Comm:
    """MPIComm when started by an MPI launcher with more than one rank, else LocalComm.

    The communicator is kept for ``fail`` (the CLI's abort-on-error) and reused on a
    second call in the same process (MPI can be initialised only once).
    """
    global _COMM
    timeout = float(getattr(dcfg, "timeout_s", 120.0))
    if _COMM is not None:
        _COMM.timeout_s = timeout if _COMM.size > 1 else _COMM.timeout_s
        return _COMM
    comm = LocalComm()
    if launched_by_mpi():
        try:
            from mpi4py import MPI
        except ImportError:
            raise UserError("started by an MPI launcher but mpi4py is not installed "
                            "(pip install 'rnntrain[mpi]')") from None
        if MPI.COMM_WORLD.Get_size() > 1:
            comm = MPIComm(MPI, timeout)
    _COMM = comm
    return comm


def fail(exc: BaseException):
    """Called by the CLI when training raised: with more than one rank, print the error
    naming this rank and abort the WHOLE job (the other ranks would otherwise wait in the
    next collective forever). Returns normally when alone, so the caller re-raises."""
    fail_job(_COMM, exc)


def fail_job(comm: Comm | None, exc: BaseException):
    """``fail`` for any engine's communicator (``comm.abort`` ends its job)."""
    if comm is None or comm.size == 1 or isinstance(exc, SystemExit):
        return
    if isinstance(exc, SharedError):
        # every rank raised it alike after a collective: no abort (MPICH would add its own
        # "MPI_Abort(...)" line); rank 0 prints it (the CLI), the others leave quietly
        # with the same status
        if comm.rank != 0:
            sys.stdout.flush()
            sys.stderr.flush()
            if isinstance(comm, MPIComm):
                comm.MPI.Finalize()
            os._exit(2)
        return
    if comm.rank != 0:
        # when every rank fails alike (a check that all ranks make), let rank 0 report
        # alone: two simultaneous aborts can lose both messages in the launcher
        time.sleep(1.0)
    if isinstance(exc, UserError):
        msg, code = f"rnntrain train: error: {exc}", 2
    elif isinstance(exc, KeyboardInterrupt):
        msg, code = "rnntrain train: interrupted", 130
    else:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        msg, code = f"rnntrain train: internal error: {type(exc).__name__}: {exc}\n{tb}", 1
    if comm.rank != 0 and isinstance(comm, MPIComm):
        # print here (the launcher shows it), then let rank 0 record it and end the job
        print(f"[rank {comm.rank}/{comm.size}] {msg}", file=sys.stderr, flush=True)
        comm.report_failure(msg.split("\n", 1)[0], code)
    comm.abort(msg, code)
