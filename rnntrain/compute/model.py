"""The LSTM-CTC network: [conv front end,] frame stacking, stacked (bi)directional LSTM,
linear, log-softmax. The optional front end (``model.frontend = "conv"``) is in
``rnntrain.compute.conv``.

Shapes: T frames, N sequences, F input features, H hidden units per direction,
C = numLabels + 1 classes (blank last, as in RNNLIB), S target labels.

Layers are separate single-layer ``nn.LSTM`` modules rather than one multi-layer module so
that dropout between layers draws from a generator we pass in (one per task): the result
does not depend on which worker thread ran the task.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnntrain.compute import lstmscan


def stack_frames(x: torch.Tensor, lengths: torch.Tensor, k: int):
    """Stack k consecutive frames into one. x: (T, N, F) → (ceil(T/k), N, k*F).

    Lengths become ceil(len/k); the last, partial group is zero-padded.
    """
    if k == 1:
        return x, lengths
    t, n, f = x.shape
    pad = (-t) % k
    if pad:
        x = torch.cat([x, x.new_zeros(pad, n, f)])
    x = x.reshape((t + pad) // k, k, n, f).permute(0, 2, 1, 3).reshape((t + pad) // k, n, k * f)
    return x, (lengths + k - 1) // k


class PaddedGeometry:
    """What every layer of one zero-padded batch shares, computed once per forward rather
    than once per layer and direction: the valid-frame mask and the index that reverses
    each sequence within its own length. A worker holds the GIL for every small tensor op
    it dispatches, so each op saved here is time the other worker does not wait
    (docs/threads.md, "What two workers shared").

    t: padded length T, lengths: (N,) int64 on the CPU, device: where x lives.
    """

    def __init__(self, t: int, lengths: torch.Tensor, device: torch.device):
        self.device = device
        self.equal = bool((lengths == t).all())   # one fused call, nothing to mask
        src = lengths.unsqueeze(0) - 1 - torch.arange(t).unsqueeze(1)    # (T, N)
        self.valid = (src >= 0).unsqueeze(-1)     # (T, N, 1) bool: t < length
        src = src.clamp(min=0)
        # CPU: the source row of each output row in the (T*N, F) view, for one
        # index_select of whole rows (gather with a (T, N, F) index reads an int64 per
        # element: 3-9x slower forward and 2-4x backward on the default model's widths,
        # the same values; docs/threads.md, "The update and the reverse")
        self.rows = (src * len(lengths) + torch.arange(len(lengths))).reshape(-1) \
            if device.type == "cpu" else None                           # (T*N,)
        self.src = src.to(device).unsqueeze(-1)                         # (T, N, 1)
        self._masks: dict = {}
        self._index: dict = {}

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(T, N, 1) 1 on valid frames, 0 on padding, in ``dtype`` on the device."""
        m = self._masks.get(dtype)
        if m is None:
            m = self._masks[dtype] = self.valid.to(dtype).to(self.device)
        return m

    def index(self, width: int) -> torch.Tensor:
        """(T, N, width) source frame of each output frame of ``reverse``."""
        i = self._index.get(width)
        if i is None:
            i = self._index[width] = self.src.expand(-1, -1, width)
        return i

    def reverse(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, N, F) → each sequence reversed within its length, zero padding."""
        if self.rows is not None:
            t, n, f = x.shape
            y = x.reshape(t * n, f).index_select(0, self.rows).view(t, n, f)
        else:
            y = x.gather(0, self.index(x.shape[2]))
        return y * self.mask(x.dtype)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence within its own length; padding stays (zero) at the end.

    x: (T, N, F), lengths: (N,) → (T, N, F). Its own inverse on the valid frames.
    """
    return PaddedGeometry(x.shape[0], lengths, x.device).reverse(x)


def lstm_padded(rnn: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor,
                geom: PaddedGeometry | None = None) -> torch.Tensor:
    """A single-layer ``nn.LSTM`` over a zero-padded batch, exactly as with packing.

    On the CPU, PackedSequence input of unequal lengths falls back to a per-time-step
    implementation whose backward allocates and zero-fills a whole-input gradient at every
    step (O(T^2); docs/threads.md, "The CPU LSTM path"); padded input takes the fused
    oneDNN kernel. The forward direction is exact on padded input (padding comes after the
    frames); the backward direction runs on each sequence reversed within its length.
    x: (T, N, F) zero-padded, lengths: (N,) → (T, N, D*H), zero at padding. ``geom``: the
    batch's ``PaddedGeometry`` when the caller runs several layers over the same batch.
    """
    if geom is None:
        geom = PaddedGeometry(x.shape[0], lengths, x.device)
    if geom.equal:
        return rnn(x)[0]
    w = rnn._flat_weights
    per_dir = len(w) // (2 if rnn.bidirectional else 1)
    outs = []
    for d in range(2 if rnn.bidirectional else 1):
        xin = x if d == 0 else geom.reverse(x)
        y = torch._VF.lstm(xin, _zero_state(rnn, x), w[d * per_dir:(d + 1) * per_dir],
                           rnn.bias, 1, 0.0, rnn.training, False, False)[0]
        outs.append(y if d == 0 else geom.reverse(y))
    return torch.cat(outs, dim=-1) * geom.mask(x.dtype)


def _zero_state(rnn: nn.LSTM, x: torch.Tensor):
    h = x.new_zeros(1, x.shape[1], rnn.hidden_size)
    return h, h


class CTCModel(nn.Module):
    def __init__(self, input_size: int, num_labels: int, layers: int = 2, hidden: int = 128,
                 bidirectional: bool = True, subsample: int = 1, cell: str = "lstm",
                 dropout: float = 0.0, frontend: nn.Module | None = None, lstm: str = "scan"):
        super().__init__()
        # compute.lstm: the CPU's LSTM kernel ("scan" falls back to oneDNN where it cannot
        # run: bf16 autocast, no compiler); not a parameter, so not in the state_dict
        self.lstm = lstm
        self.input_size, self.num_classes, self.subsample = input_size, num_labels + 1, subsample
        self.dropout = dropout
        self.blank = num_labels
        self.frontend = frontend
        # frames in per frame out: the front end's width pooling, then frame stacking
        self.total_subsample = subsample * (frontend.subsample if frontend is not None else 1)
        dirs = 2 if bidirectional else 1
        self.rnn_input_size = frontend.output_size if frontend is not None else input_size
        size = self.rnn_input_size * subsample
        self.rnns = nn.ModuleList()
        for _ in range(layers):
            if cell == "lstm":
                self.rnns.append(nn.LSTM(size, hidden, bidirectional=bidirectional))
            else:
                from rnntrain.compute.peephole import PeepholeLSTM
                self.rnns.append(PeepholeLSTM(size, hidden, bidirectional=bidirectional))
            size = hidden * dirs
        self.out = nn.Linear(size, self.num_classes)

    def _scan(self, x: torch.Tensor) -> bool:
        """Whether this batch's LSTM layers run rnntrain's recurrence (``lstmscan``): chosen,
        fp32 or fp64 (under bf16 autocast oneDNN's bf16 kernels run), and compiled."""
        return self.lstm == "scan" and x.dtype in (torch.float32, torch.float64) \
            and not torch.is_autocast_enabled("cpu") and lstmscan.unavailable() is None

    def forward(self, x: torch.Tensor, lengths: torch.Tensor,
                generator: torch.Generator | None = None):
        """x: (T, N, F) zero-padded, lengths: (N,) int64 on CPU.

        Returns log-probabilities (T', N, C) and output lengths (N,) with
        T' = ceil(T / total_subsample).
        """
        if self.frontend is not None:
            x, lengths = self.frontend(x, lengths, generator)
        x, lengths = stack_frames(x, lengths, self.subsample)
        geom = None   # the CPU path's per-batch mask and reversal index, built once
        for i, rnn in enumerate(self.rnns):
            if i and self.dropout and self.training:
                keep = 1.0 - self.dropout
                mask = torch.empty(x.shape[1:], device="cpu").bernoulli_(keep, generator=generator)
                if x.device.type == "cuda":
                    mask = mask.pin_memory().to(x.device, non_blocking=True)
                x = x * (mask.to(x.device) / keep)  # one mask per sequence, shared over time
            if isinstance(rnn, nn.LSTM) and x.device.type == "cpu":
                if self._scan(x):
                    x = lstmscan.lstm_scan(rnn, x, lengths)
                else:
                    if geom is None:
                        geom = PaddedGeometry(x.shape[0], lengths, x.device)
                    x = lstm_padded(rnn, x, lengths, geom)
            elif hasattr(rnn, "forward_padded"):  # the peephole cell: padded in, padded out
                x = rnn.forward_padded(x, lengths)
            else:
                # lengths already longest-first (as the trainer collates them): pack
                # without the permutation, whose index copy to a GPU would block the host
                is_sorted = bool((lengths[:-1] >= lengths[1:]).all())
                packed = pack_padded_sequence(x, lengths, enforce_sorted=is_sorted)
                x, _ = pad_packed_sequence(rnn(packed)[0], total_length=x.shape[0])
        return F.log_softmax(self.out(x).float(), dim=-1), lengths


def estimate_params(mcfg, input_size: int, num_labels: int) -> int:
    """Parameters of ``build_model(mcfg, ...)`` from the config alone (no allocation):
    per layer and direction 4H(F+H) weights and 8H biases (peephole cell: 4H biases and
    3H peepholes), then the output layer. Equals count_params of the built model (tested)."""
    dirs = 2 if mcfg.bidirectional else 1
    # a conv front end changes the first layer's input: counted as 0 there (a lower bound;
    # the H x H recurrent weights, what makes a model too large, are exact)
    conv = getattr(mcfg, "frontend", "none") == "conv"
    size, n = (0 if conv else input_size * mcfg.subsample), 0
    for _ in range(mcfg.layers):
        # nn.LSTM: two bias vectors of 4H; the peephole cell: one, and 3H peepholes
        n += dirs * (4 * mcfg.hidden * (size + mcfg.hidden)
                     + (7 if mcfg.cell == "peephole" else 8) * mcfg.hidden)
        size = mcfg.hidden * dirs
    return n + size * (num_labels + 1) + num_labels + 1


def check_memory(mcfg, input_size: int, num_labels: int, copies: int, memory_bytes: int):
    """UserError when ``copies`` fp32 copies of the parameters (weights, gradients,
    optimizer moments, per-task gradient buffers) exceed ``memory_bytes``, naming the
    [model] key that makes it large; before torch is asked to allocate it (a RuntimeError
    traceback, or the OOM killer)."""
    n = estimate_params(mcfg, input_size, num_labels)
    need = n * 4 * copies
    if need <= memory_bytes:
        return
    from rnntrain.errors import ConfigError
    key = "model.hidden" if mcfg.hidden * mcfg.hidden >= mcfg.hidden * input_size \
        * mcfg.subsample else "model.subsample"
    if mcfg.layers > 64:
        key = "model.layers"
    val = {"model.hidden": mcfg.hidden, "model.subsample": mcfg.subsample,
           "model.layers": mcfg.layers}[key]
    raise ConfigError(f"{key} = {val}: the model would have {n:.3g} parameters, about "
                      f"{need / 2**30:,.1f} GiB as {copies} fp32 copies (weights, gradients, "
                      f"optimizer state, task buffers), more than the "
                      f"{memory_bytes / 2**30:,.1f} GiB of memory here")


def build_model(mcfg, input_size: int, num_labels: int, height: int = 1,
                lstm: str = "scan") -> CTCModel:
    """input_size: values per input frame; height: pixels per column when frames are image
    columns (``Dataset.frame_height``; input_size = height × channels); lstm: the CPU's
    LSTM kernel (``compute.lstm``)."""
    frontend = None
    if getattr(mcfg, "frontend", "none") == "conv":
        from rnntrain.compute.conv import ConvFrontEnd
        assert input_size % height == 0, (input_size, height)
        frontend = ConvFrontEnd(input_size // height, height, list(mcfg.conv_channels),
                                mcfg.conv_kernel, list(mcfg.conv_pool_h),
                                list(mcfg.conv_pool_w), mcfg.conv_norm, mcfg.conv_dropout)
    return CTCModel(input_size, num_labels, mcfg.layers, mcfg.hidden, mcfg.bidirectional,
                    mcfg.subsample, mcfg.cell, mcfg.dropout, frontend, lstm)


def total_subsample(mcfg) -> int:
    """Input frames per output frame of a model built from ``mcfg``: frame stacking times
    the conv front end's width pooling (CTC feasibility is checked against this)."""
    k = mcfg.subsample
    if getattr(mcfg, "frontend", "none") == "conv":
        k *= math.prod(mcfg.conv_pool_w)
    return k


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def training_flops_per_frame(input_size, hidden, layers, bidirectional, num_classes) -> float:
    """Useful multiply-adds ×2 ×3 (forward + backward ≈ 3× forward) per input frame."""
    dirs = 2 if bidirectional else 1
    macs, size = 0, input_size
    for _ in range(layers):
        macs += dirs * 4 * hidden * (size + hidden)
        size = hidden * dirs
    macs += size * num_classes
    return 2.0 * 3.0 * macs


def ctc_loss_sum(log_probs: torch.Tensor, out_lengths: torch.Tensor, targets: list,
                 blank: int) -> torch.Tensor:
    """Summed CTC loss (nats) over the batch, computed in fp32.

    log_probs: (T', N, C); out_lengths: (N,); targets: N int sequences (infeasible ones
    must have been filtered: see ``rnntrain.data.dataset.min_frames``).
    """
    tl = torch.tensor([len(t) for t in targets], dtype=torch.long)
    # one numpy concatenation and one tensor, not one tensor per sequence: a worker holds
    # the GIL for each (docs/threads.md, "What two workers shared")
    flat = torch.from_numpy(np.concatenate(targets).astype(np.int64, copy=False)) \
        if int(tl.sum()) else torch.zeros(0, dtype=torch.long)
    dev = log_probs.device
    if dev.type == "cuda":  # the lengths stay on the host: ctc_loss reads them there
        flat = flat.pin_memory().to(dev, non_blocking=True)
    return F.ctc_loss(log_probs.float(), flat, out_lengths, tl, blank=blank,
                      reduction="sum", zero_infinity=False)


def init_uniform(model: nn.Module, scale: float = 0.1, generator=None):
    """RNNLIB's initialisation: every weight uniform in [-scale, scale]."""
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-scale, scale, generator=generator)


def init_blank_bias(model: CTCModel, bias: float):
    """Add ``bias`` to the output layer's blank bias (``model.blank_bias``): the network
    starts out predicting mostly blank, the CTC solution's frame majority, instead of
    learning it in its first steps. 0 leaves the weights untouched."""
    if bias:
        with torch.no_grad():
            model.out.bias[model.blank] += bias


def flatten_params(params) -> np.ndarray:
    """The parameters as one float32 host vector (a copy), in ``params`` order."""
    return torch.cat([p.detach().reshape(-1).float().cpu() for p in params]).numpy()


def unflatten_params(vec: np.ndarray, params):
    """Copy a vector made by ``flatten_params`` back into ``params`` (on their device)."""
    off = 0
    with torch.no_grad():
        for p in params:
            p.copy_(torch.from_numpy(vec[off: off + p.numel()]).view_as(p))
            off += p.numel()
