"""The collectives outside the training step, named for what they do.

The step's own traffic is ``exchange.Exchange`` (one message per step, plus the log-step
gather). Everything else that crosses ranks goes through here, so a reader finds every
collective of a run in ``rnntrain/parallel/`` (a test checks that no other module calls
one). Each is a collective: every rank calls it at the same point of the run. Alone
(``comm.LocalComm``) each is the identity.

When they run: at start (``agree_config``: the resolved configs; ``from_root``: the
run-folder check, the resume verdict; ``agree``: steps per epoch; ``rank_roster``; ``wait_for_all``: trace clock alignment), at
validation and test (``sum_over_ranks``: the error counts), after training
(``broadcast_weights``: the best checkpoint before the test set; ``gather_all``: trace
events, once).
"""
from __future__ import annotations

import numpy as np
import torch

from rnntrain.compute.model import flatten_params, unflatten_params
from rnntrain.errors import SharedError
from rnntrain.parallel.comm import Comm


def from_root(comm: Comm, obj, root: int = 0):
    """Rank ``root``'s small picklable ``obj`` on every rank (start-up decisions)."""
    return comm.bcast_obj(obj, root)


def agree(comm: Comm, value, what: str):
    """A UserError on every rank when the ranks hold different ``value``s."""
    comm.check_same(value, what)


def agree_config(comm: Comm, config: dict):
    """A SharedError on every rank naming each config key whose value differs between
    ranks (each rank reads its own config file and command line: a stray override on one
    rank otherwise shows only as a weight checksum that differs). ``config``: sections of
    keys (``config.to_dict``)."""
    if comm.size == 1:
        return
    flat = {f"{s}.{k}": v for s, sec in config.items() for k, v in sec.items()}
    every = comm.allgather(flat)
    keys = sorted(k for k in set().union(*every) if len({repr(d.get(k)) for d in every}) > 1)
    if not keys:
        return

    def values(k):  # "1 on ranks 0, 2; 2 on rank 1"
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(every):
            groups.setdefault(repr(d.get(k, "(unset)")), []).append(r)
        return "; ".join(f"{v} on rank{'s' if len(rs) > 1 else ''} "
                         f"{', '.join(map(str, rs))}" for v, rs in groups.items())
    shown = ", ".join(f"{k} ({values(k)})" for k in keys[:4]) + (
        f" and {len(keys) - 4} more" if len(keys) > 4 else "")
    raise SharedError(f"ranks disagree on the config: {shown}; start every rank with the "
                      "same config file and overrides")


def rank_roster(comm: Comm) -> str:
    """Which process is which rank ("" alone)."""
    return comm.roster()


def wait_for_all(comm: Comm):
    comm.barrier()


def sum_over_ranks(comm: Comm, arr: np.ndarray, what: str) -> np.ndarray:
    """Every rank's ``arr`` summed, in place, on every rank (one buffer allreduce)."""
    return comm.allreduce_(arr, what=what)


def gather_all(comm: Comm, obj) -> list:
    """Every rank's picklable ``obj`` on every rank (end-of-run trace events)."""
    return comm.allgather(obj)


def broadcast_weights(comm: Comm, params: list[torch.nn.Parameter], what: str, root: int = 0):
    """Rank ``root``'s parameter values into ``params`` on every rank (one broadcast)."""
    if comm.size == 1:
        return
    vec = flatten_params(params)
    comm.bcast_(vec, root, what=what)
    unflatten_params(vec, params)
