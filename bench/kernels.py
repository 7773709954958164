"""LSTM kernel experiments: what could beat oneDNN's LSTM for our task shapes.

One BLSTM layer of the reference model (256 per direction, input 512 = the layer below's
output, the layer that costs most) on one task of N sequences of about T frames, forward +
backward on one thread, as a worker computes it. Variants, each checked against the
baseline's output and input gradient before it is timed:

- **baseline**: oneDNN (``compute.lstm = "onednn"``, ``model.lstm_padded``): one oneDNN
  call per direction, the backward direction on each sequence reversed within its length,
  padding masked.
- **rnntrain's recurrence** (``compute.lstm = "scan"``, the default: ``compute.lstmscan``):
  the input GEMM and the weight gradients by torch, the recurrence compiled, both
  directions in one call.
- **one call, both directions**: ``nn.LSTM(bidirectional=True)`` in one call. Exact only
  when all lengths are equal (its backward direction starts at the padded end), so it is
  timed on equal lengths: the most that merging the two calls could give.
- **hand-written, one input GEMM**: the input products of all time steps and both
  directions in one (T·N, F) x (F, 8H) GEMM, then a per-time-step loop of the recurrent
  products for both directions at once (a block-diagonal batch of two) and the gate math,
  differentiated by autograd.
- **hand-written, input GEMM in bf16**: the same with that one large GEMM in bf16
  (operands rounded, fp32 accumulate), everything else fp32.
- **batching small tasks**: the baseline at several N (sequences per task): what running
  several small tasks' recurrent steps as one batch would gain per frame.

Times are the best of several rounds, variants interleaved round by round so that a change
in machine load hits all alike. This task keeps one shape, so oneDNN finds its primitive
in its cache from the second call on; training gives every task a new shape. So a second
table runs both kernels as training does: the default model's two BLSTM layers (2x128, 20
inputs) on the task shapes of the default config's plan (N sequences of T frames, the
median and the ends of its range), a new T at every call, each kernel's median over the
calls. Run alone: ``python -m bench.kernels [--quick]``.
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn as nn

from bench import workloads as wl
from rnntrain.compute.model import lstm_padded

H, F = 256, 512


def handwritten(rnn: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor,
                bf16_input_gemm: bool = False) -> torch.Tensor:
    """The BLSTM layer with one input GEMM for all steps and both directions.

    x: (T, N, F) zero-padded, lengths: (N,) → (T, N, 2H), zero at padding; the backward
    direction runs on each sequence reversed within its length (as ``lstm_padded``).
    """
    from rnntrain.compute.model import reverse_padded
    t, n, _ = x.shape
    w_ih = torch.cat([rnn.weight_ih_l0, rnn.weight_ih_l0_reverse])            # (8H, F)
    b = torch.cat([rnn.bias_ih_l0 + rnn.bias_hh_l0,
                   rnn.bias_ih_l0_reverse + rnn.bias_hh_l0_reverse])           # (8H,)
    w_hh = torch.stack([rnn.weight_hh_l0, rnn.weight_hh_l0_reverse])          # (2, 4H, H)
    xs = torch.stack([x, reverse_padded(x, lengths)])                         # (2, T, N, F)
    if bf16_input_gemm:
        xin = torch.cat([xs[0].reshape(t * n, -1).bfloat16() @ w_ih[:4 * H].bfloat16().t(),
                         xs[1].reshape(t * n, -1).bfloat16() @ w_ih[4 * H:].bfloat16().t()],
                        dim=1).float()
    else:
        xin = torch.cat([xs[0].reshape(t * n, -1) @ w_ih[:4 * H].t(),
                         xs[1].reshape(t * n, -1) @ w_ih[4 * H:].t()], dim=1)
    g_in = (xin + b).view(t, n, 2, 4 * H).permute(0, 2, 1, 3)                 # (T, 2, N, 4H)
    h = x.new_zeros(2, n, H)
    c = x.new_zeros(2, n, H)
    outs = []
    for s in range(t):
        g = g_in[s] + torch.bmm(h, w_hh.transpose(1, 2))                      # (2, N, 4H)
        i, f, gg, o = g.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    y = torch.stack(outs)                                                      # (T, 2, N, H)
    mask = (torch.arange(t).unsqueeze(1) < lengths.unsqueeze(0)).unsqueeze(-1).to(x.dtype)
    return torch.cat([y[:, 0], reverse_padded(y[:, 1], lengths)], dim=-1) * mask


def _task(n: int, t: int, equal: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if equal:
        lengths = torch.full((n,), t, dtype=torch.long)
    else:  # a length-grouped task: lengths within about 10 % of the longest
        lengths = torch.sort(torch.randint(int(t * 0.9), t + 1, (n,), generator=g),
                             descending=True).values
        lengths[0] = t
    x = torch.randn(t, n, F, generator=g)
    x = x * (torch.arange(t).unsqueeze(1) < lengths.unsqueeze(0)).unsqueeze(-1)
    return x, lengths


def _step(fn, x, lengths) -> float:
    """Forward + backward of fn on x (input gradient too, as a layer above the first)."""
    x = x.clone().requires_grad_(True)
    t0 = time.perf_counter()
    y = fn(x, lengths)
    y.square().sum().backward()
    return time.perf_counter() - t0


def _check(rnn, x, lengths, fn, tol) -> float:
    """Largest relative difference of output and input gradient against the baseline."""
    out = []
    for f in (lambda a, b: lstm_padded(rnn, a, b), fn):
        xx = x.clone().requires_grad_(True)
        rnn.zero_grad()
        y = f(xx, lengths)
        y.square().sum().backward()
        out.append((y.detach(), xx.grad))
    rel = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
              for a, b in zip(out[0], out[1]))
    assert rel < tol, f"variant differs from the baseline: {rel:.2e}"
    return rel


# (N, T) of the default config's tasks (configs/default.toml, 2000 sequences of the synthetic
# task, one worker: 10th/50th/90th percentiles N 9/46/85, T 26/64/153), and two halves
TRAINING_SHAPES = ((9, 150), (23, 64), (46, 64), (46, 32), (85, 26))


def training_shapes(quick: bool) -> list[str]:
    """The default model's two layers under both kernels, each call a new shape."""
    from rnntrain.compute import lstmscan
    from rnntrain.compute.model import PaddedGeometry
    if lstmscan.unavailable() is not None:
        return [f"rnntrain's recurrence unavailable ({lstmscan.unavailable()}): not measured.", ""]
    torch.manual_seed(0)
    l1, l2 = nn.LSTM(20, 128, bidirectional=True), nn.LSTM(256, 128, bidirectional=True)

    def two_layers(kind, x, lengths):
        if kind == "scan":
            return lstmscan.lstm_scan(l2, lstmscan.lstm_scan(l1, x, lengths), lengths)
        g = PaddedGeometry(x.shape[0], lengths, x.device)
        return lstm_padded(l2, lstm_padded(l1, x, lengths, g), lengths, g)

    calls = 4 if quick else 15
    lines = ["| task (N x T) | oneDNN ms | rnntrain's recurrence ms | speed-up |",
             "|---|---:|---:|---:|"]
    tot = {"onednn": 0.0, "scan": 0.0}
    for n, t in TRAINING_SHAPES[:2] if quick else TRAINING_SHAPES:
        times = {"onednn": [], "scan": []}
        for c in range(calls + 2):
            tt = t + c                                   # a new shape every call
            lengths = torch.full((n,), tt)
            lengths[n // 2:] = tt - 2
            x = torch.randn(tt, n, 20) * (torch.arange(tt)[:, None] < lengths).unsqueeze(-1)
            for kind in times:                           # interleaved
                times[kind].append(_step(lambda a, b: two_layers(kind, a, b), x, lengths))
        med = {k: sorted(v[2:])[len(v[2:]) // 2] * 1e3 for k, v in times.items()}
        for k in tot:
            tot[k] += med[k]
        lines.append(f"| {n} x {t} | {med['onednn']:.1f} | {med['scan']:.1f} | "
                     f"{med['onednn'] / med['scan']:.2f}x |")
    lines.append(f"| all | {tot['onednn']:.1f} | {tot['scan']:.1f} | "
                 f"{tot['onednn'] / tot['scan']:.2f}x |")
    return lines + [""]


def run(quick: bool = False) -> str:
    from rnntrain.compute import lstmscan
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rnn = nn.LSTM(F, H, bidirectional=True)
    n, t = (8, 60) if quick else (20, 300)
    rounds = 2 if quick else 5
    x, lengths = _task(n, t, equal=False)
    xe, le = _task(n, t, equal=True)
    base = lambda a, b: lstm_padded(rnn, a, b)                      # noqa: E731
    variants = {
        "baseline (oneDNN: one call per direction)": (base, x, lengths, None),
        "one call, both directions (equal lengths only)": (lambda a, b: rnn(a)[0], xe, le, None),
        "hand-written, one input GEMM (fp32)": (lambda a, b: handwritten(rnn, a, b), x, lengths,
                                                1e-4),
        "hand-written, input GEMM in bf16": (lambda a, b: handwritten(rnn, a, b, True), x,
                                             lengths, 5e-2),
    }
    if lstmscan.unavailable() is None:
        variants["rnntrain's recurrence (compute.lstm = \"scan\", the default)"] = (
            lambda a, b: lstmscan.lstm_scan(rnn, a, b), x, lengths, 1e-4)
    diffs = {}
    for name, (fn, xx, ll, tol) in variants.items():
        if tol is not None:
            diffs[name] = _check(rnn, xx, ll, fn, tol)
    ns = [max(1, n // 4), n // 2, n, 2 * n]
    tasks_n = {k: _task(k, t, equal=False, seed=k) for k in ns}
    best = {name: float("inf") for name in variants}
    best_n = {k: float("inf") for k in ns}
    for _ in range(rounds):  # interleaved: a change in load hits every variant alike
        for name, (fn, xx, ll, _) in variants.items():
            best[name] = min(best[name], _step(fn, xx, ll))
        for k, (xx, ll) in tasks_n.items():
            best_n[k] = min(best_n[k], _step(base, xx, ll))
    frames = float(lengths.sum())
    m = wl.machine()
    lines = ["## LSTM kernel experiments (one BLSTM layer, one thread)", "",
             f"`python -m bench.kernels` on {m['cpu']}, torch {m['torch']}. "
             f"One BLSTM layer of the reference model (input {F}, {H} per direction), one task "
             f"of N={n} sequences of {int(lengths.min())}-{t} frames, forward + backward (with "
             f"the input gradient) on one thread; best of {rounds} interleaved rounds.", "",
             "| variant | frames/s | vs baseline | max rel. diff vs baseline |",
             "|---|---:|---:|---:|"]
    b0 = frames / best[next(iter(variants))]
    for name, s in best.items():
        fr = float(variants[name][2].sum()) / s
        d = f"{diffs[name]:.1e}" if name in diffs else ("-" if name.startswith("baseline")
                                                        else "equal lengths, not comparable")
        lines.append(f"| {name} | {fr:,.0f} | {fr / b0:.2f}x | {d} |")
    lines += ["", "Training's shapes: the default model's two BLSTM layers (2x128, 20 inputs), "
              "forward + backward, one thread, on tasks of N sequences of about T frames (half "
              "of them 2 shorter), a new T at every call as in training (oneDNN builds a new "
              "primitive per shape), median of "
              f"{4 if quick else 15} calls, the kernels interleaved:", ""]
    lines += training_shapes(quick)
    lines += ["Batching small tasks (baseline kernel, N sequences per task, same T):", "",
              "| N | frames/s | vs N=" + str(n) + " |", "|---:|---:|---:|"]
    ref = float(tasks_n[n][1].sum()) / best_n[n]
    for k in ns:
        fr = float(tasks_n[k][1].sum()) / best_n[k]
        lines.append(f"| {k} | {fr:,.0f} | {fr / ref:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(run(quick="--quick" in sys.argv))
