"""The torch.distributed transport: the only module that imports torch.distributed.

``TorchComm`` implements the communicator interface ``rnntrain.parallel.comm.Comm``
(``allreduce_``, ``reduce_``, ``bcast_``, ``allgather_`` on numpy buffers, the tensor
collectives, the small start-up object collectives, ``check_same``, ``roster``, ``abort``) on a process group
started from torchrun's environment (``env://``: MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE). Host buffers travel over gloo (TCP); on a CUDA
job the group is ``cpu:gloo,cuda:nccl``, so device tensors (``GradBuckets``) travel over
NCCL and the host ones still over gloo.

Failure handling, as in the MPI layer: every collective is started asynchronously and
waited for under a deadline (``dist.timeout_s``; the process group's own timeout, a little
longer, is the backstop). A collective that fails (a peer's connection closed: the process
died or raised), a peer on this host whose process has exited (``exited_peers``: the close
does not always arrive) or a missed deadline (a peer stuck) starts a roll call through the
rendezvous store (torchrun's agent hosts it, so it outlives any rank): each rank still in
the job checks in under the collective's sequence number, and the lowest one names the
ranks that did not and ends the job. Ranks waiting in a collective answer a roll call they
see in the store, so a rank that is merely waiting behind the dead one is never blamed.

Custom reductions (the 16-bit wires' ``combine``) have no torch.distributed op: every
rank gathers all ranks' messages and folds them in rank order, so every rank ends with the
same bytes (per-rank traffic (N-1) x message; see docs/scaling.md).
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as td

from rnntrain.errors import SharedError, UserError
from rnntrain.parallel.comm import Combine, run_abort_hooks

_SPIN_S = 0.02      # busy-progress window before backing off (as in mpi.MPIComm._wait)
_POLL_STORE_S = 0.1  # while waiting longer: how often to look for a roll call
_EXITED_GRACE_S = 1.0  # a peer's process is gone: its last bytes may still be on the way
# object collectives (start-up, as the MPI layer's blocking ones) wait at least this long:
# ranks open their data at their own pace before the first one, and a small
# dist.timeout_s is meant for steps
_STARTUP_MIN_S = 60.0


# all_gather_into_tensor was renamed all_gather_single (the old name warns)
_all_gather = getattr(td, "all_gather_single", None) or td.all_gather_into_tensor


def _started(pid: int) -> int | None:
    """The start time (clock ticks after boot) of the live process ``pid``, or None when
    there is none (never was, reaped, or a zombie) or no /proc to ask (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) "
    return None if fields[0] in (b"Z", b"X") else int(fields[19])


def available() -> bool:
    return td.is_available() and td.is_gloo_available()


class TorchComm:
    """The torch.distributed engine (implements ``comm.Comm``)."""
    name = "torch"
    can_overlap = True   # GradBuckets

    def __init__(self, timeout_s: float = 120.0, cuda: bool = False):
        env = os.environ
        self.rank, self.size = int(env["RANK"]), int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", 0))
        self.local_size = int(env.get("LOCAL_WORLD_SIZE", 1))
        self.timeout_s = timeout_s
        # NCCL only carries device tensors; numpy buffers always go through gloo
        self.nccl = cuda and td.is_nccl_available() and torch.cuda.is_available()
        self.backend = "cpu:gloo,cuda:nccl" if self.nccl else "gloo"
        if self.nccl:
            # NCCL's watchdog aborts a timed-out collective instead of hanging the stream
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        # the group's own timeout is the backstop (gloo's ops and NCCL's watchdog give up
        # after it); our deadlines, polled in wait(), are the ones that fire: timeout_s per
        # step, longer for the start-up object collectives (see _startup)
        try:
            td.init_process_group(self.backend, rank=self.rank, world_size=self.size,
                                  timeout=timedelta(seconds=max(timeout_s, _STARTUP_MIN_S) + 5))
        except (RuntimeError, ValueError) as e:  # DistNetworkError/DistStoreError included
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"torch.distributed: rank {self.rank} of {self.size} cannot join "
                            f"the process group at {env.get('MASTER_ADDR')}:"
                            f"{env.get('MASTER_PORT')} ({first})") from None
        self.store = td.PrefixStore("rnntrain/", td.distributed_c10d._get_default_store())
        self.calls: Counter = Counter()  # (counted by the MPI engine's schedule tests only)
        self._seq = 0
        self._idle = threading.Event()  # never set: a bounded sleep between polls
        # rank → (pid, start time); empty while the start-up exchange below waits
        self._watch: dict[int, tuple[int, int]] = {}
        here = socket.gethostname()
        who = self.allgather((os.getpid(), here, _started(os.getpid())))
        self._who = [(pid, host) for pid, host, _ in who]
        # peers whose process this rank can watch (same host, same process namespace: the
        # start time it reads under their pid is the one they reported)
        self._watch = {r: (pid, start) for r, (pid, host, start) in enumerate(who)
                       if r != self.rank and host == here and start is not None
                       and _started(pid) == start}

    # ---- per-step collectives on numpy buffers (in place where the MPI layer is)
    def allreduce_(self, buf: np.ndarray, combine: Combine | None = None,
                   what: str = "allreduce") -> np.ndarray:
        assert buf.flags.c_contiguous
        if combine is None:
            self._run(lambda: td.all_reduce(torch.from_numpy(buf), async_op=True), what)
            return buf
        rows = self.allgather_(buf, what)
        self._fold(rows, combine, buf)
        return buf

    def reduce_(self, buf, root=0, combine=None, what="reduce"):
        assert buf.flags.c_contiguous
        t = torch.from_numpy(buf)
        if combine is None:
            self._run(lambda: td.reduce(t, dst=root, async_op=True), what)
            return buf
        rows = torch.empty((self.size, buf.nbytes), dtype=torch.uint8) if self.rank == root \
            else None
        flat = torch.from_numpy(buf.view(np.uint8).reshape(-1))
        self._run(lambda: td.gather(flat, list(rows.unbind(0)) if rows is not None else None,
                                    dst=root, async_op=True), what)
        if self.rank == root:
            self._fold(rows.numpy(), combine, buf)
        return buf

    def bcast_(self, buf, root=0, what="broadcast"):
        assert buf.flags.c_contiguous
        self._run(lambda: td.broadcast(torch.from_numpy(buf), src=root, async_op=True), what)
        return buf

    def allgather_(self, buf, what="allgather"):
        buf = np.ascontiguousarray(buf)
        out = np.empty((self.size, *buf.shape), buf.dtype)
        src, dst = torch.from_numpy(buf.reshape(-1)), torch.from_numpy(out.reshape(-1))
        self._run(lambda: _all_gather(dst, src, async_op=True), what)
        return out

    # ---- the same on torch tensors where they live (NCCL for CUDA tensors, gloo for CPU)

    def allreduce_t(self, t: torch.Tensor, what: str = "allreduce") -> torch.Tensor:
        """Sum ``t`` over ranks in place."""
        self._run(lambda: td.all_reduce(t, async_op=True), what)
        return t

    def reduce_t(self, t: torch.Tensor, root: int = 0, what: str = "reduce") -> torch.Tensor:
        """Sum ``t`` into ``root``'s ``t``."""
        self._run(lambda: td.reduce(t, dst=root, async_op=True), what)
        return t

    @staticmethod
    def _fold(rows: np.ndarray, combine: Combine, out: np.ndarray):
        """out ← rows[0] ⊕ rows[1] ⊕ … in rank order (the same bytes on every rank)."""
        acc = np.ascontiguousarray(rows[0]).view(np.uint8).reshape(-1).copy()
        for r in range(1, len(rows)):
            combine(np.ascontiguousarray(rows[r]).view(np.uint8).reshape(-1), acc)
        out.view(np.uint8).reshape(-1)[:] = acc

    def grad_buckets(self, params: list[torch.nn.Parameter], msg: torch.Tensor,
                     bucket_bytes: int) -> "GradBuckets":
        """The overlapped exchange of ``msg`` (gradients of ``params``, then the message
        tail) in buckets started during backward (``GradBuckets``)."""
        return GradBuckets(self, params, msg, bucket_bytes)

    # ---- start-up (small objects, pickled into byte tensors)
    def allgather(self, obj) -> list:
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = self._startup(lambda: self.allgather_(np.array([data.size], np.int64),
                                                      "start-up size exchange"))
        pad = np.zeros(int(sizes.max()), np.uint8)
        pad[: data.size] = data
        rows = self._startup(lambda: self.allgather_(pad, "start-up object exchange"))
        return [pickle.loads(rows[r, : int(sizes[r, 0])].tobytes()) for r in range(self.size)]

    def bcast_obj(self, obj, root: int = 0):
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if self.rank == root else None
        n = np.array([data.size if data is not None else 0], np.int64)
        self._startup(lambda: self.bcast_(n, root, "start-up size broadcast"))
        body = data.copy() if data is not None else np.empty(int(n[0]), np.uint8)
        self._startup(lambda: self.bcast_(body, root, "start-up object broadcast"))
        return obj if self.rank == root else pickle.loads(body.tobytes())

    def check_same(self, value, what: str):
        values = self.allgather(value)
        if any(v != values[0] for v in values):
            raise SharedError(f"ranks disagree on {what}: " +
                            ", ".join(f"rank {r}: {v}" for r, v in enumerate(values)))

    def barrier(self):
        # a tiny host allreduce: td.barrier() would pick NCCL on a CUDA job and need a device
        self.allreduce_(np.zeros(1, np.int32), what="barrier")

    def roster(self) -> str:
        return f"{self.size} torch.distributed ranks ({self.backend}): " + ", ".join(
            f"rank {r} = pid {pid} on {host}" for r, (pid, host) in enumerate(self._who))

    def abort(self, msg: str, code: int = 1) -> NoReturn:
        run_abort_hooks(f"rank {self.rank} of {self.size}: {msg}")  # status.json: failed
        print(f"[rank {self.rank}/{self.size}] {msg}", file=sys.stderr, flush=True)
        # torchrun sees a worker exit non-zero and stops the others (SIGTERM, then SIGKILL)
        os._exit(code)

    def close(self):
        if td.is_initialized():
            td.destroy_process_group()

    # ---- internals
    def _startup(self, fn):
        """Run a start-up collective with a deadline of at least _STARTUP_MIN_S."""
        saved = self.timeout_s
        self.timeout_s = max(saved, _STARTUP_MIN_S)
        try:
            return fn()
        finally:
            self.timeout_s = saved

    def _run(self, start, what: str):
        """Start a collective (``start()`` → async Work) and wait for it under the deadline;
        a failure or a missed deadline ends the job naming the missing rank(s)."""
        self._seq += 1
        try:
            work = start()
        except RuntimeError as e:  # the group is already broken (a peer gone)
            self._roll_call(what, f"{type(e).__name__}: {e}")
        self.wait(work, what)

    def wait(self, work, what: str):
        """Wait for ``work`` (a torch.distributed Work, gloo or NCCL) under the deadline.

        Polling ``is_completed`` (instead of a blocking wait) keeps the deadline ours, lets
        this rank answer a roll call while it waits, watch the processes of the ranks on this
        host, and leaves signal handlers (a stop request) running on the main thread.
        """
        start = time.monotonic()
        try:
            if not work.is_completed():
                while time.monotonic() - start < _SPIN_S and not work.is_completed():
                    os.sched_yield()
                delay, next_poll, answered, seen_gone = 2e-5, start + _POLL_STORE_S, False, None
                while not work.is_completed():
                    now = time.monotonic()
                    if now - start > self.timeout_s:
                        self._roll_call(what, None)
                    if now > next_poll:
                        next_poll = now + _POLL_STORE_S
                        answered = answered or self._answer_roll_call()
                        gone = self.exited_peers()
                        if not gone:
                            seen_gone = None
                        elif seen_gone is None:
                            seen_gone = now  # what it sent before exiting may still land
                        elif now - seen_gone > _EXITED_GRACE_S:
                            self._roll_call(what, "; ".join(
                                f"rank {r}'s process {self._watch[r][0]} has exited"
                                for r in gone))
                    self._idle.wait(delay)
                    delay = min(delay * 2, 2e-3)
            work.wait()  # completed: raises the collective's error, if any
        except RuntimeError as e:
            first = str(e).splitlines()[0] if str(e) else ""
            self._roll_call(what, f"{type(e).__name__}: {first.split('. ')[0][:300]}")

    def _key(self, seq: int | None = None) -> str:
        return f"rc/{self._seq if seq is None else seq}/"

    def _answer_roll_call(self) -> bool:
        try:
            if self.store.check([self._key() + "called"]):
                self.store.set(self._key() + str(self.rank), b"1")
                return True
        except RuntimeError:
            pass  # the store is unreachable: the caller's roll call names what it can
        return False

    def _roll_call(self, what: str, error: str | None):
        """Check in for this collective, call the others, wait a grace period; the lowest
        rank present names the absent ones and ends the job (the others exit quietly)."""
        key = self._key()
        grace = min(5.0, max(1.0, self.timeout_s / 4))
        present = {self.rank}
        try:
            self.store.set_timeout(timedelta(seconds=grace + 1))
            if self.store.check([key + "done"]):
                self._quiet_exit()
            self.store.set(key + str(self.rank), b"1")
            self.store.set(key + "called", b"1")
            end = time.monotonic() + grace
            others = [r for r in range(self.size) if r != self.rank]
            while True:
                present |= {r for r in others if self.store.check([key + str(r)])}
                if len(present) == self.size or time.monotonic() > end:
                    break
                time.sleep(0.05)
            if min(present) != self.rank or self.store.check([key + "done"]):
                self._quiet_exit()
            self.store.set(key + "done", b"1")
        except RuntimeError:
            pass  # no store: report alone
        missing = sorted(set(range(self.size)) - present)
        names = ", ".join(map(str, missing)) or "(none: all ranks are present)"
        if error is None:
            self._kill_stuck(missing)
            self.abort(f"error: rank(s) {names} of {self.size} did not arrive at the {what} "
                       f"within dist.timeout_s = {self.timeout_s:g} s (killed or stuck); "
                       "aborting the job")
        self.abort(f"error: rank(s) {names} of {self.size} left the job during the {what} "
                   f"(process died or raised; {error}); aborting the job")

    def exited_peers(self) -> list[int]:
        """Ranks on this host whose process has exited. The transport usually reports a dead
        peer at once (its connection closes), but not always: a process the peer forked
        keeps its sockets open, and gloo can miss the close while a collective is queued.
        Without this, such a death would be seen only at dist.timeout_s, as a stuck rank."""
        return [r for r, (pid, start) in self._watch.items() if _started(pid) != start]

    def _kill_stuck(self, ranks):
        """A stuck rank on this host is killed: a stopped or hung process ignores torchrun's
        SIGTERM, and torchrun waits 30 s before its SIGKILL (past dist.timeout_s)."""
        here = socket.gethostname()
        for r in ranks:
            pid, host = self._who[r]
            if host == here and pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def _quiet_exit(self):
        """Another rank reports this failure; leave without a second message."""
        sys.stderr.flush()
        os._exit(1)


class GradBuckets:
    """Gradient exchange overlapped with the backward pass, as DDP does it.

    Parameters are grouped into buckets of about ``bucket_bytes`` in REVERSE parameter
    order (backward produces the last layers' gradients first). ``grads`` is one
    contiguous buffer whose first P values are the parameters' ``.grad`` (``FlatGrad``),
    so a bucket is one contiguous slice and travels without a copy; anything after the P
    gradient values (the step's message tail: figures and stop flag) travels in bucket 0,
    the first to start, so the whole message still crosses in these collectives alone. A
    hook per parameter (``register_post_accumulate_grad_hook``) counts the gradients that
    are final; when the last of a bucket is, that bucket's allreduce starts (async; NCCL on
    CUDA: on its own stream, so it runs while the rest of backward computes), and
    ``finish()`` waits for all of them under ``dist.timeout_s``, naming a rank that died or
    hung (``TorchComm.wait``). Use: ``arm()`` before the backward whose gradients are final
    (one task per step, or the last one), ``finish()`` after it.
    """

    def __init__(self, comm: TorchComm, params: list[torch.nn.Parameter], grads: torch.Tensor,
                 bucket_bytes: int = 25 << 20):
        self.comm, self.params, self.grads = comm, params, grads
        offs = np.cumsum([0] + [p.numel() for p in params])
        assert grads.dim() == 1 and grads.is_contiguous() and grads.numel() >= offs[-1]
        self.buckets: list[tuple[int, int]] = []      # (start, end) slices of grads
        self.bucket_of: dict[int, int] = {}           # param index → bucket index
        size, end, members = 0, grads.numel(), []
        for i in reversed(range(len(params))):
            members.append(i)
            size += params[i].numel() * grads.element_size()
            if size >= bucket_bytes or i == 0:
                b = len(self.buckets)
                self.buckets.append((int(offs[i]), end))
                for j in members:
                    self.bucket_of[j] = b
                end, size, members = int(offs[i]), 0, []
        self.need = [0] * len(self.buckets)
        for b in self.bucket_of.values():
            self.need[b] += 1
        self.launched: list[int] = []   # bucket indices in launch order (for checks)
        self.launched_during_backward = 0
        self._armed, self._left, self._works, self._next = False, [], [], 0
        self._error: tuple[int, str] | None = None  # (sequence number, why) of a failed start
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i))
                       for i, p in enumerate(params)]

    def _hook(self, i: int):
        def ready(_p):
            if not self._armed:
                return
            self._left[self.bucket_of[i]] -= 1
            # in bucket order, as DDP: every rank then issues the same collectives in the
            # same order whatever order autograd finishes the parameters in
            while self._next < len(self.buckets) and self._left[self._next] == 0:
                self._launch(self._next)
                self._next += 1
        return ready

    def _launch(self, b: int):
        s, e = self.buckets[b]
        self.comm._seq += 1
        if self._error is None:
            try:
                self._works.append((self.comm._seq, td.all_reduce(self.grads[s:e],
                                                                  async_op=True)))
            except RuntimeError as err:  # the group is broken (a peer gone): finish() reports
                self._error = (self.comm._seq, f"{type(err).__name__}: {err}")
        self.launched.append(b)
        if any(self._left):  # other buckets still wait for backward
            self.launched_during_backward += 1

    def arm(self):
        self._armed, self._left, self._works, self.launched = True, list(self.need), [], []
        self._next, self.launched_during_backward, self._error = 0, 0, None

    def finish(self, what: str = "gradient exchange"):
        """Wait for every bucket (launching any whose hooks did not fire: unused params,
        or a backward that raised). A rank that died, raised or hangs ends the job here,
        named by the lowest rank still present (``TorchComm.wait``, the roll call)."""
        while self._next < len(self.buckets):
            self._left[self._next] = 0
            self._launch(self._next)
            self._next += 1
        self._armed = False
        comm, n = self.comm, len(self.buckets)
        saved = comm._seq
        for k, (seq, work) in enumerate(self._works):
            comm._seq = seq  # the roll call's key: the collective every rank numbers alike
            comm.wait(work, f"{what} (bucket {k + 1} of {n})")
        if self._error is not None:
            comm._seq = self._error[0]
            comm._roll_call(what, self._error[1])
        comm._seq = saved
        self._works = []

    def remove(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
