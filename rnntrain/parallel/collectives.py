"""The collectives outside the training step, named for what they do.

The step's own traffic is ``exchange.Exchange`` (one message per step, plus the log-step
gather). Everything else that crosses ranks goes through here, so a reader finds every
collective of a run in ``rnntrain/parallel/`` (a test checks that no other module calls
one). Each is a collective: every rank calls it at the same point of the run. Alone
(``LocalComm``) each is the identity.

When they run: at start (``from_root``: the run-folder check, the resume verdict;
``agree``: steps per epoch; ``rank_roster``; ``wait_for_all``: trace clock alignment), at
validation and test (``sum_over_ranks``: the error counts), after training
(``broadcast_weights``: the best checkpoint before the test set; ``gather_all``: trace
events, once).
"""
from __future__ import annotations

import numpy as np
import torch

from rnntrain.compute.model import flatten_params, unflatten_params


def from_root(comm, obj, root: int = 0):
    """Rank ``root``'s small picklable ``obj`` on every rank (start-up decisions)."""
    return comm.bcast_obj(obj, root)


def agree(comm, value, what: str):
    """A UserError on every rank when the ranks hold different ``value``s."""
    comm.check_same(value, what)


def rank_roster(comm) -> str:
    """Which process is which rank ("" alone)."""
    return comm.roster()


def wait_for_all(comm):
    comm.barrier()


def sum_over_ranks(comm, arr: np.ndarray, what: str) -> np.ndarray:
    """Every rank's ``arr`` summed, in place, on every rank (one buffer allreduce)."""
    return comm.allreduce_(arr, what=what)


def gather_all(comm, obj) -> list:
    """Every rank's picklable ``obj`` on every rank (end-of-run trace events)."""
    return comm.allgather(obj)


def broadcast_weights(comm, params: list[torch.nn.Parameter], what: str, root: int = 0):
    """Rank ``root``'s parameter values into ``params`` on every rank (one broadcast)."""
    if comm.size == 1:
        return
    vec = flatten_params(params)
    comm.bcast_(vec, root, what=what)
    unflatten_params(vec, params)
