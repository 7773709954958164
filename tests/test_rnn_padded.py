"""The dense padded LSTM path (``rnntrain.model.run_rnn``) against PyTorch's packed nn.LSTM."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnntrain.model import CTCModel, run_rnn


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padded_path_matches_packed_lstm(bidirectional):
    torch.manual_seed(0)
    rnn = torch.nn.LSTM(5, 7, bidirectional=bidirectional).double()
    lengths = torch.tensor([9, 4, 1, 7, 9])
    x = torch.randn(9, 5, 5, dtype=torch.float64)
    for n, L in enumerate(lengths.tolist()):
        x[L:, n] = 0
    w = torch.randn(9, 5, 14 if bidirectional else 7, dtype=torch.float64)

    def grads(fn):
        xx = x.clone().requires_grad_()
        y = fn(xx)
        g = torch.autograd.grad((y * w).sum(), [xx, *rnn.parameters()])
        return y.detach(), g

    ref_y, ref_g = grads(lambda xx: pad_packed_sequence(
        rnn(pack_padded_sequence(xx, lengths, enforce_sorted=False))[0], total_length=9)[0])
    y, g = grads(lambda xx: run_rnn(rnn, xx, lengths))
    torch.testing.assert_close(y, ref_y, rtol=1e-10, atol=1e-12)
    for a, b in zip(g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_model_output_of_a_sequence_does_not_depend_on_its_batch():
    torch.manual_seed(1)
    model = CTCModel(4, 3, layers=2, hidden=6).eval()
    x = torch.randn(8, 3, 4)
    lengths = torch.tensor([8, 3, 5])
    for n, L in enumerate(lengths.tolist()):
        x[L:, n] = 0
    with torch.no_grad():
        batch, _ = model(x, lengths)
        alone, _ = model(x[:3, 1:2], lengths[1:2])
    torch.testing.assert_close(batch[:3, 1:2], alone, rtol=1e-5, atol=1e-6)
