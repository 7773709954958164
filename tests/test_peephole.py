"""RNNLIB's peephole LSTM cell against a step-by-step numpy reference (forward, gradients).

The reference follows RNNLIB's LstmLayer::feed_forward / feed_back one sequence, one
timestep and one direction at a time, including the clipping of the gate errors to
[-1, 1]; the unclipped gradient is also checked by finite differences (gradcheck).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnntrain.compute.model import CTCModel, ctc_loss_sum
from rnntrain.compute.peephole import PeepholeLSTM


def sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def ref_direction(x, W, b, R, p, gy, clip):
    """One sequence, one direction. x: (L, F), W: (4H, F), R: (4H, H), p: (3, H),
    gy: (L, H) dE/dh. Returns h (L, H) and grads (dW, db, dR, dp, dx) plus the number of
    clipped gate errors."""
    L, H = len(x), R.shape[1]
    h, c = np.zeros(H), np.zeros(H)
    hs, cs, acts = [], [], []
    for t in range(L):
        a = W @ x[t] + b + R @ h
        i = sig(a[:H] + p[0] * c)
        f = sig(a[H:2 * H] + p[1] * c)
        g = np.tanh(a[2 * H:3 * H])
        c_new = f * c + i * g
        o = sig(a[3 * H:] + p[2] * c_new)
        h_new = o * np.tanh(c_new)
        acts.append((i, f, g, o, c, c_new, h))
        h, c = h_new, c_new
        hs.append(h)
    dW, db, dR = np.zeros_like(W), np.zeros_like(b), np.zeros_like(R)
    dp, dx = np.zeros_like(p), np.zeros_like(x)
    delta_next = np.zeros(4 * H)
    cell_err_next, f_next = np.zeros(H), np.zeros(H)
    clipped = 0
    for t in range(L - 1, -1, -1):
        i, f, g, o, c_prev, c, h_prev = acts[t]
        e = gy[t] + R.T @ delta_next                       # output errors
        og_err = o * (1 - o) * np.tanh(c) * e              # output gate (local, unclipped)
        cell_err = (1 - np.tanh(c) ** 2) * o * e + og_err * p[2]
        cell_err += delta_next[:H] * p[0] + delta_next[H:2 * H] * p[1] + f_next * cell_err_next
        delta = np.concatenate([i * (1 - i) * cell_err * g,
                                f * (1 - f) * cell_err * c_prev if t else np.zeros(H),
                                i * (1 - g ** 2) * cell_err,
                                og_err])
        if clip is not None:
            clipped += int((np.abs(delta) > clip).sum())
            delta = np.clip(delta, -clip, clip)
        dW += np.outer(delta, x[t])
        db += delta
        dR += np.outer(delta, h_prev)
        dp[0] += delta[:H] * c_prev
        dp[1] += delta[H:2 * H] * c_prev
        dp[2] += delta[3 * H:] * c
        dx[t] = W.T @ delta
        delta_next, cell_err_next, f_next = delta, cell_err, f
    return np.array(hs), (dW, db, dR, dp, dx), clipped


def reference(layer: PeepholeLSTM, x: np.ndarray, lengths, gy: np.ndarray, clip):
    """The whole layer, sequence by sequence, direction by direction."""
    D, H = (2 if layer.bidirectional else 1), layer.hidden_size
    Wall = layer.weight_ih.detach().double().numpy()
    ball = layer.bias.detach().double().numpy()
    Rall = layer.weight_hh.detach().double().numpy()
    Pall = layer.peephole.detach().double().numpy()
    y = np.zeros(x.shape[:2] + (D * H,))
    grads = [np.zeros_like(Wall), np.zeros_like(ball), np.zeros_like(Rall),
             np.zeros_like(Pall), np.zeros_like(x)]
    clipped = 0
    for n, L in enumerate(lengths):
        for d in range(D):
            sl = slice(d * 4 * H, (d + 1) * 4 * H)
            order = np.arange(L) if d == 0 else np.arange(L)[::-1]
            h, (dW, db, dR, dp, dx), k = ref_direction(
                x[order, n], Wall[sl], ball[sl], Rall[d], Pall[d], gy[order, n, d * H:(d + 1) * H],
                clip)
            clipped += k
            y[order, n, d * H:(d + 1) * H] = h
            grads[0][sl] += dW
            grads[1][sl] += db
            grads[2][d] += dR
            grads[3][d] += dp
            grads[4][order, n] += dx
    return y, grads, clipped


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("clip", [None, 1.0])
def test_forward_and_gradients_match_numpy_reference(bidirectional, clip):
    torch.manual_seed(0)
    F, H, lengths = 3, 4, [7, 5, 1, 6]
    T, N = max(lengths), len(lengths)
    layer = PeepholeLSTM(F, H, bidirectional, clip=clip).double()
    with torch.no_grad():  # large weights so that some gate errors exceed 1
        for p in layer.parameters():
            p.uniform_(-1.5, 1.5)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(T, N, F))
    gy = rng.normal(scale=10.0, size=(T, N, (2 if bidirectional else 1) * H))
    for n, L in enumerate(lengths):
        x[L:, n] = 0
    xt = torch.tensor(x, requires_grad=True)
    y = layer.forward_padded(xt, torch.tensor(lengths))
    (y * torch.tensor(gy)).sum().backward()

    y_ref, g_ref, clipped = reference(layer, x, lengths, gy, clip)
    if clip is not None:
        assert clipped > 10, "test weights too small: clipping never happened"
    np.testing.assert_allclose(y.detach().numpy(), y_ref, rtol=1e-10, atol=1e-12)
    got = [layer.weight_ih.grad, layer.bias.grad, layer.weight_hh.grad, layer.peephole.grad,
           xt.grad]
    for name, g, r in zip(["weight_ih", "bias", "weight_hh", "peephole", "x"], got, g_ref):
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-9, atol=1e-10, err_msg=name)


def test_unclipped_gradient_by_finite_differences():
    torch.manual_seed(2)
    layer = PeepholeLSTM(2, 3, bidirectional=True, clip=None).double()
    lengths = torch.tensor([4, 2, 3])
    x = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)

    def fn(x, *params):
        return layer.forward_padded(x, lengths)

    assert torch.autograd.gradcheck(fn, (x, *layer.parameters()), eps=1e-6, atol=1e-6)


def test_packed_interface_and_ctc_model_train_step():
    """CTCModel drives the cell through PackedSequence like nn.LSTM; one SGD step lowers
    the CTC loss of a small batch, and padding does not change a sequence's output."""
    torch.manual_seed(3)
    layer = PeepholeLSTM(5, 6, bidirectional=True)
    lengths = torch.tensor([6, 3])
    x = torch.randn(6, 2, 5)
    x[3:, 1] = 0
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out, state = layer(packed)
    y, out_len = pad_packed_sequence(out)
    assert state is None and out_len.tolist() == [6, 3]
    alone = layer.forward_padded(x[:3, 1:2], lengths[1:])
    torch.testing.assert_close(y[:3, 1:2], alone, rtol=1e-5, atol=1e-6)
    assert torch.all(y[3:, 1] == 0)

    model = CTCModel(5, 4, layers=2, hidden=8, cell="peephole")
    targets = [np.array([0, 1, 2]), np.array([3])]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(5):
        lp, ol = model(x, lengths)
        loss = ctc_loss_sum(lp, ol, targets, model.blank)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
