"""Fast edit distance, compiled beam search, lexicon and n-gram LM decoding, ARPA files,
and the n-gram builder: against the Python oracles, brute-force enumeration and
hand-computed probabilities."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from data_tools.ngram import build, sentences, write_arpa
from rnntrain.decode.beam import Decoder, _lm_step
from rnntrain.decode.lm import LN10, UNK_FLOOR, ArpaLM
from rnntrain.decode.score import (ErrorCounts, edit_ops, edit_ops_batch, edit_ops_reference,
                                   label_errors, padded_as_strings, ragged_as_strings,
                                   split_words)
from rnntrain.decode.search import best_path, best_path_batch, prefix_beam_search
from rnntrain.errors import UserError


def _log_softmax(u):
    return u - np.log(np.exp(u).sum(-1, keepdims=True))


# -- edit distance --------------------------------------------------------------------

def test_edit_ops_totals_equal_the_python_dp_on_random_strings():
    rng = np.random.default_rng(0)
    refs, hyps = [], []
    for _ in range(3000):
        refs.append(rng.integers(0, 4, rng.integers(0, 10)).tolist())
        hyps.append(rng.integers(0, 4, rng.integers(0, 10)).tolist())
    s, d, i = edit_ops_batch(refs, hyps)
    for k, (r, h) in enumerate(zip(refs, hyps)):
        want = edit_ops_reference(r, h)
        assert s[k] + d[k] + i[k] == sum(want), (r, h)
        assert i[k] - d[k] == len(h) - len(r)
        assert s[k] >= want[0]  # the tie rule: the most substitutions among minimal ones
        assert edit_ops(r, h) == (s[k], d[k], i[k])
    assert label_errors(refs, hyps).tolist() == (s + d + i).tolist()


def test_edit_ops_tie_rule_prefers_substitutions():
    assert edit_ops([1, 2], [2, 1]) == (2, 0, 0)
    assert edit_ops([], [3, 3]) == (0, 0, 2) and edit_ops([3], []) == (0, 1, 0)
    assert edit_ops([1, 2, 3], [1, 3]) == (0, 1, 0)


def test_vectorised_best_path_and_string_keys_match_the_per_sequence_path():
    rng = np.random.default_rng(1)
    T, N, C = 40, 9, 6
    lp = rng.normal(size=(T, N, C))
    lengths = rng.integers(0, T + 1, N)
    hyp, n = best_path_batch(lp.argmax(-1), lengths, C - 1)
    targets = [rng.integers(0, C - 1, rng.integers(0, 12)) for _ in range(N)]
    refs, ref_len = ragged_as_strings(targets)
    got = label_errors(refs, padded_as_strings(hyp, n))
    for j in range(N):
        assert hyp[j, :n[j]].tolist() == best_path(lp[:, j], int(lengths[j]), C - 1)
        assert got[j] == sum(edit_ops_reference(targets[j].tolist(), hyp[j, :n[j]].tolist()))
    assert ref_len.tolist() == [len(t) for t in targets]


def test_error_counts_word_error_rate():
    c = ErrorCounts()
    sp = 9
    # ref: "1 2 | 3 | 4 4" (3 words); hyp: "1 2 | 3 5 | 4 4" (one word substituted)
    c.add([1, 2, sp, 3, sp, 4, 4], [1, 2, sp, 3, 5, sp, 4, 4], space=sp)
    s = c.summary()
    assert s["wer"] == pytest.approx(1 / 3) and s["ler"] == pytest.approx(1 / 7)
    assert split_words([sp, 1, sp, sp, 2, 3], sp) == [(1,), (2, 3)]
    assert "wer" not in ErrorCounts().summary()
    back = ErrorCounts.from_array(c.as_array())
    assert (back.word_errors, back.ref_words, back.sub) == (1, 3, c.sub)


# -- compiled beam search against the Python oracle ----------------------------------

def test_compiled_beam_equals_python_oracle_on_random_inputs():
    rng = np.random.default_rng(2)
    for _ in range(150):
        C, T, beam = int(rng.integers(2, 9)), int(rng.integers(0, 40)), int(rng.integers(1, 7))
        lp = _log_softmax(rng.normal(size=(T, C)) * rng.uniform(0.5, 4))
        d = Decoder([str(k) for k in range(C)], C - 1, beam=beam)
        assert d.decode(lp) == prefix_beam_search(lp, T, C - 1, beam)


def test_compiled_beam_equals_oracle_on_500_frames_81_classes():
    rng = np.random.default_rng(3)
    lp = _log_softmax(rng.normal(size=(500, 81)) * 4).astype(np.float32)
    d = Decoder([str(k) for k in range(81)], 80, beam=8)
    assert d.decode(lp) == prefix_beam_search(lp, 500, 80, 8)
    # batch with threads: the same per sequence
    lpb = np.stack([lp[:200], lp[200:400]], 1)
    assert d.decode_batch(lpb, [200, 150], threads=2) == [
        prefix_beam_search(lp[:200], 200, 80, 8), prefix_beam_search(lp[200:400], 150, 80, 8)]


# -- brute force: every label sequence -------------------------------------------------

def _ctc_all(lp: np.ndarray, blank: int) -> dict[tuple, float]:
    """log P(l | x) for every l, summing every frame path (C^T of them)."""
    T, C = lp.shape
    acc: dict[tuple, float] = {}
    for path in itertools.product(range(C), repeat=T):
        lab, prev = [], -1
        for p in path:
            if p != prev and p != blank:
                lab.append(p)
            prev = p
        s = float(sum(lp[t, p] for t, p in enumerate(path)))
        k = tuple(lab)
        acc[k] = np.logaddexp(acc[k], s) if k in acc else s
    return acc


def _brute(lp, labels, blank, space, lm=None, alpha=0.0, beta=0.0, lexicon=None,
           word_lm=False, gamma=0.0):
    best, best_s = None, -math.inf
    for lab, ac in _ctc_all(lp, blank).items():
        names = [labels[k] for k in lab]
        if space is None:
            words = None
            count = len(lab)
        else:
            words = ["".join(names[a:b]) for a, b in _word_spans(lab, labels.index(space))]
            count = len(words)
            if lexicon is not None:
                # lexicon words only, no separator at the start or twice in a row
                sp = labels.index(space)
                if any(w not in lexicon for w in words) or (lab and lab[0] == sp) or any(
                        a == b == sp for a, b in zip(lab, lab[1:])):
                    continue
        lmv = 0.0
        if lm is not None:
            lmv = lm.sentence_logprob(words if word_lm else names)
        s = ac + alpha * lmv + beta * count + gamma * len(lab)
        if s > best_s:
            best, best_s = list(lab), s
    return best, best_s


def _word_spans(lab, sp):
    spans, start = [], 0
    for i, x in enumerate(list(lab) + [sp]):
        if x == sp:
            if i > start:
                spans.append((start, i))
            start = i + 1
    return spans


def _arpa(tmp_path, text_lines, order, name="lm.arpa", chars=False):
    p = tmp_path / "text.txt"
    p.write_text("\n".join(text_lines) + "\n")
    out = tmp_path / name
    write_arpa(build(sentences(p, chars=chars, space_token="_"), order, "kn",
                     discount_fallback=True), out)
    return ArpaLM.load(out)


@pytest.mark.parametrize("seed", range(4))
def test_label_lm_beam_matches_brute_force(tmp_path, seed):
    rng = np.random.default_rng(10 + seed)
    labels = ["a", "b", "_", "-"]  # "-" is the blank
    lm = _arpa(tmp_path, ["ab_ba", "aab", "b_a_b", "ba"], 3, chars=True)
    lp = _log_softmax(rng.normal(size=(5, 4)) * 1.5)
    alpha, beta = 0.8, 0.3
    d = Decoder(labels, 3, beam=500, space="_", lm=lm, lm_weight=alpha, word_bonus=beta)
    assert d.lm_mode == 1
    got, score = d.decode_scored(lp)
    want, want_s = _brute(lp, labels, 3, "_", lm, alpha, beta)
    assert got == want and score == pytest.approx(want_s, abs=1e-9)


@pytest.mark.parametrize("space", ["_", None])
def test_label_bonus_with_label_lm_matches_brute_force(tmp_path, space):
    """The per-label bonus is paid on every label, the separator included, with or without
    a word separator (then beside the per-label word bonus)."""
    rng = np.random.default_rng(40)
    labels = ["a", "b", "_", "-"]
    lm = _arpa(tmp_path, ["ab_ba", "aab", "b_a_b", "ba"], 3, chars=True)
    for gamma in (1.7, -0.6):
        lp = _log_softmax(rng.normal(size=(5, 4)) * 1.5)
        d = Decoder(labels, 3, beam=500, space=space, lm=lm, lm_weight=1.2, word_bonus=0.3,
                    label_bonus=gamma)
        got, score = d.decode_scored(lp)
        want, want_s = _brute(lp, labels, 3, space, lm, 1.2, 0.3, gamma=gamma)
        assert got == want and score == pytest.approx(want_s, abs=1e-9)
        # with_weights sets the label bonus too (tune-decoder's grid)
        got0, score0 = d.with_weights(1.2, 0.3, 0.0).decode_scored(lp)
        want0, want0_s = _brute(lp, labels, 3, space, lm, 1.2, 0.3)
        assert got0 == want0 and score0 == pytest.approx(want0_s, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_word_lm_and_lexicon_beam_matches_brute_force(tmp_path, seed):
    rng = np.random.default_rng(20 + seed)
    labels = ["a", "b", "_", "-"]
    lm = _arpa(tmp_path, ["ab ba", "ab", "b ab ab", "ba b"], 2)
    lex = ["ab", "b", "ba"]
    (tmp_path / "lex.txt").write_text("\n".join(lex) + "\n")
    lp = _log_softmax(rng.normal(size=(5, 4)) * 1.5)
    for lexicon in (None, tmp_path / "lex.txt"):
        d = Decoder(labels, 3, beam=500, space="_", lm=lm, lexicon=lexicon, lm_weight=1.3,
                    word_bonus=-0.4)
        assert d.lm_mode == 2
        got, score = d.decode_scored(lp)
        want, want_s = _brute(lp, labels, 3, "_", lm, 1.3, -0.4,
                              set(lex) if lexicon else None, word_lm=True)
        assert got == want and score == pytest.approx(want_s, abs=1e-9)


def test_lexicon_without_lm_matches_brute_force_and_restricts_words(tmp_path):
    rng = np.random.default_rng(30)
    labels = ["a", "b", "c", "_", "-"]
    (tmp_path / "lex.txt").write_text("abc\ncab\nb\n")
    for _ in range(3):
        lp = _log_softmax(rng.normal(size=(5, 5)) * 2)
        d = Decoder(labels, 4, beam=2000, space="_", lexicon=tmp_path / "lex.txt",
                    word_bonus=0.2)
        got, score = d.decode_scored(lp)
        want, want_s = _brute(lp, labels, 4, "_", None, 0.0, 0.2, {"abc", "cab", "b"})
        assert got == want and score == pytest.approx(want_s, abs=1e-9)
    # a narrow beam still returns lexicon words only
    lp = _log_softmax(rng.normal(size=(60, 5)) * 2)
    d = Decoder(labels, 4, beam=4, space="_", lexicon=tmp_path / "lex.txt")
    words = ["".join(labels[k] for k in w) for w in split_words(d.decode(lp), 3)]
    assert all(w in {"abc", "cab", "b"} for w in words)


def test_decoder_options_are_checked(tmp_path):
    labels = ["a", "b", "-"]
    with pytest.raises(UserError, match="--space 'x'"):
        Decoder(labels, 2, space="x")
    with pytest.raises(UserError, match="needs --space"):
        (tmp_path / "l.txt").write_text("ab\n")
        Decoder(labels, 2, lexicon=tmp_path / "l.txt")
    (tmp_path / "bad.txt").write_text("ab\nzz\n")
    with pytest.raises(UserError, match="line 2: word 'zz'"):
        Decoder(["a", "b", "_", "-"], 3, space="_", lexicon=tmp_path / "bad.txt")
    with pytest.raises(UserError, match="give --beam"):
        Decoder(labels, 2, beam=0, lm=_arpa(tmp_path, ["a b"], 2, chars=True))


# -- ARPA files -------------------------------------------------------------------------

HAND_ARPA = """\\data\\
ngram 1=5
ngram 2=3
ngram 3=1

\\1-grams:
-99\t<s>\t-0.5
-1.0\t</s>
-0.5\ta\t-0.25
-0.7\tb\t-0.1
-2.0\t<unk>

\\2-grams:
-0.2\t<s> a\t-0.3
-0.4\ta b\t-0.15
-0.6\tb a

\\3-grams:
-0.05\t<s> a b

\\end\\
"""


def test_arpa_back_off_against_hand_computed_probabilities(tmp_path):
    (tmp_path / "h.arpa").write_text(HAND_ARPA)
    lm = ArpaLM.load(tmp_path / "h.arpa")
    log10 = lambda w, h: lm.logprob(w, h) / LN10  # noqa: E731
    assert log10("b", ("<s>", "a")) == pytest.approx(-0.05)          # listed trigram
    assert log10("a", ("<s>", "a")) == pytest.approx(-0.3 + -0.25 + -0.5)  # bow(<s> a) bow(a) P(a)
    assert log10("b", ("b", "a")) == pytest.approx(-0.4)              # "b a" no bow: a b
    assert log10("</s>", ("a", "b")) == pytest.approx(-0.15 - 0.1 - 1.0)
    assert log10("a", ("b",)) == pytest.approx(-0.6)
    assert log10("zz", ("a",)) == pytest.approx(-0.25 - 2.0)          # unknown → <unk>
    assert lm.sentence_logprob(["a", "b"]) / LN10 == pytest.approx(-0.2 - 0.05 - 0.15 - 0.1 - 1.0)
    # the compiled tables give the same numbers from the state machine
    tb = lm.tables
    args = (tb.sorted_keys, tb.sorted_ids, tb.prob, tb.bow, tb.suffix, tb.order,
            tb.vocab_size, tb.max_order)
    rng = np.random.default_rng(4)
    words = ["a", "b", "</s>", "<unk>"]
    for _ in range(200):
        sent = [words[k] for k in rng.integers(0, 4, rng.integers(1, 6))]
        st, total = tb.bos_state, 0.0
        for w in sent:
            d, st = _lm_step(st, lm.token(w), *args)
            total += d
        assert total == pytest.approx(lm.sentence_logprob(sent, eos=False), abs=1e-12)


def test_arpa_errors_name_the_file_and_line(tmp_path):
    p = tmp_path / "bad.arpa"
    p.write_text(HAND_ARPA.replace("-0.6\tb a", "x\tb a"))
    with pytest.raises(UserError, match=r"bad\.arpa.*line 16.*not a number"):
        ArpaLM.load(p)
    p.write_text(HAND_ARPA.replace("ngram 2=3", "ngram 2=4"))
    with pytest.raises(UserError, match="header says 4 2-grams"):
        ArpaLM.load(p)
    p.write_text("hello\n")
    with pytest.raises(UserError, match="not an ARPA"):
        ArpaLM.load(p)


# -- the n-gram builder -----------------------------------------------------------------

CORPUS = [["a", "b"], ["a"], ["b", "a", "b"]]


def test_witten_bell_bigram_hand_computed():
    # unigram events a 3, b 3, </s> 3 (9, 3 types): γ = 3/12; |V| = 4 (a b </s> <unk>)
    # P(a) = 3/12 + 1/4 · 1/4 = 0.3125. After "a": b 2, </s> 1 → γ(a) = 2/5
    # P(b|a) = (2 + 2 · 0.3125) / 5 = 0.525, P(</s>|a) = 0.325, P(a|a) = 0.4 · 0.3125
    ng = build(CORPUS, 2, "wb")
    assert 10 ** ng[1][("a",)][0] == pytest.approx(0.3125, rel=1e-9)
    assert 10 ** ng[1][("<unk>",)][0] == pytest.approx(0.0625, rel=1e-9)
    assert 10 ** ng[2][("a", "b")][0] == pytest.approx(0.525, rel=1e-9)
    assert 10 ** ng[2][("a", "</s>")][0] == pytest.approx(0.325, rel=1e-9)
    assert 10 ** ng[1][("a",)][1] == pytest.approx(0.4, rel=1e-9)
    assert ng[1][("<s>",)][0] == -99.0


def test_modified_kneser_ney_bigram_hand_computed(tmp_path):
    # discounts 0.5, 1, 1.5 (the text is too small to estimate them). After "a":
    # a(a b) = 2, a(a </s>) = 1 → u(b|a) = 1/3, u(</s>|a) = 1/6, γ(a) = (0.5 + 1)/3.
    # Unigrams by distinct left contexts: a, b, </s> 2 each → u = 1/6, γ = 3/6;
    # P(a) = 1/6 + 1/2 · 1/4 = 7/24. P(b|a) = 1/3 + 1/2 · 7/24 = 23/48,
    # P(</s>|a) = 15/48, P(a|a) = 7/48 (back-off), P(<unk>|a) = 3/48.
    with pytest.raises(UserError, match="discount-fallback"):
        build(CORPUS, 2, "kn")
    ng = build(CORPUS, 2, "kn", discount_fallback=True)
    assert 10 ** ng[1][("a",)][0] == pytest.approx(7 / 24, rel=1e-9)
    assert 10 ** ng[2][("a", "b")][0] == pytest.approx(23 / 48, rel=1e-9)
    assert 10 ** ng[2][("a", "</s>")][0] == pytest.approx(15 / 48, rel=1e-9)
    write_arpa(ng, tmp_path / "kn.arpa")
    lm = ArpaLM.load(tmp_path / "kn.arpa")
    assert math.exp(lm.logprob("a", ("a",))) == pytest.approx(7 / 48, rel=1e-6)
    assert math.exp(lm.logprob("<unk>", ("a",))) == pytest.approx(3 / 48, rel=1e-6)


@pytest.mark.parametrize("smoothing", ["kn", "wb"])
def test_built_models_are_normalised(tmp_path, smoothing):
    rng = np.random.default_rng(5)
    text = [" ".join("abcd"[k] for k in rng.integers(0, 4, rng.integers(1, 9)))
            for _ in range(300)]
    lm = _arpa(tmp_path, text, 3) if smoothing == "kn" else None
    if lm is None:
        p = tmp_path / "t.txt"
        p.write_text("\n".join(text))
        write_arpa(build(sentences(p), 3, "wb"), tmp_path / "wb.arpa")
        lm = ArpaLM.load(tmp_path / "wb.arpa")
    vocab = ["a", "b", "c", "d", "</s>", "<unk>"]
    for h in [(), ("<s>",), ("a",), ("<s>", "b"), ("c", "d"), ("d", "d")]:
        assert sum(math.exp(lm.logprob(w, h)) for w in vocab) == pytest.approx(1, abs=1e-5)
    assert UNK_FLOOR < 0


# -- the commands, end to end ------------------------------------------------------------

def test_eval_decode_tune_with_lexicon_and_lm_through_the_cli(tmp_path):
    import json

    from data_tools.synth import label_names, make_sequences
    from rnntrain.data import ncdata
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    from tests.conftest import run_cli_batch
    names = label_names(5)  # L04 separates words
    seqs = list(make_sequences(12, 5, 6, 7, mean_labels=5, noise=0.3))
    frames = [x for x, _ in seqs]
    targets = [" ".join(names[i] for i in t) for _, t in seqs]
    data = tmp_path / "w.nc"
    ncdata.write_file(data, frames, targets, names, [f"u{i}" for i in range(12)])
    cfg = load_config(None, [f"data.train={json.dumps(str(data))}",
                             f"data.val={json.dumps(str(data))}", "model.layers=1",
                             "model.hidden=32", "optim.lr=0.03", "train.epochs=8",
                             "batch.batch_frames=80", "compute.threads=1",
                             f"run.dir={json.dumps(str(tmp_path / 'run'))}"])
    ckpt = train(cfg) / "checkpoints" / "last.pt"
    # words of the references (labels between L04s, written as their label names joined)
    words = [w.replace(" ", "") for t in targets for w in t.split("L04") if w.strip()]
    (tmp_path / "lex.txt").write_text("\n".join(sorted(set(words))) + "\n")
    (tmp_path / "text.txt").write_text("\n".join(
        " ".join(w.replace(" ", "") for w in t.split("L04") if w.strip()) for t in targets))
    # every command below in one process (the torch import once): run_cli_batch
    base = ["rnntrain", "eval", ckpt, data, "--json", "--space", "L04"]
    arpa, lexf = tmp_path / "w.arpa", tmp_path / "lex.txt"
    # transcribe takes decode's options (and gives its hypotheses: below)
    opts = ["--space", "L04", "--lexicon", lexf, "--lm", arpa, "--lm-weight", "1",
            "--label-bonus", "0.5"]
    ngram, ev, dec, dec_opts, tr, plain, lm0, tune, nope = run_cli_batch([
        ("data_tools", "ngram", tmp_path / "text.txt", "--order", "2", "--out", arpa,
         "--smoothing", "wb"),
        (*base, "--lexicon", lexf, "--lm", arpa),
        ("rnntrain", "decode", ckpt, data, "--space", "L04", "--lexicon", lexf),
        ("rnntrain", "decode", ckpt, data, *opts),
        ("rnntrain", "transcribe", ckpt, data, *opts, "--threads", "2"),
        ("rnntrain", "decode", ckpt, data, "--beam", "4"),
        ("rnntrain", "decode", ckpt, data, "--beam", "4", "--space", "L04", "--lm", arpa,
         "--lm-weight", "0"),
        ("rnntrain", "tune-decoder", ckpt, data, "--space", "L04", "--lm", arpa,
         "--lm-weights", "0,1", "--word-bonuses", "0,2", "--json"),
        ("rnntrain", "eval", ckpt, data, "--space", "nope")])
    assert ngram.returncode == 0, ngram.stderr
    r = ev
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "wer" in out["best"] and "wer" in out["beam"] and "lexicon" in out["beam"]["decoder"]
    r = dec
    assert r.returncode == 0, r.stderr
    lex = set(words)
    for line in r.stdout.strip().splitlines():
        hyp = line.split("\t")[1]
        assert all(w.replace(" ", "") in lex for w in hyp.split("L04") if w.strip()), hyp
    # transcribe takes the same options and gives decode's hypotheses
    dec = dec_opts
    assert dec.returncode == 0 and tr.returncode == 0, dec.stderr + tr.stderr
    by_tag = dict(line.split("\t")[:2] for line in dec.stdout.strip().splitlines())
    got = dict(line.split("\t")[:2] for line in tr.stdout.strip().splitlines())
    assert got == by_tag and len(got) == 12
    # an LM at weight 0 and no bonus changes nothing: the plain beam's hypotheses
    assert plain.returncode == 0 and lm0.returncode == 0 and plain.stdout == lm0.stdout
    r = tune
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    assert len(t["table"]) == 4
    assert t["best"]["wer"] == min(row["wer"] for row in t["table"])
    r = nope
    assert r.returncode == 2 and "--space 'nope'" in r.stderr and "Traceback" not in r.stderr
