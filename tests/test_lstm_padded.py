"""The CPU padded-LSTM path equals the packed-sequence path (values and gradients)."""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnntrain.compute.model import CTCModel, lstm_padded, reverse_padded


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("lens", [[7, 3, 5, 7, 1], [6, 6, 6]])
def test_lstm_padded_matches_packed(bidirectional, lens):
    g = torch.Generator().manual_seed(3)
    rnn = torch.nn.LSTM(8, 16, bidirectional=bidirectional).double()
    lens = torch.tensor(lens)
    t = int(lens.max())
    x = torch.randn(t, len(lens), 8, dtype=torch.double, generator=g)
    for i, n in enumerate(lens.tolist()):
        x[n:, i] = 0
    x.requires_grad_(True)
    ref = pad_packed_sequence(rnn(pack_padded_sequence(x, lens, enforce_sorted=False))[0],
                              total_length=t)[0]
    w = torch.randn(ref.shape, dtype=torch.double, generator=g)
    for i, n in enumerate(lens.tolist()):
        w[n:, i] = 0   # the packed path's padding carries no gradient
    ref_g = torch.autograd.grad((ref * w).sum(), [x, *rnn.parameters()])
    out = lstm_padded(rnn, x, lens)
    out_g = torch.autograd.grad((out * w).sum(), [x, *rnn.parameters()])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(out_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_reverse_padded_is_an_involution_on_valid_frames():
    x = torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3, 1) + 1
    lens = torch.tensor([4, 2, 1])
    for i, n in enumerate(lens.tolist()):
        x[n:, i] = 0
    r = reverse_padded(x, lens)
    assert r[:, 1, 0].tolist() == [x[1, 1, 0].item(), x[0, 1, 0].item(), 0, 0]
    assert torch.equal(reverse_padded(r, lens), x)


def test_model_output_independent_of_padding_amount():
    """A sequence scores the same alone and next to a much longer one."""
    torch.manual_seed(0)
    m = CTCModel(5, 4, layers=2, hidden=6).eval()
    a, b = torch.randn(4, 5), torch.randn(11, 5)
    alone, _ = m(a.unsqueeze(1), torch.tensor([4]))
    x = torch.zeros(11, 2, 5)
    x[:4, 0], x[:, 1] = a, b
    both, _ = m(x, torch.tensor([4, 11]))
    torch.testing.assert_close(both[:4, 0], alone[:, 0], rtol=1e-5, atol=1e-6)


def test_reverse_by_rows_equals_per_sequence_flips_bit_for_bit():
    """The CPU path reverses with one index_select of whole rows (PaddedGeometry.rows): its
    values and its input gradient equal a flip of each sequence's own frames, and the
    element-wise gather it replaced, exactly (the weights' digests depend on it)."""
    from rnntrain.compute.model import PaddedGeometry
    g = torch.Generator().manual_seed(5)
    lens = torch.tensor([9, 9, 4, 1, 6])
    x = torch.randn(9, 5, 33, generator=g, requires_grad=True)  # padding not zero: masked
    gy = torch.randn(9, 5, 33, generator=g)
    geom = PaddedGeometry(9, lens, torch.device("cpu"))
    assert geom.rows is not None
    out = geom.reverse(x)
    ref = torch.zeros(9, 5, 33)
    for i, n in enumerate(lens.tolist()):
        ref[:n, i] = x[:n, i].flip(0)
    assert torch.equal(out, ref)
    (gx,) = torch.autograd.grad(out, x, gy)
    ref_g = torch.zeros(9, 5, 33)
    for i, n in enumerate(lens.tolist()):
        ref_g[:n, i] = gy[:n, i].flip(0)
    assert torch.equal(gx, ref_g)
    old = PaddedGeometry(9, lens, torch.device("cpu"))
    old.rows = None   # the gather path (kept for other devices)
    assert torch.equal(old.reverse(x), out)
    assert torch.equal(torch.autograd.grad(old.reverse(x), x, gy)[0], gx)
