"""RNNLIB's LSTM cell (``model.cell = "peephole"``) for users who need the same model.

Per direction, with gate order [i, f, g, o] in every 4H-wide tensor (H cells):

    a = W x_t + b + R h_{t-1}                         (input and recurrent projections)
    i = σ(a_i + p_i ⊙ c_{t-1})     f = σ(a_f + p_f ⊙ c_{t-1})     g = tanh(a_g)
    c_t = f ⊙ c_{t-1} + i ⊙ g
    o = σ(a_o + p_o ⊙ c_t)          h_t = o ⊙ tanh(c_t)

This is RNNLIB's ``LstmLayer<Tanh, Tanh, Logistic>`` with one cell per block: peephole
weights (diagonal) from the previous cell state to the input and forget gates and from the
current state to the output gate, one bias per gate unit, c_{-1} = h_{-1} = 0.

Error clipping, as RNNLIB does it (``LstmLayer::feed_back``: ``bound_range(inErrs, -1, 1)``):
at every timestep the derivatives of the loss with respect to the four gate
pre-activations (including the peephole terms) are clipped to [-clip, clip] *before* they
are used for anything: the weight and bias gradients, the peephole gradients, the error
passed to the layer below (W^T δ) and to the previous timestep (R^T δ, and the peephole
paths p_i δ_i + p_f δ_f into the previous cell's error). The cell-state error itself
(dE/dc, carried back through the forget gate) is not clipped, and the output gate's own
unclipped error feeds its timestep's cell error, exactly as in RNNLIB. ``clip=None`` gives
the exact gradient (RNNLIB's gradient-check mode).

Speed: the input projection of all timesteps and both directions is one matmul; the time
loop runs both directions at once (batched matmul over the direction axis), and the
backward pass is hand-written (``_PeepholeScan``) with the derivative factors computed for
all timesteps at once, so each step is ~10 tensor ops forward and ~8 backward. Weight
gradients of R are one batched matmul after the loop.

Shapes: T timesteps, N sequences, F input features, H cells, D directions (1 or 2).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence


class _PeepholeScan(torch.autograd.Function):
    """The recurrence over time for D directions at once.

    xg: (T, D, N, 4H) input projections (+ bias), already time-reversed for the backward
    direction; R: (D, 4H, H); P: (D, 3, H) peepholes (i, f, o). Returns h: (T, D, N, H).
    """

    @staticmethod
    def forward(ctx, xg, R, P, clip):
        T, D, N, H4 = xg.shape
        H = H4 // 4
        hs = xg.new_empty(T + 1, D, N, H)        # hs[t + 1] = h_t; hs[0] = h_{-1} = 0
        cs = xg.new_empty(T + 1, D, N, H)        # cs[t + 1] = c_t
        hs[0].zero_()
        cs[0].zero_()
        IF = xg.new_empty(T, D, N, 2, H)         # input and forget gate activations
        G = xg.new_empty(T, D, N, H)             # tanh cell input
        O = xg.new_empty(T, D, N, H)             # output gate
        TC = xg.new_empty(T, D, N, H)            # tanh(c_t)
        Rt = R.transpose(1, 2).contiguous()      # (D, H, 4H), once: bmm would copy
        p_if = P[:, None, 0:2, :]                # (D, 1, 2, H)
        p_o = P[:, None, 2, :]                   # (D, 1, H)
        for t in range(T):
            pre = torch.baddbmm(xg[t], hs[t], Rt)            # (D, N, 4H), a fresh tensor
            pv = pre.view(D, N, 4, H)
            c_prev = cs[t]
            pv[:, :, 0:2].addcmul_(c_prev.unsqueeze(2), p_if)
            torch.sigmoid(pv[:, :, 0:2], out=IF[t])
            torch.tanh(pv[:, :, 2], out=G[t])
            c = torch.mul(IF[t, :, :, 1], c_prev, out=cs[t + 1])
            c.addcmul_(IF[t, :, :, 0], G[t])
            ao = pv[:, :, 3].addcmul_(c, p_o)
            torch.sigmoid(ao, out=O[t])
            torch.tanh(c, out=TC[t])
            torch.mul(O[t], TC[t], out=hs[t + 1])
        ctx.save_for_backward(R, P, hs, cs, IF, G, O, TC)
        ctx.clip = clip
        return hs[1:]

    @staticmethod
    def backward(ctx, gh):
        R, P, hs, cs, IF, G, O, TC = ctx.saved_tensors
        clip = ctx.clip
        T, D, N, H = gh.shape
        gh = gh.contiguous()
        i, f = IF[:, :, :, 0], IF[:, :, :, 1]
        # derivative factors of all timesteps at once (the loop only carries errors)
        k_o = O * (1 - O) * TC                               # dA_o = k_o ⊙ dh
        k_h = O * (1 - TC * TC) + P[:, None, 2] * k_o        # dc = k_h ⊙ dh + carry
        k_3 = torch.stack([i * (1 - i) * G,                  # dA_i = k_i ⊙ dc
                           f * (1 - f) * cs[:-1],            # dA_f (0 at t = 0: c_{-1} = 0)
                           i * (1 - G * G)], dim=3)          # dA_g
        p_i, p_f = P[:, None, 0], P[:, None, 1]              # (D, 1, H)
        dA = gh.new_empty(T, D, N, 4, H)
        carry = gh.new_zeros(D, N, H)                        # dE/dc_t from t + 1
        dh = gh.new_empty(D, N, H)
        for t in range(T - 1, -1, -1):
            if t == T - 1:
                dh.copy_(gh[t])
            else:
                torch.baddbmm(gh[t], dA[t + 1].view(D, N, 4 * H), R, out=dh)
            torch.mul(k_o[t], dh, out=dA[t, :, :, 3])
            dc = torch.addcmul(carry, k_h[t], dh)
            torch.mul(k_3[t], dc.unsqueeze(2), out=dA[t, :, :, 0:3])
            if clip is not None:
                dA[t].clamp_(-clip, clip)
            # the previous cell's error: through the forget gate and the two peepholes
            carry = torch.mul(f[t], dc)
            carry.addcmul_(dA[t, :, :, 0], p_i).addcmul_(dA[t, :, :, 1], p_f)
        dA4 = dA.view(T, D, N, 4 * H)
        # gradients of R (one batched matmul) and of the peepholes, from clipped errors
        dAf = dA4.permute(1, 0, 2, 3).reshape(D, T * N, 4 * H)
        hp = hs[:-1].permute(1, 0, 2, 3).reshape(D, T * N, H)
        dR = torch.bmm(dAf.transpose(1, 2), hp)
        # sum over time first, then over the batch: torch reduces leading dims much faster
        # than a (0, 2) reduction over the strided product
        dP = torch.stack([(dA[:, :, :, 0] * cs[:-1]).sum(0).sum(1),
                          (dA[:, :, :, 1] * cs[:-1]).sum(0).sum(1),
                          (dA[:, :, :, 3] * cs[1:]).sum(0).sum(1)], dim=1)
        return dA4, dR, dP, None


def reverse_index(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """(T, N) int64: row t of sequence n ↔ row len_n - 1 - t (padding rows stay put).

    Applying it twice is the identity, so it maps inputs to reversed time and back.
    """
    t = torch.arange(T)[:, None]
    L = lengths[None, :].to(torch.long)
    return torch.where(t < L, L - 1 - t, t)


class PeepholeLSTM(nn.Module):
    """One (bi)directional layer of RNNLIB's LSTM; a drop-in for ``nn.LSTM(...)``.

    Called with a PackedSequence (as CTCModel calls nn.LSTM) it returns
    ``(PackedSequence (T, N, D*H), None)``; ``forward_padded(x (T, N, F), lengths (N,))``
    returns the padded output (T, N, D*H) with zeros past each sequence's end.
    """

    def __init__(self, input_size: int, hidden: int, bidirectional: bool = True,
                 clip: float | None = 1.0):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden
        self.bidirectional = bidirectional
        self.clip = clip
        D = 2 if bidirectional else 1
        self.weight_ih = nn.Parameter(torch.empty(D * 4 * hidden, input_size))
        self.bias = nn.Parameter(torch.empty(D * 4 * hidden))
        self.weight_hh = nn.Parameter(torch.empty(D, 4 * hidden, hidden))
        self.peephole = nn.Parameter(torch.empty(D, 3, hidden))
        self.reset_parameters()

    def reset_parameters(self):
        # nn.LSTM's default; the trainer applies RNNLIB's uniform ±0.1 for this cell
        s = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -s, s)

    def forward(self, packed: PackedSequence, state=None):
        if state is not None:
            raise ValueError("PeepholeLSTM starts from a zero state")
        x, lengths = pad_packed_sequence(packed)
        y = self.forward_padded(x, lengths)
        return pack_padded_sequence(y, lengths, enforce_sorted=False), None

    def forward_padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        T, N, _ = x.shape
        D, H = (2 if self.bidirectional else 1), self.hidden_size
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast(x.device.type, enabled=False):  # the scan runs in fp32 (or fp64)
            x = x.to(dtype)
            W, b = self.weight_ih.to(dtype), self.bias.to(dtype)
            xg = torch.addmm(b, x.reshape(T * N, -1), W.t()).view(T, N, D, 4 * H)
            if D == 2:
                rev = reverse_index(lengths.cpu(), T).to(x.device)
                idx = rev[:, :, None].expand(T, N, 4 * H)
                xg = torch.stack([xg[:, :, 0], xg[:, :, 1].gather(0, idx)], dim=1)
            else:
                xg = xg.permute(0, 2, 1, 3).contiguous()
            h = _PeepholeScan.apply(xg, self.weight_hh.to(dtype), self.peephole.to(dtype),
                                    self.clip)                      # (T, D, N, H)
            mask = (torch.arange(T)[:, None] < lengths.cpu()[None, :]).to(x.device, dtype)
            outs = [h[:, 0]]
            if D == 2:
                outs.append(h[:, 1].gather(0, rev[:, :, None].expand(T, N, H)))
            return torch.cat(outs, dim=2) * mask[:, :, None]

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, bidirectional={self.bidirectional}, "
                f"clip={self.clip}")
