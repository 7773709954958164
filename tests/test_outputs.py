"""What comes back from decoding: alignments, spans, confidences, n-best lists,
temperature calibration and per-label correctness, each against an independent
computation (brute-force enumeration of CTC paths, the numpy CTC of ctc_reference, the
Python prefix beam search, rapidfuzz's edit counts)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import rnntrain
from rnntrain.decode.align import align, ctc_log_prob, path_positions, viterbi_positions
from rnntrain.decode.beam import Decoder
from rnntrain.decode.calibrate import LabelSamples, ece, fit_temperature, nll
from rnntrain.decode.score import edit_alignment, edit_ops_batch, hyp_correct
from rnntrain.decode.search import best_path, prefix_beam_nbest
from tests.ctc_reference import ctc_loss


def collapse(path, blank):
    out, prev = [], -1
    for p in path:
        if p != prev and p != blank:
            out.append(p)
        prev = p
    return out


def all_paths(T, C):
    return itertools.product(range(C), repeat=T)


def runs_of(path, blank):
    """[(start, end)] of each label's run of frames on a path (end exclusive)."""
    out, t = [], 0
    while t < len(path):
        e = t
        while e + 1 < len(path) and path[e + 1] == path[t]:
            e += 1
        if path[t] != blank:
            out.append((t, e + 1))
        t = e + 1
    return out


def softmax_t(lp, temperature):
    z = np.exp(lp / temperature)
    return z / z.sum(-1, keepdims=True)


@pytest.mark.parametrize("hyp", [[0, 1], [1, 1], [2], [0, 2, 0], []])
@pytest.mark.parametrize("temperature", [1.0, 2.5, 0.5])
def test_spans_and_confidences_follow_the_brute_force_best_alignment(hyp, temperature):
    rng = np.random.default_rng(len(hyp) * 7 + sum(hyp))
    T, C, blank = 7, 4, 3
    lp = np.log(rng.dirichlet(np.ones(C) * 0.7, size=T))
    paths = [p for p in all_paths(T, C) if collapse(p, blank) == hyp]
    best = max(paths, key=lambda p: sum(lp[t, c] for t, c in enumerate(p)))
    runs = runs_of(best, blank)
    a = align(lp, hyp, blank, temperature)
    assert list(zip(a.starts, a.ends)) == runs
    # start/end contain the label's aligned frames and nothing of another label's
    for j, (s, e) in enumerate(runs):
        assert all(best[t] == hyp[j] for t in range(s, e))
    probs = softmax_t(lp, temperature)
    want = [max(probs[t, hyp[j]] for t in range(s, e)) for j, (s, e) in enumerate(runs)]
    np.testing.assert_allclose(a.confidences, want, rtol=1e-12)
    assert all(0 < c <= 1 for c in a.confidences)
    assert a.peaks == [max(range(s, e), key=lambda t: lp[t, hyp[j]]) for j, (s, e) in
                       enumerate(runs)]
    # the log-probability of the hypothesis: every alignment summed
    if hyp:
        brute = np.logaddexp.reduce([sum(lp[t, c] for t, c in enumerate(p)) for p in paths])
        assert ctc_log_prob(lp, hyp, blank) == pytest.approx(brute, abs=1e-10)
        assert ctc_log_prob(lp, hyp, blank) == pytest.approx(-ctc_loss(lp, hyp, blank),
                                                             abs=1e-10)


def test_best_path_positions_are_its_own_viterbi_alignment():
    rng = np.random.default_rng(3)
    T, C, blank = 40, 6, 5
    for _ in range(20):
        lp = np.log(rng.dirichlet(np.ones(C) * 0.5, size=T))
        path = np.argmax(lp, 1)
        hyp = best_path(lp, T, blank)
        np.testing.assert_array_equal(path_positions(path, blank),
                                      viterbi_positions(lp, hyp, blank))


def test_nbest_is_sorted_and_its_first_entry_is_the_beams_best():
    rng = np.random.default_rng(5)
    for trial in range(30):
        T, C = int(rng.integers(5, 40)), int(rng.integers(3, 8))
        lp = np.log(rng.dirichlet(np.ones(C) * 0.4, size=T)).astype(np.float32)
        blank, beam = C - 1, int(rng.integers(2, 9))
        dec = Decoder([str(k) for k in range(C - 1)], blank, beam=beam)
        nb = dec.decode_nbest(lp, None, beam)
        scores = [s for _, s in nb]
        assert scores == sorted(scores, reverse=True)
        assert nb[0] == dec.decode_scored(lp)
        assert len({tuple(h) for h, _ in nb}) == len(nb)
        # the compiled search's list is the Python oracle's
        oracle = prefix_beam_nbest(lp, T, blank, beam, beam)
        assert [h for h, _ in nb] == [h for h, _ in oracle]
        np.testing.assert_allclose(scores, [s for _, s in oracle], rtol=0, atol=1e-9)


def test_nbest_of_an_unpruned_beam_is_the_exact_ranking_of_every_label_sequence():
    """With a beam wider than every prefix, no path is lost: each score is log P_ctc and
    the list is the top of all label sequences ranked by brute force."""
    rng = np.random.default_rng(11)
    T, C, blank = 5, 3, 2
    lp = np.log(rng.dirichlet(np.ones(C), size=T))
    totals: dict[tuple, float] = {}
    for p in all_paths(T, C):
        k = tuple(collapse(p, blank))
        totals[k] = np.logaddexp(totals.get(k, -np.inf), sum(lp[t, c] for t, c in enumerate(p)))
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:6]
    nb = Decoder(["a", "b"], blank, beam=64).decode_nbest(lp, None, 6)
    assert [tuple(h) for h, _ in nb] == [k for k, _ in ranked]
    np.testing.assert_allclose([s for _, s in nb], [v for _, v in ranked], atol=1e-9)
    for h, s in nb:
        assert ctc_log_prob(lp, h, blank) == pytest.approx(s, abs=1e-9)


def test_edit_alignment_counts_match_rapidfuzz_and_rebuild_both_strings():
    rng = np.random.default_rng(2)
    refs, hyps = [], []
    for _ in range(300):
        refs.append(rng.integers(0, 4, rng.integers(0, 9)).tolist())
        hyps.append(rng.integers(0, 4, rng.integers(0, 9)).tolist())
    S, D, I = edit_ops_batch(refs, hyps)
    for r, h, s, d, i in zip(refs, hyps, S, D, I):
        al = edit_alignment(r, h)
        assert [a for a, _ in al if a is not None] == r
        assert [b for _, b in al if b is not None] == h
        assert sum(a is not None and b is not None and a != b for a, b in al) == s
        assert sum(b is None for _, b in al) == d
        assert sum(a is None for a, _ in al) == i
        ok = hyp_correct(r, h)
        assert len(ok) == len(h) and ok.sum() == len(r) - s - d


def _overconfident_set(rng, n_utt, C=6, blank=5):
    """Utterances whose network output is sharper than its accuracy: each label's frames
    carry a logit margin m for the emitted class, which is the reference's with
    probability sigmoid(m - 5) only (a net trusting m too much)."""
    out = []
    for _ in range(n_utt):
        ref = rng.integers(0, blank, rng.integers(3, 8)).tolist()
        rows, hyp = [], []
        for k in ref:
            m = rng.uniform(2, 12)
            emitted = k if rng.random() < 1 / (1 + np.exp(-(m - 5))) else \
                int(rng.choice([c for c in range(blank) if c != k]))
            hyp.append(emitted)
            for _ in range(2):
                z = rng.normal(0, 0.3, C)
                z[emitted] += m
                rows.append(z)
            z = rng.normal(0, 0.3, C)
            z[blank] += 10
            rows.append(z)
        z = np.array(rows)
        lp = z - np.log(np.exp(z).sum(1, keepdims=True))
        out.append((lp, ref))
    return out


def test_a_temperature_fitted_on_one_half_lowers_ece_on_the_other():
    rng = np.random.default_rng(0)
    data = _overconfident_set(rng, 400)
    blank = 5
    fit, held = LabelSamples(), LabelSamples()
    for i, (lp, ref) in enumerate(data):
        hyp = best_path(lp, len(lp), blank)
        (fit if i % 2 == 0 else held).add(lp, hyp, ref, blank)
    cal = fit_temperature(fit)
    assert cal.temperature > 1.2          # over-confident: the posteriors are softened
    assert cal.ece_after < cal.ece_before and cal.nll_after < cal.nll_before
    arrays = held.arrays()
    correct = arrays[3]
    before, after = held.confidences(1.0, arrays), held.confidences(cal.temperature, arrays)
    assert ece(after, correct) < 0.5 * ece(before, correct)
    assert nll(after, correct) < nll(before, correct)
    # the fit's confidences are align()'s: one utterance recomputed directly
    lp, ref = data[1]
    hyp = best_path(lp, len(lp), blank)
    one = LabelSamples()
    one.add(lp, hyp, ref, blank)
    np.testing.assert_allclose(one.confidences(cal.temperature),
                               align(lp, hyp, blank, cal.temperature).confidences, rtol=1e-5)


def test_a_set_without_a_wrong_label_keeps_temperature_one():
    """Every emitted label correct (the 4 held-out lines of a fine-tuning): no temperature
    is fitted (the NLL would fall toward the range's end, T = 0.05), T stays 1, the
    figures are those at T = 1."""
    rng = np.random.default_rng(1)
    blank, good = 5, LabelSamples()
    for lp, ref in _overconfident_set(rng, 200):
        hyp = best_path(lp, len(lp), blank)
        if hyp == list(ref):
            good.add(lp, hyp, ref, blank)
    arrays = good.arrays()
    assert len(arrays[3]) > 20 and arrays[3].all()
    cal = fit_temperature(good)
    assert cal.temperature == 1.0 and cal.accuracy == 1.0
    assert cal.ece_after == cal.ece_before == ece(good.confidences(1.0, arrays), arrays[3])


def test_ece_by_hand():
    conf = np.array([0.95, 0.95, 0.55, 0.45, 0.05])
    correct = np.array([1, 0, 1, 1, 0], bool)
    # bins (15 wide): 0.95 -> 14, 0.55 -> 8, 0.45 -> 6, 0.05 -> 0
    want = (2 * abs(0.5 - 0.95) + abs(1 - 0.55) + abs(1 - 0.45) + abs(0 - 0.05)) / 5
    assert ece(conf, correct) == pytest.approx(want)


# ---------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small .nc file with targets and a random-weight checkpoint for it; the network's
    own log-probabilities per sequence (the reference for what the commands print)."""
    from data_tools.synth import write_synth
    from rnntrain.data.ncdata import read_file
    from tests.test_infer import make_checkpoint, reference_log_probs
    d = tmp_path_factory.mktemp("outputs")
    write_synth(str(d / "val.nc"), num_seqs=8, num_labels=4, input_size=8, seed=2)
    h, seqs = read_file(d / "val.nc")
    net = make_checkpoint(d / "m.pt", h.input_size, h.labels, seed=3)
    return d, h, reference_log_probs(net, seqs)


def _main(capsys, *argv):
    from rnntrain.cli import main
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_decode_json_full_and_nbest_agree_with_the_network(tiny, capsys):
    d, h, lps = tiny
    blank = len(h.labels)
    plain = _main(capsys, "decode", d / "m.pt", d / "val.nc")
    assert all(len(ln.split("\t")) == 2 for ln in plain.splitlines())  # unchanged format
    recs = [json.loads(ln) for ln in _main(capsys, "decode", d / "m.pt", d / "val.nc",
                                            "--json").splitlines()]
    assert [r["tag"] for r in recs] == [ln.split("\t")[0] for ln in plain.splitlines()]
    for r, lp in zip(recs, lps):
        hyp = best_path(lp, len(lp), blank)
        assert r["labels"] == [h.labels[k] for k in hyp]
        a = align(lp, hyp, blank)
        assert r["start_frames"] == a.starts and r["end_frames"] == a.ends
        np.testing.assert_allclose(r["confidences"], a.confidences, atol=2e-6)
        assert r["unit"] == "frame" and r["starts"] == a.starts and r["temperature"] == 1.0
        assert r["log_prob"] == pytest.approx(ctc_log_prob(lp, hyp, blank), abs=1e-3)
    # --full: the same figures as TSV columns; --nbest 3 --beam 4: three ranked lines each
    full = _main(capsys, "decode", d / "m.pt", d / "val.nc", "--full").splitlines()
    for ln, r in zip(full, recs):
        cols = ln.split("\t")
        assert len(cols) == 8 and cols[1] == " ".join(r["labels"]) and cols[7] == "1"
        assert [float(c) for c in cols[3].split()] == pytest.approx(r["confidences"], abs=1e-4)
        assert [int(c) for c in cols[4].split()] == r["start_frames"]
        assert [int(c) for c in cols[5].split()] == r["end_frames"]
    lines = _main(capsys, "decode", d / "m.pt", d / "val.nc", "--nbest", "3", "--beam",
                  "4").splitlines()
    one = _main(capsys, "decode", d / "m.pt", d / "val.nc", "--beam", "4").splitlines()
    by_tag: dict[str, list] = {}
    for ln in lines:
        cols = ln.split("\t")
        by_tag.setdefault(cols[0], []).append((int(cols[7]), float(cols[6]), cols[1]))
    for ln in one:
        tag, hyp = ln.split("\t")
        got = by_tag[tag]
        assert [g[0] for g in got] == [1, 2, 3]
        assert [g[1] for g in got] == sorted([g[1] for g in got], reverse=True)
        assert got[0][2] == hyp                     # the first is the beam's best


def test_nbest_wider_than_the_beam_is_one_clear_line(tiny, capsys):
    from rnntrain.cli import main
    d, _, _ = tiny
    assert main(["decode", str(d / "m.pt"), str(d / "val.nc"), "--nbest", "5", "--beam",
                 "3"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--nbest 5" in err, err


def test_transcribe_gives_seconds_from_the_front_end(tmp_path, capsys):
    """Audio: start/end in seconds = frames x hop x stacking; they contain the peaks."""
    from scipy.io import wavfile
    from rnntrain.frontend import FrontEnd
    from rnntrain.frontend.features import FeatureConfig
    from tests.test_infer import make_checkpoint
    fc = FeatureConfig()
    fe = FrontEnd("audio", fc.size, np.zeros(fc.size), np.ones(fc.size), fc)
    make_checkpoint(tmp_path / "a.pt", fc.size, ["a", "b", "c"], frontend=fe.to_dict(),
                    subsample=2, seed=1)
    rng = np.random.default_rng(0)
    wavfile.write(tmp_path / "x.wav", fc.rate,
                  (rng.standard_normal(fc.rate) * 3000).astype(np.int16))
    rec = json.loads(_main(capsys, "transcribe", tmp_path / "a.pt", tmp_path / "x.wav",
                           "--json"))
    fs = fe.frame_seconds * 2
    assert rec["unit"] == "s" and rec["labels"]
    assert rec["starts"] == pytest.approx([f * fs for f in rec["start_frames"]], abs=1e-6)
    assert rec["ends"] == pytest.approx([f * fs for f in rec["end_frames"]], abs=1e-6)
    for s, e, t in zip(rec["starts"], rec["ends"], rec["times"]):
        assert s <= t < e <= rec["duration_s"] + 1e-9
    assert all(0 < c <= 1 for c in rec["confidences"])


def test_eval_details_counts_match_an_independent_edit_distance(tiny, tmp_path, capsys):
    d, h, lps = tiny
    from rnntrain.data.dataset import Dataset
    ds = Dataset.open(str(d / "val.nc"), 10**6)
    out = json.loads(_main(capsys, "eval", d / "m.pt", d / "val.nc", "--json", "--details",
                           tmp_path / "errs.txt"))
    text = (tmp_path / "errs.txt").read_text()
    blank = len(h.labels)
    refs = [ds.targets[i].tolist() for i in range(ds.num_seqs)]
    hyps = [best_path(lp, len(lp), blank) for lp in lps]
    S, D, I = (int(x.sum()) for x in edit_ops_batch(refs, hyps))
    N = sum(map(len, refs))
    assert f"[{S + D + I} / {N}, {I} ins, {D} del, {S} sub]" in text
    assert out["ler"] == pytest.approx((S + D + I) / N)
    # per sequence: the ref/hyp lines, and marks that rebuild both
    lines = text.splitlines()
    names = h.labels
    for i in range(ds.num_seqs):
        tag = ds.tag(i)
        assert f"{tag}:\tref={' '.join(names[k] for k in refs[i])}" in lines
        assert f"{tag}:\thyp={' '.join(names[k] for k in hyps[i])}" in lines
        marks = [ln for ln in lines if ln.startswith(f"{tag}:\t") and "=" not in ln]
        assert len(marks) == 1
        r_side, h_side = [], []
        for m in marks[0].split("\t")[1].split():
            if m.startswith("("):
                a, b = m[1:-1].split("->")
                r_side += [a] if a != "*" else []
                h_side += [b] if b != "*" else []
            else:
                r_side.append(m)
                h_side.append(m)
        assert r_side == [names[k] for k in refs[i]] and h_side == [names[k] for k in hyps[i]]
    # the sections' totals are the counts
    sec = text.split("SUBSTITUTIONS: count ref -> hyp\n")[1]
    sub_part, rest = sec.split("DELETIONS: count ref\n")
    del_part, ins_part = rest.split("INSERTIONS: count hyp\n")
    counts = [[int(ln.split()[0]) for ln in p.splitlines() if ln.strip()]
              for p in (sub_part, del_part, ins_part)]
    assert [sum(c) for c in counts] == [S, D, I]
    assert all(c == sorted(c, reverse=True) for c in counts)


def test_image_spans_are_columns_of_the_image_file(tmp_path, capsys):
    """Images scaled to 12 px high: spans are given in the file's own columns, inside the
    image, and contain the columns the label's frames were prepared from."""
    from PIL import Image
    from rnntrain.frontend.images import prepare_geometry
    from tests.test_infer_images import image_run
    run, ds, net, names = image_run(tmp_path / "d", "columns", 12)
    m = rnntrain.load(run)
    for name in names[:3]:
        path = tmp_path / "d" / name
        rec = json.loads(_main(capsys, "transcribe", run, path, "--json"))
        width = Image.open(path).size[0]
        a, geo = prepare_geometry(path, m.image.settings)
        assert rec["unit"] == "px" and rec["labels"] and a.shape[1] != width  # scaled
        k = m.subsample
        # independently: prepared column c comes from original x0 + (c - pad) / scale
        want = [min(max(geo.x0 + (f * k - geo.pad) / geo.scale, 0), width)
                for f in rec["start_frames"]]
        assert rec["starts"] == pytest.approx(want, abs=1e-3)
        want = [min(max(geo.x0 + (f * k - geo.pad) / geo.scale, 0), width)
                for f in rec["end_frames"]]
        assert rec["ends"] == pytest.approx(want, abs=1e-3)
        assert all(0 <= s < e <= width for s, e in zip(rec["starts"], rec["ends"]))
        # the Python API gives the same spans
        t = m.transcribe(path)
        assert t.span_starts == rec["starts"] and t.span_ends == rec["ends"]


# ---------------------------------------------------------------- calibration in checkpoints


def test_calibrate_command_stores_the_fit_that_an_independent_fit_finds(tiny, tmp_path,
                                                                        capsys):
    import torch
    d, h, lps = tiny
    from rnntrain.data.dataset import Dataset
    ds = Dataset.open(str(d / "val.nc"), 10**6)
    blank = len(h.labels)
    samples = LabelSamples()
    for i, lp in enumerate(lps):
        samples.add(lp, best_path(lp, len(lp), blank), ds.targets[i].tolist(), blank)
    want = fit_temperature(samples)
    assert want.labels > 0
    out = _main(capsys, "calibrate", d / "m.pt", d / "val.nc", "--out", tmp_path / "c.pt")
    assert "expected calibration error" in out and str(tmp_path / "c.pt") in out
    ck = torch.load(tmp_path / "c.pt", weights_only=True)
    cal = ck["calibration"]
    assert cal["temperature"] == pytest.approx(want.temperature, rel=1e-3)
    assert cal["ece_before"] == pytest.approx(want.ece_before, abs=1e-4)
    assert cal["ece_after"] == pytest.approx(want.ece_after, abs=1e-4)
    assert torch.load(d / "m.pt", weights_only=True).get("calibration") is None  # --out: a copy
    # the calibrated model's confidences use it; the hypotheses do not change
    recs = [json.loads(ln) for ln in _main(capsys, "decode", tmp_path / "c.pt", d / "val.nc",
                                            "--json").splitlines()]
    for r, lp in zip(recs, lps):
        hyp = best_path(lp, len(lp), blank)
        assert r["temperature"] == cal["temperature"] and r["labels"] == [h.labels[k]
                                                                         for k in hyp]
        np.testing.assert_allclose(r["confidences"],
                                   align(lp, hyp, blank, cal["temperature"]).confidences,
                                   atol=2e-6)
    m = rnntrain.load(tmp_path / "c.pt")
    assert m.temperature == cal["temperature"]
    # an export carries it: the metadata an export writes reads back with it
    from rnntrain.infer.model import Meta
    assert Meta.from_json(m.meta.to_json(), "export").temperature == cal["temperature"]


def test_a_broken_calibration_record_is_one_line(tiny, tmp_path, capsys):
    import torch
    from rnntrain.cli import main
    d, _, _ = tiny
    ck = torch.load(d / "m.pt", weights_only=True)
    ck["calibration"] = {"temperature": float("nan")}
    torch.save(ck, tmp_path / "bad.pt")
    assert main(["transcribe", str(tmp_path / "bad.pt"), str(d / "val.nc")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "calibration" in err and "bad.pt" in err
    # --check on a checkpoint never calibrated
    assert main(["calibrate", str(d / "m.pt"), str(d / "val.nc"), "--check"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not calibrated" in err


def test_training_ends_with_a_calibrated_best_checkpoint(synth_pair, tmp_path):
    """A tiny real training: best.pt holds the temperature fitted on the validation set
    and the log says the ECE before and after."""
    import torch
    from tests.conftest import train_here
    train, val = synth_pair
    run = train_here(None, f"data.train={train}", f"data.val={val}", "model.layers=1",
                     "model.hidden=16", "train.epochs=2", "compute.threads=1",
                     f"run.dir={tmp_path / 'run'}")
    cal = torch.load(run / "checkpoints" / "best.pt", weights_only=True)["calibration"]
    assert cal["temperature"] > 0 and cal["labels"] > 0 and cal["data"] == str(val)
    assert cal["nll_after"] <= cal["nll_before"] + 1e-12
    assert "expected calibration error" in (run / "train.log").read_text()
    assert rnntrain.load(run).temperature == cal["temperature"]
    # --check: the stored temperature scored again on the set it was fitted on
    import contextlib
    import io
    from rnntrain.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["calibrate", str(run), str(val), "--check", "--json"]) == 0
    got = json.loads(buf.getvalue())
    assert got["temperature"] == cal["temperature"] and got["labels"] == cal["labels"]
    assert got["ece_before"] == pytest.approx(cal["ece_before"], abs=1e-9)
    assert got["ece_after"] == pytest.approx(cal["ece_after"], abs=1e-9)


# ---------------------------------------------------------------- PAGE-XML in and out


def test_page_xml_in_page_xml_out(tmp_path, capsys):
    """A PAGE page with rotated lines: one output line per TextLine (text-less ones too),
    each the hypothesis of the crop that rnntrain-data pagexml cuts; --page-out writes the
    page back with one TextEquiv per line (its text, @conf the mean label confidence),
    everything else kept."""
    import xml.etree.ElementTree as ET
    from data_tools.pagexml import PageCache, crop_line, page_image, parse_page
    from tests.test_infer_images import image_run
    from tests.test_ocr_data import PAGE_NS, rotated_page
    run = image_run(tmp_path / "m", "columns", 12)[0]
    (tmp_path / "p").mkdir()
    xml, _ = rotated_page(tmp_path / "p", "2019")
    (tmp_path / "out").mkdir()
    recs = [json.loads(ln) for ln in _main(capsys, "transcribe", run, xml, "--json",
                                            "--page-out", tmp_path / "out").splitlines()]
    assert [r["input"] for r in recs] == [f"{xml}#{i}" for i in ("l0", "l1", "l2", "empty")]
    assert sum(len(r["labels"]) for r in recs) > 3   # the checks below are not vacuous
    # the same crops, cut by the converter's functions, transcribed through the Python API
    m = rnntrain.load(run)
    page = parse_page(xml, with_empty=True)
    cache = PageCache()
    grey = cache.get(page_image(page), "page")
    for ln, r in zip(page.lines, recs):
        (x0, _, x1, _), crop = crop_line(grey, cache.paper, ln, 0, True, ln.id)
        assert m.transcribe(crop).labels == r["labels"]
        assert r["unit"] == "px"
        if ln.id == "l0" and r["labels"]:     # unrotated: spans lie in the line's box
            assert all(x0 <= s < e <= x1 for s, e in zip(r["starts"], r["ends"]))
    ns = {"p": PAGE_NS["2019"]}
    root = ET.parse(tmp_path / "out" / "page.xml").getroot()
    assert root.tag == f"{{{PAGE_NS['2019']}}}PcGts"
    assert root.find("p:Page", ns).get("imageFilename") == "img/page.png"
    assert root.find(".//p:TextRegion/p:Coords", ns) is not None
    for r in recs:
        line = root.find(f".//p:TextLine[@id='{r['input'].rsplit('#', 1)[1]}']", ns)
        eqs = line.findall("p:TextEquiv", ns)
        assert len(eqs) == 1 and "wrong" not in ET.tostring(line, encoding="unicode")
        assert (eqs[0].find("p:Unicode", ns).text or "") == r["text"]
        if r["confidences"]:
            mean = sum(r["confidences"]) / len(r["confidences"])
            assert float(eqs[0].get("conf")) == pytest.approx(mean, abs=1e-4)
        # one Glyph per non-space label, in order, with its confidence and span
        glyphs = line.findall("p:Word/p:Glyph", ns)
        keep = [k for k, c in enumerate(r["text"]) if not c.isspace()] \
            if len(r["text"]) == len(r["labels"]) else list(range(len(r["labels"])))
        assert len(glyphs) == len(keep)
        for g, k in zip(glyphs, keep):
            assert float(g.find("p:TextEquiv", ns).get("conf")) == pytest.approx(
                r["confidences"][k], abs=1e-4)
            xs = [int(p.split(",")[0]) for p in g.find("p:Coords", ns).get("points").split()]
            assert min(xs) == round(r["starts"][k])
        words = line.findall("p:Word", ns)
        assert " ".join((w.find("p:TextEquiv/p:Unicode", ns).text or "") for w in words) \
            == " ".join(r["text"].split()) or len(r["text"]) != len(r["labels"])
        assert line.find("p:Coords", ns) is not None
        # TextEquiv after Coords and Baseline, as the schema orders them
        tags = [c.tag.rsplit("}", 1)[1] for c in line]
        assert tags.index("TextEquiv") > tags.index("Coords")


def test_page_out_writes_back_lines_without_an_id(tmp_path, capsys):
    """TextLines without @id (invalid PAGE, found in the wild) are transcribed as #n (their
    place on the page) and written back: each gets an unused id and the text its crop
    reads, the same text as the page with ids gives, and a note says so."""
    import xml.etree.ElementTree as ET
    from tests.test_infer_images import image_run
    from tests.test_ocr_data import PAGE_NS, rotated_page
    run = image_run(tmp_path / "m", "columns", 12)[0]
    (tmp_path / "p").mkdir()
    xml, _ = rotated_page(tmp_path / "p", "2019")
    (tmp_path / "q").mkdir()
    import shutil
    shutil.copytree(tmp_path / "p" / "img", tmp_path / "q" / "img")
    bare = tmp_path / "q" / "page.xml"   # l0 keeps its id, l1 loses it, l2 takes "line_2"
    bare.write_text(xml.read_text().replace('<TextLine id="l1">', "<TextLine>")
                    .replace('<TextLine id="l2">', '<TextLine id="line_2">'))
    for d in ("out", "out2"):
        (tmp_path / d).mkdir()
    want = {json.loads(ln)["input"].rsplit("#", 1)[1]: json.loads(ln)["text"] for ln in _main(
        capsys, "transcribe", run, xml, "--json", "--page-out", tmp_path / "out").splitlines()}
    from rnntrain.cli import main
    assert main(["transcribe", str(run), str(bare), "--json", "--page-out",
                 str(tmp_path / "out2")]) == 0
    out = capsys.readouterr()
    got = [json.loads(ln) for ln in out.out.splitlines()]
    assert "1 TextLine(s) without an id got one" in out.err
    assert [r["input"] for r in got] == [f"{bare}#{i}" for i in ("l0", "#2", "line_2", "empty")]
    ns = {"p": PAGE_NS["2019"]}
    lines = ET.parse(tmp_path / "out2" / "page.xml").getroot().findall(".//p:TextLine", ns)
    # "line_2" is taken (by the third line): the second gets the next unused one
    assert [ln.get("id") for ln in lines] == ["l0", "line_2_", "line_2", "empty"]
    texts = [(ln.find("p:TextEquiv/p:Unicode", ns).text or "") for ln in lines]
    assert texts == [want["l0"], want["l1"], want["l2"], want["empty"]]
    assert all(w.get("id", "").startswith(lines[1].get("id") + "_w")
               for w in lines[1].findall("p:Word", ns))


def test_page_out_refuses_before_any_work(tmp_path, capsys):
    from rnntrain.cli import main
    from tests.test_ocr_data import rotated_page
    (tmp_path / "p").mkdir()
    xml, _ = rotated_page(tmp_path / "p", "2013")
    # writing the page over its input, and a --page-out that is not a folder
    for out in (xml.parent, tmp_path / "nothere"):
        assert main(["transcribe", str(tmp_path / "m.pt"), str(xml), "--page-out",
                     str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--page-out" in err, err
    assert "TextEquiv index=\"2\"" in xml.read_text()   # the input is untouched


def test_eval_details_with_space_adds_a_word_report_matching_the_wer(tiny, tmp_path, capsys):
    d, h, _ = tiny
    out = json.loads(_main(capsys, "eval", d / "m.pt", d / "val.nc", "--json", "--space",
                           h.labels[1], "--details", tmp_path / "errs.txt"))
    text = (tmp_path / "errs.txt").read_text()
    assert text.count("%LER ") == 1 and text.count("%WER ") == 1
    line = next(ln for ln in text.splitlines() if ln.startswith("%WER "))
    e, n = line.split("[")[1].split(",")[0].split(" / ")
    assert int(n) == out["ref_words"] and int(e) / int(n) == pytest.approx(out["wer"])
