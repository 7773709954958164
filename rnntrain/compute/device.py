"""Where the step runs and in what precision: device choice, streams, loss scaling.

Everything here works on CPU tensors too (the CUDA-only parts become no-ops), so the step
logic is one code path and is tested on machines without a GPU.

Why the care about synchronisation: a CUDA step is a queue of kernels; any read of a device
value on the host (``.item()``, ``float(t)``, ``bool(t)``, a blocking copy) makes the host
wait until the queue drains, and the GPU then idles while the host prepares the next batch.
So losses, counts, the gradient norm and the "finite" flag stay on the device and are read
at log intervals (``host_every``); a NaN/Inf step is skipped by the optimizer itself
(``masked_step``) and the fp16 loss scale is adjusted with tensor ops (``LossScaler``).
"""
from __future__ import annotations

import threading

import torch

from rnntrain.config import Precision, check_choice, check_device
from rnntrain.errors import UserError

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # fp32: no autocast


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` → a device. With ``cuda`` (or ``auto`` on
    a CUDA machine) MPI rank ``local_rank`` on a node takes GPU ``local_rank % count``, so
    N ranks per node spread over the node's GPUs."""
    check_device(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"compute.device = {name!r} but CUDA is not available here")
        count = torch.cuda.device_count()
        idx = int(name[5:]) if ":" in name else local_rank % count
        if idx >= count:
            raise UserError(f"compute.device = {name!r} but this machine has {count} GPU(s)")
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def memory_bytes(device: torch.device) -> int:
    """Memory a model can use on ``device``: the GPU's, or the machine's physical RAM
    (a cgroup limit, where one is set and smaller)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import os
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(f).read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return int(total)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``compute.precision`` on ``device`` (None = plain fp32).

    fp16 needs CUDA (CPU fp16 kernels are slow and the range problem buys nothing there);
    bf16 works on both. The CTC loss is always computed in fp32 (``ctc_loss_sum``)."""
    check_choice(precision, Precision, "compute.precision")
    if precision == "fp16" and device.type != "cuda":
        raise UserError("compute.precision = 'fp16' needs a CUDA device; use 'bf16' or "
                        "'fp32' on CPU")
    if precision == "bf16" and device.type == "cpu" and not cpu_bf16():
        raise UserError("compute.precision = 'bf16': oneDNN has no bf16 LSTM on this CPU "
                        "(it needs AVX-512); use 'fp32' (or 'auto', which then picks fp32)")
    return AUTOCAST.get(precision)


def cpu_bf16() -> bool:
    """Can oneDNN run bf16 on this CPU (AVX-512 with its bf16 emulation, avx512_bf16 or
    AMX)? An AVX2-only core (Zen 3, older Xeons) cannot create a bf16 LSTM primitive."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the query: assume it can
        return True


def host_every(device: torch.device, log_every: int) -> int:
    """Steps between host reads of the device-side figures: every step on CPU (a read is
    free there, so a NaN run stops at once), at log intervals on a GPU."""
    return 1 if device.type == "cpu" else max(1, log_every)


def worker_start(device: torch.device, worker: int = 0):
    """Run once on each worker thread: on CUDA the thread's device, its own compute stream
    (set current for the thread) and a side copy stream. (torch's intra-op thread count is
    process-wide: the pool sets it once, see ``pool.set_intra_threads``.)

    Worker ``worker`` gets the same two streams in every run of this process: cuBLAS keeps a
    workspace (65 MiB on an H100) for each stream it has run on until the process ends, so
    fresh streams per run would leave one more workspace allocated after every in-process
    ``train()`` (learning-rate search, ensembles, notebooks).
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
        with _streams_lock:
            key = (device.index, worker)
            if key not in _streams:
                _streams[key] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
            _local.compute, _local.copy = _streams[key]
        torch.cuda.set_stream(_local.compute)


_local = threading.local()
_streams: dict[tuple[int, int], tuple] = {}  # (device index, worker) → (compute, copy)
_streams_lock = threading.Lock()


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host tensor (pinned on CUDA) → ``device`` without blocking the host.

    On CUDA the copy runs on the worker's side stream, so the copy of this task overlaps
    the kernels of the previous task still running on the compute stream; the compute
    stream then waits for the copy (a device-side wait, not a host one)."""
    if device.type != "cuda":
        return t.to(device)
    copy = getattr(_local, "copy", None)
    if copy is None:  # a thread that did not run worker_start (tests, evaluation)
        return t.to(device, non_blocking=True)
    compute = torch.cuda.current_stream(device)
    with torch.cuda.stream(copy):
        out = t.to(device, non_blocking=True)
    compute.wait_stream(copy)
    out.record_stream(compute)  # allocated on the copy stream, used on the compute stream
    return out


class Fence:
    """An ordering point between streams: ``mark()`` on the producing stream, ``wait()`` on
    the consuming one. No host wait; on CPU both are no-ops (one code path)."""

    def __init__(self, device: torch.device):
        self.event = torch.cuda.Event() if device.type == "cuda" else None

    def mark(self) -> "Fence":
        if self.event is not None:
            self.event.record()
        return self

    def wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    @staticmethod
    def wait_all(fences):
        """The current stream waits for every fence in ``fences`` (None entries skipped)."""
        for f in fences:
            if f is not None:
                f.wait()


class LossScaler:
    """Dynamic loss scaling for fp16, kept on the device and driven by our flat gradient.

    The workers multiply the loss by ``scale`` before the backward (small fp16 gradients
    would underflow otherwise); the flat, reduced gradient is divided by it (folded into the
    normalisation, see ``FlatGrad.normalize_and_clip``); ``update(finite)`` then halves the
    scale after an Inf/NaN step (that step is skipped) and doubles it after ``interval``
    finite steps in a row. Every operation is a tensor op: no host read. Disabled (scale 1,
    no updates) for fp32 and bf16, whose range does not need it. The initial scale is lower
    than the usual 2^16 because our loss is a sum over the batch (larger gradients).
    """

    def __init__(self, device: torch.device, enabled: bool, init: float = 2.0 ** 10,
                 growth: float = 2.0, backoff: float = 0.5, interval: int = 2000):
        self.enabled, self.growth, self.backoff, self.interval = enabled, growth, backoff, interval
        self.scale = torch.full((), init if enabled else 1.0, dtype=torch.float32, device=device)
        self.good = torch.zeros((), dtype=torch.int64, device=device)  # finite steps in a row

    def update(self, finite: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """finite: 0-dim bool tensor (this step's gradient and loss finite); loss: the
        step's loss sum. → 0-dim bool tensor: True when the step was skipped only because
        the scaled gradient overflowed while the scale could still back off (a normal fp16
        event, not a failing run: such steps do not count towards train.max_bad_steps).
        """
        if not self.enabled:
            return torch.zeros_like(finite)
        tolerated = ~finite & torch.isfinite(loss) & (self.scale > 1.0)
        good = torch.where(finite, self.good + 1, torch.zeros_like(self.good))
        grow = good >= self.interval
        self.scale.copy_(torch.where(finite, torch.where(grow, self.scale * self.growth,
                                                         self.scale),
                                     (self.scale * self.backoff).clamp(min=1.0)))
        self.good.copy_(torch.where(grow, torch.zeros_like(good), good))
        return tolerated

    def state_dict(self) -> dict:
        return {"scale": float(self.scale), "good": int(self.good)}

    def load_state_dict(self, d: dict):
        self.scale.fill_(d["scale"])
        self.good.fill_(d["good"])


def masked_step(opt: torch.optim.Optimizer, finite: torch.Tensor):
    """``opt.step()`` unless ``finite`` (0-dim bool tensor) is False.

    A fused optimizer (``fused=True``, as the trainer builds it) takes the flag on the device
    (``found_inf``: the kernel leaves weights, moments and step count untouched), so no
    host read happens. Other optimizers read the flag on the host, which is free on CPU.
    (A run resumed from a checkpoint of an unfused optimizer, say one written before the
    CPU update was fused, takes the saved groups' ``fused = None`` and so the host path:
    correct, one read per step, and the same update as the run it continues.)
    """
    if all(g.get("fused") for g in opt.param_groups):
        opt.found_inf = (~finite).to(torch.float32)
        try:
            opt.step()
        finally:
            del opt.found_inf
    elif bool(finite):
        opt.step()


class NanGuard:
    """Counts skipped (NaN/Inf) steps on the device; ``read()`` at host intervals returns
    (skipped since the last read, longest run of consecutive skipped steps since then)."""

    def __init__(self, device: torch.device):
        z = lambda: torch.zeros((), dtype=torch.int64, device=device)  # noqa: E731
        self.run, self.worst, self.skipped = z(), z(), z()

    def add(self, finite: torch.Tensor):
        self.run.copy_(torch.where(finite, torch.zeros_like(self.run), self.run + 1))
        torch.maximum(self.worst, self.run, out=self.worst)
        self.skipped.add_((~finite).to(torch.int64))

    def read(self) -> tuple[int, int]:
        skipped, worst = torch.stack([self.skipped, self.worst]).tolist()
        self.skipped.zero_()
        self.worst.copy_(self.run)  # a run still going on carries over
        return skipped, worst
