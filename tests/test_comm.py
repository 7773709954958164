"""The communicator interface: every engine implements ``Comm`` (tensor collectives
included), nothing probes an engine for optional methods, and the MPI engine's tensor
collectives sum like its buffer ones (a real 2-rank mpiexec job)."""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from rnntrain.parallel.comm import Comm, LocalComm
from rnntrain.parallel.mpi import MPIComm
from rnntrain.parallel.torchdist import TorchComm
from tests.conftest import ROOT, mpiexec

ENGINES = (LocalComm, MPIComm, TorchComm)


def _protocol_members():
    methods = {n: f for n, f in vars(Comm).items()
               if callable(f) and not n.startswith("_")}
    return methods, set(Comm.__annotations__)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda c: c.__name__)
def test_every_engine_implements_the_protocol(engine):
    """Each method of the protocol exists on the engine with the same parameters and
    defaults (so a caller written against ``Comm`` works on every engine), and each
    declared attribute is set on the class or in its constructor."""
    methods, attrs = _protocol_members()
    assert {"allreduce_t", "reduce_t", "grad_buckets"} <= set(methods)
    for name, proto in methods.items():
        impl = getattr(engine, name, None)
        assert callable(impl), f"{engine.__name__} lacks {name}"
        want = [(p.name, p.default) for p in inspect.signature(proto).parameters.values()]
        got = [(p.name, p.default) for p in inspect.signature(impl).parameters.values()]
        assert got == want, f"{engine.__name__}.{name}{got} != Comm.{name}{want}"
    init = inspect.getsource(engine.__init__) if "__init__" in vars(engine) else ""
    for a in attrs:
        assert a in vars(engine) or re.search(rf"self\.{a}\b[^=\n]*=", init) \
            or re.search(rf"self\.{a}, ", init), f"{engine.__name__} never sets {a}"


def test_local_comm_is_a_comm_and_every_collective_is_the_identity():
    c = LocalComm()
    assert isinstance(c, Comm) and (c.rank, c.size) == (0, 1) and not c.can_overlap
    buf = np.arange(5, dtype=np.float32)
    t = torch.arange(4.0)
    assert c.allreduce_(buf) is buf and c.reduce_(buf) is buf and c.bcast_(buf) is buf
    assert np.array_equal(c.allgather_(buf), buf[None])
    assert c.allreduce_t(t) is t and c.reduce_t(t) is t and torch.equal(t, torch.arange(4.0))
    assert c.allgather("x") == ["x"] and c.bcast_obj(3) == 3 and not c.calls


def test_no_module_probes_the_communicator():
    """The protocol declares what an engine can do: no getattr on a communicator."""
    bad = []
    for path in (ROOT / "rnntrain").rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"getattr\((self\.)?_?comm\b|hasattr\((self\.)?_?comm\b|"
                         r"tensor_collectives|__name__ == \"\w+Comm\"", line):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, bad


MPI_TENSORS = r"""
import sys, numpy as np, torch
from rnntrain.parallel.mpi import init
c = init()
assert c.size == 2 and c.name == "mpi"
t = torch.arange(6, dtype=torch.float32) * (c.rank + 1)          # rank r: r+1 times 0..5
c.allreduce_t(t, "test allreduce")
assert torch.equal(t, torch.arange(6, dtype=torch.float32) * 3), t
u = torch.full((3,), float(c.rank + 2))
c.reduce_t(u, 0, "test reduce")
assert torch.equal(u, torch.full((3,), 5.0) if c.rank == 0 else torch.full((3,), 3.0)), u
assert c.calls["allreduce_"] == 1 and c.calls["reduce_"] == 1
# one file per rank: the ranks' stdout reaches mpiexec's pipe interleaved byte-wise
open(f"{sys.argv[1]}/rank{c.rank}", "w").write("ok")
"""


@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found")
def test_mpi_tensor_collectives_sum_in_place_over_two_ranks(tmp_path):
    r = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-c", MPI_TENSORS,
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert all(p.read_text() == "ok" for p in tmp_path.iterdir())
