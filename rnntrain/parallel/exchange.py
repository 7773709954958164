"""The gradient exchange between ranks: one collective per step, two modes, three wires.

The step's message is the ``FlatGrad`` message [gradient (P,) | loss, seqs, frames, errors,
ref_labels | stop flag], so the counts used for loss normalisation are global (N ranks with
global batch B make the same update as one rank with batch B), and a stop request (SIGINT/
SIGTERM on any rank) reaches every rank in the same step without a collective of its own.

- ``dist.mode = "allreduce"`` (default): one Allreduce; every rank applies the same update.
- ``dist.mode = "master"``: Reduce to rank 0, rank 0 steps the optimizer (it computes too)
  and broadcasts the new weights.
- ``dist.wire = "fp32"``: the buffer as it is (MPI's own SUM, ring/Rabenseifner for big
  messages; torch.distributed: ``all_reduce`` on the buffer's device, NCCL on a GPU). ``"bf16"``/``"fp16"``: a compressed message [scale, non-finite flag, stats
  (fp32) | gradient (16-bit)] reduced with a custom op that decodes both operands with their
  own scale, sums in fp32 and re-encodes with a fresh power-of-two scale (fp16's range is
  65504: without scaling large sums overflow and small gradients flush to zero). The flag
  counts ranks whose local gradient was Inf/NaN, so the step is skipped everywhere.

- ``dist.overlap`` (torch.distributed, allreduce, fp32): the same message in buckets whose
  allreduces start during the last task's backward (``torchdist.GradBuckets``, reverse
  parameter order as DDP); the message tail (figures, stop flag) rides in the first
  bucket, so no extra collective is needed. ``reduce`` then only waits for them.
  ``overlap_wanted`` decides and refuses what cannot overlap.

Also here: start-up synchronisation (weights, optimizer and loop state from rank 0,
checked with a checksum) and the per-log-interval gather (one numpy allgather) of per-rank
compute times (straggler gap), step-time splits and weight checksums.
"""
from __future__ import annotations

import numpy as np
import torch

from rnntrain.compute.device import masked_step
from rnntrain.compute.model import flatten_params, unflatten_params
from rnntrain.errors import ConfigError, UserError
from rnntrain.compute.tasks import MSG_TAIL, FlatGrad, Stat
from rnntrain.parallel.comm import Comm

# header of a 16-bit message, float32: scale, non-finite flag, then the message tail
# (the N_STATS stats and the stop flag)
_HDR = 2 + MSG_TAIL
_FP16_MAX = 65504.0


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 (P,) → bfloat16 bit patterns (P,) uint16, round to nearest even."""
    bits = x.view(np.uint32)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1)).astype(np.uint32)
    out = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def _from_bf16(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


class WireCodec:
    """Encode/decode/combine one compressed message of P gradient values."""

    def __init__(self, wire: str, numel: int):
        assert wire in ("bf16", "fp16")
        self.wire, self.numel = wire, numel
        self.nbytes = 4 * _HDR + 2 * numel

    def _views(self, msg: np.ndarray):
        hdr = msg[: 4 * _HDR].view(np.float32)
        body = msg[4 * _HDR: self.nbytes].view(np.uint16)
        return hdr, body

    def _scale_for(self, absmax: float) -> float:
        """A power of two bringing the largest magnitude to ~1/4 of fp16's range (room for
        the sum with the next operand); 1 for bf16 (fp32's range)."""
        if self.wire == "bf16" or not np.isfinite(absmax) or absmax == 0:
            return 1.0
        return float(2.0 ** np.clip(np.floor(np.log2(_FP16_MAX / 4 / absmax)), -40, 40))

    def encode_into(self, msg: np.ndarray, grad: np.ndarray, stats: np.ndarray, flag: float):
        hdr, body = self._views(msg)
        absmax = float(np.abs(grad).max()) if grad.size else 0.0
        scale = self._scale_for(absmax)
        hdr[0], hdr[1], hdr[2:] = scale, flag, stats
        if self.wire == "bf16":
            body[:] = _to_bf16(np.ascontiguousarray(grad, np.float32))
        else:
            body[:] = (grad * scale).astype(np.float16).view(np.uint16)

    def decode(self, msg: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """→ (gradient (P,) float32, tail (MSG_TAIL,) float32, non-finite flag)."""
        hdr, body = self._views(msg)
        if self.wire == "bf16":
            g = _from_bf16(body)
        else:
            g = body.view(np.float16).astype(np.float32) / np.float32(hdr[0])
        return g, hdr[2:].copy(), float(hdr[1])

    def combine(self, a: np.ndarray, b: np.ndarray):
        """The MPI op: b ← a + b (commutative bit for bit: both orders give one result)."""
        ga, sa, fa = self.decode(a)
        gb, sb, fb = self.decode(b)
        self.encode_into(b, ga + gb, sa + sb, fa + fb)


def overlap_wanted(dcfg, comm: Comm, device: torch.device, workers: int) -> bool:
    """``dist.overlap`` resolved for this rank: "auto" is on for torch.distributed ranks on
    CUDA with one worker (allreduce, fp32 wire), "on" wherever it can run (also gloo on
    the CPU), "off" never. ConfigError when "on" cannot work here. Alone there is nothing
    to exchange: off."""
    choice = getattr(dcfg, "overlap", "off")
    if choice == "off":
        return False
    if choice == "auto":
        return (comm.size > 1 and comm.can_overlap and device.type == "cuda" and workers == 1
                and dcfg.mode == "allreduce" and dcfg.wire == "fp32")
    if dcfg.mode != "allreduce" or dcfg.wire != "fp32":
        raise ConfigError(f'dist.overlap = "on" needs dist.mode = "allreduce" and dist.wire '
                          f'= "fp32" (got "{dcfg.mode}", "{dcfg.wire}")')
    if workers != 1:
        # the buckets start during ONE backward; with several workers the step's gradient
        # is complete only after the fixed-order sum of tasks computed in parallel
        raise ConfigError(f'dist.overlap = "on" needs one worker per rank (compute.threads = '
                          f'1; this rank runs {workers}): set compute.threads = 1 (and '
                          'compute.intra_threads for the cores) or dist.overlap = "off"')
    if comm.size > 1 and not comm.can_overlap:
        raise ConfigError('dist.overlap = "on" needs the torch.distributed engine '
                          f'(torchrun); this job runs on {comm.name}: use torchrun or '
                          'dist.overlap = "off"')
    return comm.size > 1


class Exchange:
    """Per-step exchange of the flat gradient message; ``run.step.StepRunner`` calls
    ``reduce`` → ``apply_update`` → ``publish`` once per step, ``window`` at log steps.

    Collectives per step: allreduce mode, exactly one (the message; overlapped, one per
    bucket of it, started during backward: ``arm``); master mode, two (the reduce of the
    message, then the weight broadcast). The stop flag rides them: in the message's last
    slot (summed: the number of ranks asking to stop), and in master mode also in the last
    slot of the weight broadcast, so every rank learns rank 0's verdict.
    """

    def __init__(self, comm: Comm, dcfg, flat: FlatGrad, params: list[torch.nn.Parameter],
                 workers: int = 1):
        self.comm, self.mode, self.wire = comm, dcfg.mode, dcfg.wire
        self.flat, self.params = flat, params
        self.root = comm.rank == 0
        # optimizer steps here: every rank in allreduce mode, rank 0 only in master mode
        self.updates = self.mode == "allreduce" or self.root
        cpu = flat.msg.device.type == "cpu"
        # 16-bit wires encode on the host: GPU ranks stage the message in pinned host
        # memory; on the CPU the flat buffer itself is the message (no copy)
        self._pinned = None if cpu or self.wire == "fp32" else \
            torch.empty(flat.msg.numel(), pin_memory=True)
        self.host = flat.msg.numpy() if cpu else \
            self._pinned.numpy() if self._pinned is not None else None
        n_params = sum(p.numel() for p in params)
        # master mode's broadcast: [weights (P,) | stop flag]
        self.weights = np.zeros(n_params + 1, np.float32)
        self.codec = WireCodec(self.wire, flat.numel) if self.wire != "fp32" else None
        self.msg = np.zeros(self.codec.nbytes, np.uint8) if self.codec else None
        self.bytes_sent = 0           # message bytes handed to MPI by this rank (all steps)
        self._compute: list[float] = []
        self._early: list[float] = []  # overlapped: share of buckets started in backward
        self._stop = False
        # the same op object for every step so dist caches one MPI op and datatype
        self._combine = self.codec.combine if self.codec else None
        # overlapped: buckets of the message whose allreduces start during backward
        self.buckets = None
        if overlap_wanted(dcfg, comm, flat.msg.device, workers):
            self.buckets = comm.grad_buckets(params, flat.msg,
                                             int(getattr(dcfg, "bucket_mb", 25.0) * 2**20))

    @property
    def overlapped(self) -> bool:
        """The message travels in buckets started during the last task's backward: the
        step calls ``arm`` just before that backward, ``reduce`` after it."""
        return self.buckets is not None

    def arm(self, stop: bool):
        """Overlapped: just before the last task's backward, with the step's figures
        already summed into the message tail; puts this rank's stop request in it and arms
        the buckets (bucket 0, which carries the tail, starts first)."""
        self.flat.msg[self.flat.numel + self.flat.STOP] = 1.0 if stop else 0.0
        self.buckets.arm()

    def reduce(self, step: int, compute_s: float = 0.0, stop: bool = False):
        """Sum every rank's message (gradient, figures, stop flag): on every rank
        (allreduce) or on rank 0 (master). ``stop``: this rank asks to stop after this
        step; ``publish`` returns the verdict every rank shares."""
        self._compute.append(compute_s)
        self._stop = stop
        if self.comm.size == 1:
            return
        what = f"gradient exchange of step {step}"
        flat = self.flat
        stop_at = flat.numel + flat.STOP
        if self.buckets is not None:  # under way since backward: wait for every bucket
            b = self.buckets
            self._early.append(b.launched_during_backward / len(b.buckets))
            b.finish(what)
            self.bytes_sent += flat.msg.numel() * flat.msg.element_size()
            self._stop = bool(flat.msg[stop_at] > 0)
            return
        if self.codec is None:
            # the fp32 message where it lives: the engine moves it (torch.distributed:
            # NCCL on a GPU, gloo on the CPU; MPI: the CPU buffer itself, a GPU one through
            # a pinned host copy)
            flat.msg[stop_at] = 1.0 if stop else 0.0
            if self.mode == "allreduce":
                self.comm.allreduce_t(flat.msg, what)
            else:
                self.comm.reduce_t(flat.msg, 0, what)
            self.bytes_sent += flat.msg.numel() * flat.msg.element_size()
            if self.updates:  # (one value; the collective's wait has synchronised already)
                self._stop = bool(flat.msg[stop_at] > 0)
            return
        # 16-bit wire: encoded on the host, reduced with the codec's own op
        if self._pinned is not None:
            self._pinned.copy_(flat.msg)
        self.host[stop_at] = 1.0 if stop else 0.0  # host side: no device write to wait for
        grad, stats = self.host[: flat.numel], self.host[flat.numel:]
        flag = 0.0 if np.isfinite(grad).all() and np.isfinite(stats).all() else 1.0
        self.codec.encode_into(self.msg, grad, stats, flag)
        if self.mode == "allreduce":
            self.comm.allreduce_(self.msg, self._combine, what=what)
        else:
            self.comm.reduce_(self.msg, 0, self._combine, what=what)
        self.bytes_sent += self.msg.nbytes
        if not self.updates:
            return
        grad, stats, flag = self.codec.decode(self.msg)
        if flag:
            stats[Stat.LOSS] = np.nan  # some rank had Inf/NaN: the step is skipped everywhere
        self.host[: flat.numel], self.host[flat.numel:] = grad, stats
        self._stop = bool(self.host[stop_at] > 0)  # read on the host copy: no device sync
        if self._pinned is not None:
            flat.msg.copy_(self._pinned, non_blocking=False)

    def apply_update(self, opt: torch.optim.Optimizer, finite: torch.Tensor):
        """The optimizer update, where this mode makes it; skipped when ``finite`` (0-dim
        bool tensor: loss and gradient free of NaN/Inf) is False, without a host read on
        a GPU (``device.masked_step``)."""
        if self.updates:
            masked_step(opt, finite)

    def publish(self, step: int) -> bool:
        """Master mode: rank 0's new weights and stop verdict to every rank
        (unconditionally, so a skipped update on rank 0 can never leave the others
        waiting). → True on every rank when some rank asked to stop after this step."""
        if self.mode != "master" or self.comm.size == 1:
            return self._stop
        if self.root:
            self.weights[:-1] = flatten_params(self.params)
            self.weights[-1] = 1.0 if self._stop else 0.0
        self.comm.bcast_(self.weights, 0, what=f"weight broadcast of step {step}")
        self.bytes_sent += self.weights.nbytes if self.root else 0
        if not self.root:
            unflatten_params(self.weights[:-1], self.params)
            self._stop = bool(self.weights[-1] > 0)
        return self._stop

    def window(self, per_rank: dict[str, float] | None = None) -> dict:
        """At a log step, on every rank (one buffer collective, an allgather of
        [weight checksum | ``per_rank`` values | compute time of each step]). → straggler
        gap (mean over steps of max − min compute over ranks), slowest rank and, under
        "ranks", every rank's ``per_rank`` values and, overlapped, ``buckets_in_backward``
        (this rank's mean share of buckets whose allreduce started while backward still
        ran); a weight mismatch between ranks is an error. Alone: {} (nothing to
        compare)."""
        times = np.array(self._compute, np.float64)
        self._compute = []
        if self.comm.size == 1:
            return {}
        keys = list(per_rank or {})
        row = np.concatenate([[_checksum(self.params)],
                              [float(per_rank[k]) for k in keys], times])
        rows = self.comm.allgather_(row, what="metrics gather")
        sums, extra, t = rows[:, 0], rows[:, 1: 1 + len(keys)], rows[:, 1 + len(keys):]
        if np.any(sums != sums[0]):
            raise UserError("weights differ between ranks (checksums " +
                            ", ".join(f"rank {r}: {s!r}" for r, s in enumerate(sums)) +
                            "): the ranks' updates diverged")
        per_rank_t = t.mean(axis=1) if t.shape[1] else np.zeros(len(t))
        out = {"straggler_gap_s": float((t.max(0) - t.min(0)).mean()) if t.shape[1] else 0.0,
               "compute_max_s": float(per_rank_t.max()),
               "compute_min_s": float(per_rank_t.min()),
               "slowest_rank": int(per_rank_t.argmax())}
        if keys:
            out["ranks"] = [{k: round(float(v), 6) for k, v in zip(keys, r)} for r in extra]
        if self._early:  # this rank's: how much of the exchange could hide behind backward
            out["buckets_in_backward"] = round(float(np.mean(self._early)), 4)
            self._early = []
        return out

    def close(self):
        """Remove the overlap's gradient hooks from the parameters (idempotent)."""
        if self.buckets is not None:
            self.buckets.remove()
            self.buckets = None

    def sync_start(self, model, opt, state: dict) -> dict:
        """Rank 0's weights, optimizer state and loop state (``TrainState.state_dict()``)
        to every rank, then verify on every rank a checksum of the weights and optimizer
        state (a mismatch: error before step 1). Returns the loop state (rank 0's)."""
        comm = self.comm
        if comm.size == 1:
            return state
        vec = flatten_params(self.params)
        comm.bcast_(vec, 0, what="start-up weight broadcast")
        unflatten_params(vec, self.params)
        ostate = comm.bcast_obj(_to_cpu(opt.state_dict()) if self.root else None)
        if not self.root:
            opt.load_state_dict(ostate)
        state = comm.bcast_obj(dict(state) if self.root else None)
        total = _checksum(self.params) + sum(
            float(v.double().sum()) for s in opt.state_dict()["state"].values()
            for v in s.values() if torch.is_tensor(v))
        comm.check_same(total, "weight and optimizer-state checksum after broadcast")
        return state


def _to_cpu(obj):
    """A state dict with every tensor on the CPU (so it unpickles on any rank's device)."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _checksum(params) -> float:
    """A float64 sum of the weights: equal on every rank iff they hold the same bytes
    (to the precision any training divergence would show)."""
    return float(sum(p.detach().double().sum() for p in params))
