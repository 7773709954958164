"""rnntrain's own LSTM recurrence for the CPU (``compute.lstm = "scan"``).

oneDNN's LSTM kernel, which ``nn.LSTM`` runs on a CPU, pays a fixed cost per call (a new
primitive for every new shape: ~0.1-0.2 ms each for the forward and the backward of every
layer and direction) and per time step, whatever the batch width (docs/threads.md, "Why
half a batch costs more than half"). Our tasks are small and every one has a new shape.
This module runs the recurrence itself (``_lstmscan.cpp``): both directions of a layer in
one call, the backward direction over each sequence reversed within its own length
directly (no reversal copies), with the input projections and the weight gradients as
single torch GEMMs around it.

    xg = x W_ih^T + b_ih + b_hh          (T*N, F) @ (F, D*4H): torch, autograd as usual
    h  = scan(xg, W_hh, lengths)         _Scan: the C++ loop, forward and backward
    dW_hh = sum_t dg_t^T h_{t-1}         one GEMM per direction after the backward loop

Same maths as ``nn.LSTM``: gate order i, f, g, o; zero initial state; output zero at
padding. The sums run in another order than oneDNN's, so weights differ from the oneDNN
path's in the last bits (tests/test_lstmscan.py: float64 agrees to 1e-12) — but each call
is single-threaded and sums in a fixed order, so a run is as deterministic as before.

The wheel stays pure Python: the source is compiled on first use with the system's C++
compiler (``$CXX``, else ``c++``, ``-O3 -march=native``: the machine's own vector width)
into ``cpucache.cache_dir()``, under a name keyed by the source, the compiler and the
CPU's model and flags (a home folder shared by different machines gets one library each),
written atomically; a new build removes the other ``_lstmscan-*.so`` there unused for 30 days
(``cpucache.prune``). Shapes: T frames, N sequences, F inputs, H cells, D directions, G = 4H.
"""
from __future__ import annotations

import ctypes
import subprocess
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("_lstmscan.cpp")
_lib: ctypes.CDLL | None = None
_why: str | None = None
_lock = threading.Lock()


def _cpu_id() -> str:
    """The CPU's model name and flags (what ``-march=native`` compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        import platform
        return platform.processor() or platform.machine()
    keep = [ln for ln in text.splitlines()[:40]
            if ln.startswith(("vendor_id", "cpu family", "model", "flags"))]
    return "\n".join(keep)


def build() -> Path:
    """The compiled library for this compiler and CPU, built now unless already cached
    (``cpucache.compile_library``). Raises OSError (no compiler) or RuntimeError (the build
    failed, its first error line)."""
    from rnntrain.compute.cpucache import compile_library
    return compile_library("_lstmscan", SOURCE, ["-O3", "-march=native", "-shared", "-fPIC",
                                                 "-std=c++17"], key=(_cpu_id(),))


def unavailable() -> str | None:
    """None when the compiled recurrence is loaded (built on first call), else why not."""
    global _lib, _why
    if _lib is not None:   # every layer of every task asks: no lock once loaded
        return None
    with _lock:
        if _lib is None and _why is None:
            try:
                lib = ctypes.CDLL(str(build()))
                for name in ("forward", "backward"):
                    for sfx in ("f32", "f64"):
                        fn = getattr(lib, f"rnntrain_lstm_{name}_{sfx}")
                        fn.restype = ctypes.c_int
                _lib = lib
            except FileNotFoundError:
                from rnntrain.compute.cpucache import _compiler
                _why = f"no C++ compiler ({' '.join(_compiler())} not found; set CXX)"
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
                _why = (str(e).splitlines() or [type(e).__name__])[0]
        return _why


def note(choice: str, device_type: str = "cpu", precision: str = "fp32") -> str:
    """The run log's line on which LSTM kernel runs (builds the library if need be)."""
    if device_type != "cpu":
        return f"lstm: cuDNN's kernel on {device_type}"
    if choice != "scan":
        return f'lstm: oneDNN\'s kernel (compute.lstm = "{choice}")'
    why = unavailable()
    if why is not None:
        return f"lstm: oneDNN's kernel, rnntrain's recurrence is unavailable ({why})"
    text = f"lstm: rnntrain's compiled recurrence ({Path(_lib._name).name})"
    if precision != "fp32":
        text += f"; in bf16 steps oneDNN's bf16 kernels (precision {precision})"
    return text


def _p(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


class _Scan(torch.autograd.Function):
    """xg (T, N, D*G) input projections with biases, R (D, G, H) recurrent weights,
    lengths (N,) int64 → h (T, N, D*H), zero at padding."""

    @staticmethod
    def forward(ctx, xg, R, lengths):
        T, N, _ = xg.shape
        D, G, H = R.shape
        sfx = _SUFFIX[xg.dtype]
        xg = xg.contiguous()
        out, cst, tcs = (xg.new_empty(T, N, D * H) for _ in range(3))
        act = xg.new_empty(T, N, D * G)
        rc = getattr(_lib, f"rnntrain_lstm_forward_{sfx}")(
            T, N, D, H, _p(lengths), _p(xg), _p(R.contiguous()), _p(out), _p(act), _p(cst), _p(tcs))
        assert rc == 0, rc
        ctx.save_for_backward(R, lengths, act, cst, tcs, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        R, lengths, act, cst, tcs, out = ctx.saved_tensors
        D, G, H = R.shape
        T, N, _ = act.shape
        dout = dout.contiguous()
        dg = act.new_empty(T, N, D * G)
        rc = getattr(_lib, f"rnntrain_lstm_backward_{_SUFFIX[act.dtype]}")(
            T, N, D, H, _p(lengths), _p(R.contiguous()), _p(dout), _p(act), _p(cst), _p(tcs),
            _p(dg))
        assert rc == 0, rc
        dR = None
        if ctx.needs_input_grad[1]:
            # dR[d] = sum over t of dg_t^T h_(t-1), h_(t-1) the state the step at t started
            # from: out one frame earlier (forward direction) or later (backward direction:
            # zero past a sequence's end, where out is zero padding). Strided views: a GEMM
            # of (G, (T-1)*N) by ((T-1)*N, H) per direction, no copies.
            dR = torch.stack([
                (dg[1:] if d == 0 else dg[:-1]).reshape((T - 1) * N, D * G)[:, d * G:(d + 1) * G].t()
                @ (out[:-1] if d == 0 else out[1:]).reshape((T - 1) * N, D * H)[:, d * H:(d + 1) * H]
                for d in range(D)])
        return dg, dR, None


def lstm_scan(rnn: torch.nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A single-layer ``nn.LSTM`` (1 or 2 directions) over a zero-padded CPU batch.
    x: (T, N, F) float32/float64, lengths: (N,) int64 → (T, N, D*H), zero at padding.
    ``unavailable()`` must have returned None."""
    assert _lib is not None and rnn.num_layers == 1 and not rnn.batch_first \
        and rnn.proj_size == 0, "lstm_scan: a loaded library and a single-layer LSTM"
    T, N, F = x.shape
    D = 2 if rnn.bidirectional else 1
    w = rnn._flat_weights
    k = len(w) // D
    lengths = lengths.to(torch.int64).contiguous()
    assert int(lengths.max()) <= T and int(lengths.min()) >= 0, "lengths beyond the batch"
    W = torch.cat([w[d * k] for d in range(D)]) if D > 1 else w[0]            # (D*G, F)
    R = torch.stack([w[d * k + 1] for d in range(D)])                         # (D, G, H)
    x2 = x.reshape(T * N, F)
    if rnn.bias:
        b = torch.cat([w[d * k + 2] + w[d * k + 3] for d in range(D)])        # (D*G,)
        xg = torch.addmm(b, x2, W.t())
    else:
        xg = x2 @ W.t()
    return _Scan.apply(xg.view(T, N, -1), R, lengths)
