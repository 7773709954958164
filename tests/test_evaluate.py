"""``evaluate`` (validation, eval, decode) against a serial computation: one sequence at a
time through the model, best path by hand, edit distances by the Python DP oracle."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data_tools.synth import label_names, make_sequences
from rnntrain.compute.model import CTCModel, init_uniform
from rnntrain.compute.pool import intra_threads
from rnntrain.data import ncdata
from rnntrain.data.dataset import Dataset
from rnntrain.decode.score import edit_ops, edit_ops_reference, split_words
from rnntrain.run.evaluate import evaluate

SPACE = 0  # label L00 doubles as the word separator


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    names = label_names(5)
    seqs = list(make_sequences(60, 5, 6, 3, mean_labels=4, noise=0.5))
    frames = [x for x, _ in seqs]
    targets = [" ".join(names[i] for i in t) for _, t in seqs]
    path = tmp / "eval.nc"
    ncdata.write_file(path, frames, targets, names, [f"u{i}" for i in range(len(frames))])
    torch.manual_seed(0)
    model = CTCModel(6, 5, layers=2, hidden=16)
    # large weights: varied frame argmaxes, so hypotheses have every kind of error
    init_uniform(model, 0.6, torch.Generator().manual_seed(1))
    return path, model, _serial(model, Dataset.open(str(path)))


def _serial(model, ds):
    """Per sequence: loss, hypothesis (labels), log-probs, computed one at a time."""
    frames = ds.load_chunk(0)
    out = {}
    model.eval()
    # one intra-op thread: tiny per-step kernels on a team of threads only wait on each
    # other (on a busy machine, for seconds)
    with torch.no_grad(), intra_threads(1):
        for s in range(ds.num_seqs):
            x = torch.from_numpy(frames[s]).unsqueeze(1)           # (T, 1, F)
            lp, n = model(x, torch.tensor([len(frames[s])]))
            tgt = torch.as_tensor(ds.targets[s], dtype=torch.long)
            loss = F.ctc_loss(lp, tgt.unsqueeze(0), n, torch.tensor([len(tgt)]),
                              blank=model.blank, reduction="sum").item()
            path = lp[:, 0].argmax(-1).tolist()
            hyp, prev = [], None
            for k in path:  # collapse repeats, drop blanks
                if k != prev and k != model.blank:
                    hyp.append(k)
                prev = k
            out[s] = (loss, hyp, lp[:, 0].numpy())
    model.train()
    return out


def _expected(ds, serial, space=None):
    sub = dels = ins = tot = ref = errs = werr = rwords = 0
    loss = 0.0
    for s in range(ds.num_seqs):
        r, h = ds.targets[s].tolist(), serial[s][1]
        a, b, c = edit_ops(r, h)
        sub, dels, ins = sub + a, dels + b, ins + c
        e = sum(edit_ops_reference(r, h))  # the Python oracle's total
        tot, ref, errs, loss = tot + e, ref + len(r), errs + (e > 0), loss + serial[s][0]
        if space is not None:
            rw, hw = split_words(r, space), split_words(h, space)
            werr, rwords = werr + sum(edit_ops_reference(rw, hw)), rwords + len(rw)
    return dict(sub=sub, dels=dels, ins=ins, tot=tot, ref=ref, errs=errs, loss=loss,
                werr=werr, rwords=rwords)


@pytest.mark.parametrize("workers,batch_frames,chunk_frames", [(1, 40, 2_000_000),
                                                                (2, 40, 500), (2, 400, 2_000_000)])
def test_counts_equal_a_serial_computation(setup, workers, batch_frames, chunk_frames):
    path, model, serial = setup
    ds = Dataset.open(str(path), chunk_frames=chunk_frames)
    keep = np.ones(ds.num_seqs, bool)
    hyps, seen = {}, []
    c = evaluate(model, ds, keep, batch_frames, torch.device("cpu"), space=SPACE,
                 workers=workers, on_hyp=hyps.__setitem__,
                 on_log_probs=lambda s, lp, n: seen.append((s, lp, n)))["best"]
    want = _expected(ds, serial, SPACE)
    assert want["tot"] > 10 and want["sub"] and want["dels"] and want["ins"]  # a real test
    assert (c.sub, c.dels, c.ins) == (want["sub"], want["dels"], want["ins"])
    assert c.sub + c.dels + c.ins == want["tot"]
    assert (c.ref_labels, c.seqs, c.seq_errors) == (want["ref"], ds.num_seqs, want["errs"])
    assert (c.word_errors, c.ref_words) == (want["werr"], want["rwords"])
    assert c.frames == int(ds.lengths.sum()) and c.skipped == 0
    assert c.loss_sum == pytest.approx(want["loss"], rel=1e-5)
    assert {s: serial[s][1] for s in range(ds.num_seqs)} == hyps
    got = {}
    for seqs, lp, n in seen:
        for j, s in enumerate(seqs):
            got[s] = lp[: n[j], j]
    assert sorted(got) == list(range(ds.num_seqs))
    for s, lp in got.items():
        np.testing.assert_allclose(lp, serial[s][2], atol=1e-5)


def test_skipped_and_beam_counts(setup):
    from rnntrain.decode.beam import Decoder
    path, model, serial = setup
    ds = Dataset.open(str(path))
    keep = np.ones(ds.num_seqs, bool)
    keep[[3, 7]] = False
    dec = Decoder(ds.labels, model.blank, beam=4)
    counts = evaluate(model, ds, keep, 60, torch.device("cpu"), decoder=dec, workers=2)
    b, best = counts["beam"], counts["best"]
    assert best.skipped == 2 and best.seqs == ds.num_seqs - 2
    want = [dec.decode(serial[s][2], len(serial[s][2])) for s in np.flatnonzero(keep)]
    refs = [ds.targets[s].tolist() for s in np.flatnonzero(keep)]
    assert b.sub + b.dels + b.ins == sum(sum(edit_ops_reference(r, h))
                                         for r, h in zip(refs, want))
    assert (b.loss_sum, b.frames, b.skipped) == (best.loss_sum, best.frames, 2)


def test_a_small_set_is_cut_into_enough_batches_and_counts_the_same(setup):
    """A set that would make a few batches of the budget is cut into at least
    EVAL_MIN_BATCHES (so no worker idles through the last one), and every count is still
    the serial computation's."""
    from rnntrain.run.evaluate import EVAL_BATCH_SCALE, EVAL_MIN_BATCHES
    path, model, serial = setup
    ds = Dataset.open(str(path))
    keep = np.ones(ds.num_seqs, bool)
    total = int(ds.lengths.sum())
    batch_frames = total // (2 * EVAL_BATCH_SCALE)   # the budget: 4 batches' worth, or 5
    seen = []
    c = evaluate(model, ds, keep, batch_frames, torch.device("cpu"), workers=2,
                 on_log_probs=lambda s, lp, n: seen.append(len(s)))["best"]
    assert len(seen) >= EVAL_MIN_BATCHES and sum(seen) == ds.num_seqs
    want = _expected(ds, serial)
    assert (c.sub, c.dels, c.ins, c.ref_labels, c.seq_errors) == \
        (want["sub"], want["dels"], want["ins"], want["ref"], want["errs"])
    assert c.loss_sum == pytest.approx(want["loss"], rel=1e-5)
