"""Which distributed engine this process joins: MPI, torch.distributed, or none.

``dist.backend = "auto"`` recognises the launcher from the environment it leaves in each
process: torchrun (torchelastic) sets WORLD_SIZE/RANK/LOCAL_RANK and TORCHELASTIC_RUN_ID;
MPI launchers (mpiexec of MPICH/Open MPI/Intel MPI/MVAPICH, srun) set theirs (see
``mpi.launched_by_mpi``). torchrun wins when both are present: under ``srun ... torchrun``
Slurm's variables describe the outer launch (one torchrun per node), not the workers.

The rule that matters: an environment that says "N processes" never runs as N
independent single-rank trainings (N copies writing one run folder). If the named or
detected engine cannot join the N processes, that is one clean error before any work.
"""
from __future__ import annotations

import os
import time
from typing import Mapping

from rnntrain.errors import UserError
from rnntrain.parallel import mpi
from rnntrain.parallel.comm import Comm, LocalComm, on_abort  # noqa: F401  (on_abort: train)

_TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
# the per-process size variables of MPI launchers: (variable, launcher)
_MPI_SIZE_VARS = (("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("PMI_SIZE", "MPICH/Intel MPI (PMI)"),
                  ("MV2_COMM_WORLD_SIZE", "MVAPICH2"), ("SLURM_STEP_NUM_TASKS", "Slurm srun"))


def launched_by_torchrun(environ: Mapping[str, str] = os.environ) -> bool:
    """True when torchrun/torchelastic (or a script imitating it: WORLD_SIZE + RANK)
    started this process."""
    return "TORCHELASTIC_RUN_ID" in environ or ("WORLD_SIZE" in environ and "RANK" in environ)


def _int(environ, var) -> int:
    try:
        return int(environ[var])
    except ValueError:
        raise UserError(f"environment variable {var}={environ[var]!r} is not a number") from None


def world_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """(launcher, processes) as the environment states them; ("", 1) when none does."""
    if launched_by_torchrun(environ):
        return "torchrun", _int(environ, "WORLD_SIZE") if "WORLD_SIZE" in environ else 1
    if mpi.launched_by_mpi(environ):
        for var, who in _MPI_SIZE_VARS:
            if var in environ:
                return f"{who} ({var}={environ[var]})", _int(environ, var)
        return "an MPI launcher", 0  # size known only to MPI itself (PMIx, PALS)
    return "", 1


def choose(backend: str, environ: Mapping[str, str] = os.environ) -> str:
    """→ "torch", "mpi" or "local" for ``dist.backend`` in this environment; raises a
    UserError when the environment says N processes and ``backend`` cannot join them."""
    assert backend in ("auto", "mpi", "torch"), backend
    launcher, n = world_from_env(environ)
    if launcher == "torchrun":
        if n <= 1:
            return "local"
        if backend == "mpi":
            raise UserError(f"dist.backend = \"mpi\" but torchrun started this process as one "
                            f"of {n} (WORLD_SIZE={n}); MPI cannot join a torchrun job: set "
                            "dist.backend = \"torch\" (or \"auto\"), or start with mpiexec/srun")
        missing = [v for v in _TORCHRUN_VARS if v not in environ]
        if missing:
            raise UserError(f"WORLD_SIZE={n} says this is one of {n} processes, but "
                            f"{', '.join(missing)} is not set: start with torchrun (python -m "
                            "torch.distributed.run), which sets them")
        from rnntrain.parallel import torchdist
        if not torchdist.available():
            raise UserError(f"torchrun started {n} processes but this torch build has no "
                            "torch.distributed with gloo; use an MPI launcher with "
                            "dist.backend = \"mpi\"")
        return "torch"
    if launcher:
        if backend == "torch" and n != 1:
            raise UserError(f"dist.backend = \"torch\" but {launcher} started this process; "
                            "start it with torchrun, or set dist.backend = \"mpi\" (or "
                            "\"auto\")")
        return "mpi" if n != 1 else "local"
    return "local"


_COMM: Comm | None = None
_ENV_ERROR = False  # init failed on the environment alone: every process fails alike


def init(dcfg=None, device: str = "auto") -> Comm:
    """The communicator of this job (kept for ``fail``; a second call returns it)."""
    global _COMM, _ENV_ERROR
    timeout = float(getattr(dcfg, "timeout_s", 120.0))
    if _COMM is not None:
        if _COMM.size > 1:
            _COMM.timeout_s = timeout
        return _COMM
    try:
        kind = choose(getattr(dcfg, "backend", "auto"))
    except UserError:
        _ENV_ERROR = True  # found alike by every process of the launch (see fail)
        raise
    if kind == "torch":
        from rnntrain.parallel.torchdist import TorchComm
        comm = TorchComm(timeout, cuda=device != "cpu")
    elif kind == "mpi":
        comm = mpi.init(dcfg)
        launcher, n = world_from_env()
        if comm.size == 1 and n > 1:
            _ENV_ERROR = True
            raise UserError(f"{launcher} started this process as one of {n}, but MPI (mpi4py) "
                            "sees a single process: mpi4py is built against another MPI than "
                            "the launcher's (use that MPI's mpiexec, or srun --mpi=pmix/pmi2)")
    else:
        comm = LocalComm()
    _COMM = comm
    return comm


def launcher_prefix(size: int, environ: Mapping[str, str] = os.environ) -> str:
    """The command prefix that starts ``size`` processes like this job ("" alone), for the
    resume hint: torchrun under torch.distributed, else the MPI launcher (mpi.launcher_prefix)."""
    if size > 1 and _COMM is not None and _COMM.name == "torch":
        return f"torchrun --nproc-per-node {size}"
    return mpi.launcher_prefix(size, environ)


def fail(exc: BaseException):
    """The CLI's abort-on-error for whichever engine runs (see ``mpi.fail_job``).

    When the launch itself cannot work (every process finds the same problem in the same
    environment, before any engine runs), only the process the launcher calls rank 0
    reports it; the others exit with the same status quietly: one line, not N. The same
    holds for a user's mistake found before the engine runs (a bad config or override):
    every process of the launch runs the same command line."""
    if _COMM is None and (_ENV_ERROR or isinstance(exc, UserError)) and \
            _launcher_rank() > 0:
        # leave after rank 0 has printed: the launcher stops the job when any process exits
        time.sleep(3.0)
        os._exit(2)
    mpi.fail_job(_COMM, exc)


def _launcher_rank(environ: Mapping[str, str] = os.environ) -> int:
    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return 0
