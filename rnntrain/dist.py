"""The MPI layer: the only module that imports mpi4py.

``init()`` returns a communicator with one interface whether the job runs under mpiexec
(MPIComm) or alone (LocalComm, the single-process stand-in), so nothing else in the
trainer branches on MPI. Buffers are numpy arrays and travel with mpi4py's uppercase,
buffer-based methods (never pickle) except for small start-up objects.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from .errors import UserError

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_NTASKS",
            "HYDRA_CONTROL_FD", "PMI_RANK")


class LocalComm:
    """One process: every collective is the identity."""
    rank, size, local_rank, local_size = 0, 1, 0, 1
    name = "local"

    def allreduce_(self, buf: np.ndarray) -> np.ndarray:
        """Sum ``buf`` over ranks, in place; returns it."""
        return buf

    def bcast_(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        return buf

    def allgather(self, obj) -> list:
        return [obj]

    def bcast_obj(self, obj, root: int = 0):
        return obj

    def check_same(self, value, what: str):
        """Raise a UserError on every rank when ranks disagree on ``value``."""

    def barrier(self):
        pass

    def abort(self, msg: str, code: int = 1):
        print(msg, file=sys.stderr, flush=True)
        os._exit(code)

    def close(self):
        pass


class MPIComm(LocalComm):
    name = "mpi"

    def __init__(self, mpi):
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()

    def allreduce_(self, buf: np.ndarray) -> np.ndarray:
        assert buf.flags.c_contiguous
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        return buf

    def bcast_(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        assert buf.flags.c_contiguous
        self.comm.Bcast(buf, root=root)
        return buf

    def allgather(self, obj) -> list:
        return self.comm.allgather(obj)

    def bcast_obj(self, obj, root: int = 0):
        return self.comm.bcast(obj, root=root)

    def check_same(self, value, what: str):
        values = self.comm.allgather(value)
        if any(v != values[0] for v in values):
            raise UserError(f"ranks disagree on {what}: " +
                            ", ".join(f"rank {r}: {v}" for r, v in enumerate(values)))

    def barrier(self):
        self.comm.Barrier()

    def abort(self, msg: str, code: int = 1):
        print(f"[rank {self.rank}] {msg}", file=sys.stderr, flush=True)
        self.comm.Abort(code)

    def close(self):
        pass


def launched_by_mpi() -> bool:
    return any(v in os.environ for v in _MPI_ENV)


def init(dcfg=None) -> LocalComm:
    """MPIComm when started by an MPI launcher with more than one rank, else LocalComm."""
    if not launched_by_mpi():
        return LocalComm()
    try:
        from mpi4py import MPI
    except ImportError:
        return LocalComm()
    if MPI.COMM_WORLD.Get_size() == 1:
        return LocalComm()
    return MPIComm(MPI)
