"""The network as a plain graph for export: the same weights and math as ``CTCModel``
without its data-dependent branches, packing or private LSTM entry points.

``CTCModel.forward`` chooses between a fused call and masking by looking at the lengths,
calls ``torch._VF.lstm`` on ``_flat_weights`` and reverses sequences with a data-dependent
index: fast for training, but neither ``torch.jit.script`` nor the ONNX exporter can
follow it. Here every layer always takes the same path: the forward direction is a
one-direction ``nn.LSTM`` on the padded batch (exact on the valid frames: the padding comes
after them), the backward direction the same on each sequence reversed within its own
length by an index (``gather``), and the output is zeroed past each sequence's end, as in
training. The result equals ``CTCModel``'s on every valid frame (checked by
``rnntrain.infer.export.check``).

The convolutional front end (``compute.conv``) exports as it runs in eval mode: the same
masking (padded columns zero before each convolution, excluded from the group-norm
statistics, -inf inside max pooling) and output lengths ceil(T / pool) per block, so each
image's outputs are its own whatever the batch.

Shapes: x (T, N, F) zero-padded float32, lengths (N,) int64 → log-probabilities (T', N, C)
and output lengths (N,), T' = ceil(T / subsample) (times the conv front end's width
pooling), C = labels + 1 (blank last). Image models: F = pixels per column (H·C).
"""
from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def _copy_direction(rnn: nn.LSTM, suffix: str) -> nn.LSTM:
    """A one-direction nn.LSTM holding direction ``suffix`` ("" or "_reverse") of ``rnn``."""
    one = nn.LSTM(rnn.input_size, rnn.hidden_size)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(one, f"{name}_l0").copy_(getattr(rnn, f"{name}_l0{suffix}"))
    return one


class UniLSTM(nn.Module):
    """One forward-direction nn.LSTM layer. x: (T, N, F) → (T, N, H), zero at padding."""

    def __init__(self, rnn: nn.LSTM):
        super().__init__()
        self.fwd = _copy_direction(rnn, "")

    def forward(self, x: torch.Tensor, rev: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fwd(x)[0] * mask


class BiLSTM(nn.Module):
    """A bidirectional nn.LSTM layer as two one-direction ones. → (T, N, 2H)."""

    def __init__(self, rnn: nn.LSTM):
        super().__init__()
        self.fwd = _copy_direction(rnn, "")
        self.bwd = _copy_direction(rnn, "_reverse")

    def forward(self, x: torch.Tensor, rev: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        yf = self.fwd(x)[0]
        xr = x.gather(0, rev.unsqueeze(2).expand(-1, -1, x.shape[2]))
        yb = self.bwd(xr)[0]
        yb = yb.gather(0, rev.unsqueeze(2).expand(-1, -1, yb.shape[2]))
        return torch.cat([yf, yb], dim=2) * mask


class PeepholeLayer(nn.Module):
    """RNNLIB's peephole cell (``compute.peephole``), forward only, as a time loop that
    TorchScript compiles (ONNX cannot express it with a variable length: see export).

    Gate order [i, f, g, o]; i, f peep at c_{t-1}, o at c_t; h_{-1} = c_{-1} = 0.
    """

    def __init__(self, cell):
        super().__init__()
        self.D = 2 if cell.bidirectional else 1
        self.H = cell.hidden_size
        with torch.no_grad():
            self.weight_ih = nn.Parameter(cell.weight_ih.detach().clone())   # (D*4H, F)
            self.bias = nn.Parameter(cell.bias.detach().clone())             # (D*4H,)
            self.weight_hh = nn.Parameter(cell.weight_hh.detach().clone())   # (D, 4H, H)
            self.peephole = nn.Parameter(cell.peephole.detach().clone())     # (D, 3, H)

    def forward(self, x: torch.Tensor, rev: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        T, N = x.shape[0], x.shape[1]
        H = self.H
        xg = torch.addmm(self.bias, x.reshape(T * N, x.shape[2]), self.weight_ih.t())
        xg = xg.view(T, N, self.D, 4 * H)
        outs: List[torch.Tensor] = []
        for d in range(self.D):
            g = xg[:, :, d]
            if d == 1:
                g = g.gather(0, rev.unsqueeze(2).expand(-1, -1, 4 * H))
            rt = self.weight_hh[d].t()
            p_i, p_f, p_o = self.peephole[d, 0], self.peephole[d, 1], self.peephole[d, 2]
            h = x.new_zeros(N, H)
            c = x.new_zeros(N, H)
            hs: List[torch.Tensor] = []
            for t in range(T):
                a = torch.addmm(g[t], h, rt)
                i = torch.sigmoid(a[:, 0:H] + p_i * c)
                f = torch.sigmoid(a[:, H:2 * H] + p_f * c)
                c = f * c + i * torch.tanh(a[:, 2 * H:3 * H])
                o = torch.sigmoid(a[:, 3 * H:] + p_o * c)
                h = o * torch.tanh(c)
                hs.append(h)
            y = torch.stack(hs)
            if d == 1:
                y = y.gather(0, rev.unsqueeze(2).expand(-1, -1, H))
            outs.append(y)
        return torch.cat(outs, dim=2) * mask


class ExportNorm(nn.Module):
    """``conv.MaskedGroupNorm``: statistics over each image's valid columns only."""

    def __init__(self, norm):
        super().__init__()
        self.groups: int = int(norm.groups)
        self.eps: float = float(norm.eps)
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.bias = nn.Parameter(norm.bias.detach().clone())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, c, h, t = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
        g = self.groups
        xf = x.reshape(n, g, c // g, h, t)
        m = mask.reshape(n, 1, 1, 1, t).to(xf.dtype)
        count = (m.sum(dim=(2, 3, 4), keepdim=True) * float((c // g) * h)).clamp(min=1.0)
        mean = (xf * m).sum(dim=(2, 3, 4), keepdim=True) / count
        var = (((xf - mean) * m) ** 2).sum(dim=(2, 3, 4), keepdim=True) / count
        y = ((xf - mean) * torch.rsqrt(var + self.eps)).reshape(n, c, h, t)
        return y * self.weight.reshape(1, c, 1, 1) + self.bias.reshape(1, c, 1, 1)


class NoNorm(nn.Module):
    """``conv_norm = "none"`` (TorchScript compiles both branches of the norm call)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x


class NoConv(nn.Module):
    """No convolutional front end: frames go to the LSTM layers as they are."""

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return x, lengths


class ExportConvBlock(nn.Module):
    """``conv.ConvBlock`` in eval mode (no channel dropout): conv → norm → ReLU → masked
    max pooling (ceil mode) → padded columns zeroed."""

    def __init__(self, blk):
        super().__init__()
        self.conv = blk.conv
        self.has_norm: bool = blk.norm is not None
        self.norm = ExportNorm(blk.norm) if blk.norm is not None else NoNorm()
        self.ph: int = int(blk.pool[0])
        self.pw: int = int(blk.pool[1])

    def forward(self, x: torch.Tensor, lengths: torch.Tensor,
                mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.conv(x)
        if self.has_norm:
            y = self.norm(y, mask)
        y = F.relu(y)
        if self.ph > 1 or self.pw > 1:
            # -inf on padded columns: a pooling window that straddles an image's end sees
            # only its valid columns, as for the image alone
            y = y.masked_fill(mask.logical_not(), float("-inf"))
            y = F.max_pool2d(y, [self.ph, self.pw], [self.ph, self.pw], [0, 0], [1, 1], True)
            lengths = torch.div(lengths + (self.pw - 1), self.pw, rounding_mode="floor")
            mask = _column_mask(lengths, y.shape[3])
        return y.masked_fill(mask.logical_not(), 0.0), lengths, mask


def _column_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """(N,) lengths → (N, 1, 1, T) bool, True on valid columns (``conv.column_mask``)."""
    m = torch.arange(t, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)
    return m.unsqueeze(1).unsqueeze(1)


class ExportConv(nn.Module):
    """``conv.ConvFrontEnd`` for export: (T, N, H·C) column frames → (T', N, C'·H')."""

    def __init__(self, fe):
        super().__init__()
        self.height: int = int(fe.height)
        self.in_channels: int = int(fe.in_channels)
        self.blocks = nn.ModuleList([ExportConvBlock(b) for b in fe.blocks])

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        t, n = x.shape[0], x.shape[1]
        x = x.reshape(t, n, self.height, self.in_channels).permute(1, 3, 2, 0)  # (N, C, H, T)
        mask = _column_mask(lengths, t)
        x = x.masked_fill(mask.logical_not(), 0.0)
        for blk in self.blocks:
            x, lengths, mask = blk(x, lengths, mask)
        n, c, h, t = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
        return x.permute(3, 0, 1, 2).reshape(t, n, c * h), lengths


class ExportCTC(nn.Module):
    """``CTCModel`` for export and inference engines; see the module docstring."""

    def __init__(self, model):
        super().__init__()
        from rnntrain.compute.peephole import PeepholeLSTM
        self.subsample: int = int(model.subsample)
        fe = getattr(model, "frontend", None)
        self.has_conv: bool = fe is not None
        self.conv = ExportConv(fe) if fe is not None else NoConv()
        self.layers = nn.ModuleList()
        for rnn in model.rnns:
            if isinstance(rnn, PeepholeLSTM):
                self.layers.append(PeepholeLayer(rnn))
            elif rnn.bidirectional:
                self.layers.append(BiLSTM(rnn))
            else:
                self.layers.append(UniLSTM(rnn))
        self.out = nn.Linear(model.out.in_features, model.out.out_features)
        self.out.load_state_dict(model.out.state_dict())
        self.eval()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.has_conv:
            x, lengths = self.conv(x, lengths)
        k = self.subsample
        if k > 1:  # stack k frames into one, zero-padding the last group (stack_frames)
            T, N, Fdim = x.shape[0], x.shape[1], x.shape[2]
            Tk = (T + k - 1) // k
            x = F.pad(x, [0, 0, 0, 0, 0, Tk * k - T])
            x = x.reshape(Tk, k, N, Fdim).permute(0, 2, 1, 3).reshape(Tk, N, k * Fdim)
            lengths = torch.div(lengths + (k - 1), k, rounding_mode="floor")
        t = torch.arange(x.shape[0], device=x.device).unsqueeze(1)       # (T', 1)
        L = lengths.to(x.device).unsqueeze(0)                           # (1, N)
        valid = t < L                                                   # (T', N)
        rev = torch.where(valid, L - 1 - t, t.expand_as(valid))          # reversal index
        mask = valid.unsqueeze(2).to(x.dtype)                           # (T', N, 1)
        for layer in self.layers:
            x = layer(x, rev, mask)
        return F.log_softmax(self.out(x), dim=-1), lengths
