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

Shapes: x (T, N, F) zero-padded float32, lengths (N,) int64 → log-probabilities (T', N, C)
and output lengths (N,), T' = ceil(T / subsample), C = labels + 1 (blank last).
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


class ExportCTC(nn.Module):
    """``CTCModel`` for export and inference engines; see the module docstring."""

    def __init__(self, model):
        super().__init__()
        from rnntrain.compute.peephole import PeepholeLSTM
        self.subsample: int = int(model.subsample)
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
