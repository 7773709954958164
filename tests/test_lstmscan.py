"""The compiled LSTM recurrence (``compute.lstm = "scan"``) against the packed-sequence
``nn.LSTM`` (values and every gradient, float64), in float32 against the oneDNN path, and
bit-identical from one call to the next."""
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rnntrain.compute import lstmscan
from rnntrain.compute.model import lstm_padded

pytestmark = pytest.mark.skipif(lstmscan.unavailable() is not None,
                                reason=f"no compiled recurrence: {lstmscan.unavailable()}")


def _batch(lens, f, dtype, seed=3):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens)
    t = int(lens.max()) + 2            # padding past the longest too
    x = torch.randn(t, len(lens), f, dtype=dtype, generator=g)
    for i, n in enumerate(lens.tolist()):
        x[n:, i] = 0
    return x.requires_grad_(True), lens, g


# H = 16 and 40: whole vector blocks and a partial last block (40 = 2.5 blocks of 16 doubles)
@pytest.mark.parametrize("hidden", [16, 40])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("lens", [[7, 3, 5, 7, 1, 2, 6, 4], [6, 6, 6], [1]])
def test_scan_matches_packed_lstm(hidden, bidirectional, lens):
    x, lens, g = _batch(lens, 8, torch.double)
    rnn = torch.nn.LSTM(8, hidden, bidirectional=bidirectional).double()
    with torch.no_grad():
        for p in rnn.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype, generator=g) * 0.4)
    t = x.shape[0]
    ref = pad_packed_sequence(rnn(pack_padded_sequence(x, lens, enforce_sorted=False))[0],
                              total_length=t)[0]
    w = torch.randn(ref.shape, dtype=torch.double, generator=g)
    ref_g = torch.autograd.grad((ref * w).sum(), [x, *rnn.parameters()])
    out = lstmscan.lstm_scan(rnn, x, lens)
    out_g = torch.autograd.grad((out * w).sum(), [x, *rnn.parameters()])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)   # zero at padding as well
    for a, b in zip(out_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_scan_float32_matches_onednn_and_repeats_bit_for_bit():
    x, lens, g = _batch([40, 33, 40, 12, 27, 39, 5, 31, 40, 18], 20, torch.float32)
    rnn = torch.nn.LSTM(20, 128, bidirectional=True)
    w = None
    grads = []
    for fn in (lambda: lstm_padded(rnn, x, lens), lambda: lstmscan.lstm_scan(rnn, x, lens),
               lambda: lstmscan.lstm_scan(rnn, x, lens)):
        out = fn()
        if w is None:
            w = torch.randn(out.shape, generator=g)
        grads.append([out.detach(), *torch.autograd.grad((out * w).sum(), [x, *rnn.parameters()])])
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
    for a, b in zip(grads[1], grads[2]):
        assert torch.equal(a, b)
