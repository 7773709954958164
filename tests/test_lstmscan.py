"""The compiled LSTM recurrence (``compute.lstm = "scan"``) against the packed-sequence
``nn.LSTM`` (values and every gradient, float64), in float32 against the oneDNN path, and
bit-identical from one call to the next; the model, the checkpoint and the trainer pick
the kernel the config names, and without a compiler train exactly as "onednn" does."""
import hashlib

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from conftest import run_cli
from rnntrain.compute import lstmscan
from rnntrain.compute.model import CTCModel, lstm_padded

compiled = pytest.mark.skipif(lstmscan.unavailable() is not None,
                              reason=f"no compiled recurrence: {lstmscan.unavailable()}")


def _batch(lens, f, dtype, seed=3):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens)
    t = int(lens.max()) + 2            # padding past the longest too
    x = torch.randn(t, len(lens), f, dtype=dtype, generator=g)
    for i, n in enumerate(lens.tolist()):
        x[n:, i] = 0
    return x.requires_grad_(True), lens, g


@compiled
# H = 16 and 40 in float64 (blocks of 32 columns): the backward's product (H columns) is
# half a block, or a block and one vector; the forward's (4H: 64, 160) whole blocks
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


@compiled
# 128 cells: whole blocks of 64 floats; 40: in the backward's product (40 columns) two
# vectors of 16 and 8 columns one by one; 96 (the FSDD recipe's): a block and a half
@pytest.mark.parametrize("hidden", [128, 40, 96])
def test_scan_float32_matches_onednn_and_repeats_bit_for_bit(hidden):
    x, lens, g = _batch([40, 33, 40, 12, 27, 39, 5, 31, 40, 18], 20, torch.float32)
    rnn = torch.nn.LSTM(20, hidden, bidirectional=True)
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


@compiled
def test_model_runs_the_kernel_it_names():
    """CTCModel(lstm=...) on the same weights: "scan" equals the packed path's maths as
    "onednn" does (float64), and its LSTM layers really run the compiled recurrence (the
    autograd graph holds its backward, not oneDNN's)."""
    torch.manual_seed(0)
    a = CTCModel(5, 4, layers=2, hidden=6, lstm="scan").double()
    b = CTCModel(5, 4, layers=2, hidden=6, lstm="onednn").double()
    b.load_state_dict(a.state_dict())
    lengths = torch.tensor([9, 4, 7, 2])
    x = torch.randn(9, 4, 5, dtype=torch.double)
    x[torch.arange(9).unsqueeze(1) >= lengths.unsqueeze(0)] = 0.0
    ya, yb = a(x, lengths)[0], b(x, lengths)[0]
    valid = torch.arange(9).unsqueeze(1) < lengths.unsqueeze(0)
    torch.testing.assert_close(ya[valid], yb[valid], rtol=1e-12, atol=1e-12)

    def graph(y):
        seen, todo = set(), [y.grad_fn]
        while todo:
            f = todo.pop()
            if f is not None and f not in seen:
                seen.add(f)
                todo += [g for g, _ in f.next_functions]
        return {type(f).__name__ for f in seen}
    assert "_ScanBackward" in graph(ya) and "_ScanBackward" not in graph(yb)
    assert not any("Mkldnn" in n or "Lstm" in n for n in graph(ya)), graph(ya)


def test_checkpoint_builds_the_kernel_it_was_trained_with():
    """A card names its run's compute.lstm; one from before the setting ran oneDNN."""
    from rnntrain.run.checkpoint import ModelCard
    for compute, kernel in (({"lstm": "scan"}, "scan"), ({"lstm": "onednn"}, "onednn"),
                            ({}, "onednn")):
        card = ModelCard(["a", "b"], 3, 3, config={"model": {"layers": 1, "hidden": 4},
                                                   "compute": compute})
        assert card.build().lstm == kernel


def _digest(ckpt):
    sd = torch.load(ckpt, weights_only=True)["model"]
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode() + sd[k].numpy().tobytes())
    return h.hexdigest()


def test_without_a_compiler_training_is_onednns_bit_for_bit(synth_pair, tmp_path):
    """No C++ compiler on the PATH and no built library: compute.lstm = "scan" trains with
    oneDNN's kernel, the log says why, and the weights are those of "onednn"; with the
    compiler the log names the compiled library."""
    train, _ = synth_pair
    args = ("rnntrain", "train", f"data.train={train}", "model.layers=2", "model.hidden=16",
            "train.epochs=1", "batch.batch_frames=600", "compute.threads=2")
    bare = {"PATH": str(tmp_path / "bin"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "RNNTRAIN_CPUCACHE": "off"}
    (tmp_path / "bin").mkdir()
    runs = {}
    for name, extra, env in (("fallback", [], bare), ("onednn", ["compute.lstm=onednn"], bare),
                             ("scan", [], None)):
        p = run_cli(*args, *extra, f"run.dir={tmp_path / name}", env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        runs[name] = (p.stdout + p.stderr, _digest(tmp_path / name / "checkpoints" / "last.pt"))
    assert "lstm: oneDNN's kernel, rnntrain's recurrence is unavailable (no C++ compiler" \
        in runs["fallback"][0], runs["fallback"][0]
    assert 'lstm: oneDNN\'s kernel (compute.lstm = "onednn")' in runs["onednn"][0]
    assert runs["fallback"][1] == runs["onednn"][1]
    if lstmscan.unavailable() is None:
        assert "lstm: rnntrain's compiled recurrence (_lstmscan-" in runs["scan"][0]


@compiled
def test_build_is_keyed_cached_and_prunes_only_its_own_old_libraries(tmp_path, monkeypatch):
    """A build goes to $XDG_CACHE_HOME/rnntrain under a keyed name; the next call finds it
    (no second build); a new build removes this kind's libraries unused for 30 days, not
    recent ones and not the large-block cache's."""
    import os
    import time
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "rnntrain"
    folder.mkdir()
    old, recent, other = (folder / n for n in ("_lstmscan-0ld.so", "_lstmscan-recent.so",
                                                "_cpucache-0ld.so"))
    for p in (old, recent, other):
        p.write_bytes(b"x")
    month = time.time() - 40 * 86400
    os.utime(old, (month, month))
    os.utime(other, (month, month))
    built = lstmscan.build()
    assert built.parent == folder and built.name.startswith("_lstmscan-") and built.is_file()
    assert not old.exists() and recent.exists() and other.exists()
    inode = built.stat().st_ino   # a rebuild renames a new file over it: a new inode
    assert lstmscan.build() == built and built.stat().st_ino == inode
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [built.name, recent.name, other.name])
