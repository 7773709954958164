"""CTC loss and gradients against the numpy reference; decoding and edit distance."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from rnntrain.decode.score import ErrorCounts, edit_ops
from rnntrain.decode.search import best_path, prefix_beam_search
from rnntrain.compute.model import ctc_loss_sum
from rnntrain.data.dataset import min_frames
from tests.ctc_reference import ctc_grad_activations, ctc_loss


@pytest.mark.parametrize("T,C,target", [(1, 3, [0]), (4, 3, [0, 1]), (6, 4, [1, 1]),
                                        (7, 5, [0, 2, 2, 3]), (5, 3, []), (9, 6, [4, 0, 4, 1])])
def test_ctc_loss_and_gradient_match_numpy(T, C, target):
    rng = np.random.default_rng(T * 31 + C)
    u = rng.normal(size=(T, C)) * 2
    blank = C - 1
    ut = torch.tensor(u[:, None, :], dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(ut, dim=-1)
    loss = ctc_loss_sum(lp, torch.tensor([T]), [np.array(target)], blank)
    loss.backward()
    ref = ctc_loss(u - np.log(np.exp(u).sum(1, keepdims=True)), target, blank)
    assert loss.item() == pytest.approx(ref, rel=1e-6, abs=1e-6)  # CTC runs in fp32
    np.testing.assert_allclose(ut.grad[:, 0].numpy(), ctc_grad_activations(u, target, blank),
                               rtol=1e-5, atol=1e-6)


def test_ctc_loss_is_minus_log_sum_over_all_paths():
    """Brute force: sum the probability of every frame path that collapses to the target."""
    T, C, blank, target = 5, 3, 2, [0, 1]
    rng = np.random.default_rng(0)
    u = rng.normal(size=(T, C))
    log_y = u - np.log(np.exp(u).sum(1, keepdims=True))
    total = 0.0
    for path in itertools.product(range(C), repeat=T):
        if best_path(np.eye(C)[list(path)], T, blank) == target:
            total += np.exp(sum(log_y[t, k] for t, k in enumerate(path)))
    assert ctc_loss(log_y, target, blank) == pytest.approx(-np.log(total), rel=1e-12)


def test_batch_loss_is_sum_of_sequences():
    rng = np.random.default_rng(1)
    C, lens, targets = 4, [6, 3], [np.array([0, 1]), np.array([2])]
    u = rng.normal(size=(6, 2, C))
    lp = torch.log_softmax(torch.tensor(u), -1)
    got = ctc_loss_sum(lp, torch.tensor(lens), targets, C - 1).item()
    ref = sum(ctc_loss(lp[:n, i].numpy(), list(t), C - 1) for i, (n, t) in
              enumerate(zip(lens, targets)))
    assert got == pytest.approx(ref, rel=1e-6)


def test_min_frames_counts_repeats():
    assert min_frames([1, 1, 2]) == 4 and min_frames([1, 2, 3]) == 3 and min_frames([]) == 0


def _brute_edit(a, b):
    d = np.zeros((len(a) + 1, len(b) + 1), int)
    d[:, 0], d[0, :] = range(len(a) + 1), range(len(b) + 1)
    for i, j in itertools.product(range(1, len(a) + 1), range(1, len(b) + 1)):
        d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1, -1]


def test_edit_ops_total_is_levenshtein_and_parts_are_consistent():
    rng = np.random.default_rng(2)
    for _ in range(300):
        a = rng.integers(4, size=rng.integers(0, 8)).tolist()
        b = rng.integers(4, size=rng.integers(0, 8)).tolist()
        s, d, i = edit_ops(a, b)
        assert s + d + i == _brute_edit(a, b)
        assert len(a) - d + i == len(b)  # deletions remove ref labels, insertions add


def test_edit_ops_cases():
    assert edit_ops([1, 2, 3], [1, 2, 3]) == (0, 0, 0)
    assert edit_ops([1, 2, 3], [1, 3]) == (0, 1, 0)
    assert edit_ops([1, 3], [1, 2, 3]) == (0, 0, 1)
    assert edit_ops([1, 2], [1, 4]) == (1, 0, 0)
    assert edit_ops([], [5, 5]) == (0, 0, 2)


def test_error_counts_ler():
    c = ErrorCounts()
    c.add([1, 2, 3, 4], [1, 2, 3, 4])
    c.add([1, 2], [2])
    s = c.summary()
    assert s["ler"] == pytest.approx(1 / 6) and s["del"] == pytest.approx(1 / 6)
    assert s["seq_error"] == 0.5 and s["seqs"] == 2


def test_best_path_merges_repeats_and_drops_blanks():
    blank = 3
    path = [3, 0, 0, 3, 0, 1, 1, 3, 2, 2]
    lp = np.log(np.eye(4)[path] * 0.9 + 0.025)
    assert best_path(lp, len(path), blank) == [0, 0, 1, 2]
    assert best_path(lp, 3, blank) == [0]  # only the first 3 frames count


def _label_probs(log_y, blank, maxlen):
    """Exact p(l|x) for every label sequence up to maxlen (by enumerating frame paths)."""
    T, C = log_y.shape
    probs = {}
    for path in itertools.product(range(C), repeat=T):
        l = tuple(best_path(np.eye(C)[list(path)], T, blank))
        probs[l] = probs.get(l, 0.0) + np.exp(sum(log_y[t, k] for t, k in enumerate(path)))
    return probs


def test_prefix_beam_search_finds_most_probable_labelling():
    rng = np.random.default_rng(3)
    wins = 0
    for trial in range(20):
        T, C = 5, 3
        u = rng.normal(size=(T, C)) * 1.5
        log_y = u - np.log(np.exp(u).sum(1, keepdims=True))
        probs = _label_probs(log_y, C - 1, T)
        best = max(probs, key=probs.get)
        got = tuple(prefix_beam_search(log_y, T, C - 1, beam=16))
        assert probs[got] == pytest.approx(probs[best], rel=1e-9)  # a wide beam is exact here
        wins += tuple(best_path(log_y, T, C - 1)) == best
    assert wins < 20  # best path is not always optimal, so the beam did real work
