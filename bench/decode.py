"""Decoding speed: best path, Python prefix beam (the oracle), compiled beam, + LM, + lexicon;
edit distance: the Python DP vs rapidfuzz.

CTC-like outputs of 500 frames × 81 classes (80 labels + blank): a random label sequence
of ~100 labels is laid on the frames (each label a spike of 1-3 frames, blanks between),
and each frame's logits are 6 on its class plus N(0, 1.5) noise, then log-softmax. The
LM is a 4-gram label-level model (modified Kneser-Ney) built by ``data_tools.ngram`` from
500 lines of a random bigram "language" over the labels; the lexicon variant uses label
79 as the word separator, the words spelled from the same language and a word 2-gram.
Utterances/s on one thread (the decoder is single-threaded per utterance); every
compiled hypothesis without LM is checked equal to the Python oracle's.

    python -m bench decode [--quick]
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from data_tools.ngram import build, write_arpa
from rnntrain.decode.beam import Decoder
from rnntrain.decode.lm import ArpaLM
from rnntrain.decode.score import edit_ops_reference, label_errors
from rnntrain.decode.search import prefix_beam_search

T, C = 500, 81
BLANK = C - 1


def utterance(rng: np.random.Generator, chain: np.ndarray) -> np.ndarray:
    """(T, C) log-probabilities with a path drawn from the bigram chain."""
    cls = np.full(T, BLANK)
    t, lab = int(rng.integers(0, 3)), int(rng.integers(0, C - 1))
    while t < T:
        d = int(rng.integers(1, 4))
        cls[t: t + d] = lab
        t += d + int(rng.integers(1, 4))
        lab = int(rng.choice(C - 1, p=chain[lab]))
    u = rng.normal(0, 1.5, (T, C))
    u[np.arange(T), cls] += 6.0
    return u - np.log(np.exp(u).sum(1, keepdims=True))


def text_lines(rng, chain, n: int, length: int = 30) -> list[list[int]]:
    out = []
    for _ in range(n):
        lab = int(rng.integers(0, C - 1))
        s = [lab]
        for _ in range(length - 1):
            lab = int(rng.choice(C - 1, p=chain[lab]))
            s.append(lab)
        out.append(s)
    return out


def rate(fn, items, min_s: float = 1.0) -> float:
    """Items per second of fn over items (repeated until min_s of thread CPU time)."""
    n, t0 = 0, time.thread_time()
    while True:
        for x in items:
            fn(x)
        n += len(items)
        if time.thread_time() - t0 >= min_s:
            return n / (time.thread_time() - t0)


def run(quick: bool = False) -> str:
    rng = np.random.default_rng(0)
    chain = rng.dirichlet(np.full(C - 1, 0.1), C - 1)  # peaked bigram "language"
    utts = [utterance(rng, chain) for _ in range(4 if quick else 8)]
    names = [f"c{k}" for k in range(C - 1)] + ["_blank"]
    tmp = Path(tempfile.mkdtemp(prefix="bench_decode"))
    lines = text_lines(rng, chain, 200 if quick else 500)
    write_arpa(build([[names[k] for k in s] for s in lines], 4, "kn", True), tmp / "c4.arpa")
    lm = ArpaLM.load(tmp / "c4.arpa")
    # words: label 79 separates; word text from the same language cut into 2-6 label words
    sp = names[C - 2]
    words, wl = [], []
    for s in lines:
        cut, ws = 0, []
        while cut < len(s):
            n = int(rng.integers(2, 7))
            w = "".join(names[k] for k in s[cut: cut + n] if k != C - 2)
            if w:
                ws.append(w)
            cut += n
        wl.append(ws)
        words += ws
    (tmp / "lex.txt").write_text("\n".join(sorted(set(words))) + "\n")
    write_arpa(build(wl, 2, "kn", True), tmp / "w2.arpa")

    t0 = time.perf_counter()
    best = Decoder(names, BLANK, beam=0)
    beam = Decoder(names, BLANK, beam=8)
    beam_lm = Decoder(names, BLANK, beam=8, lm=lm, lm_weight=0.5)
    lex_lm = Decoder(names, BLANK, beam=8, space=sp, lexicon=tmp / "lex.txt",
                     lm=tmp / "w2.arpa", lm_weight=0.5, word_bonus=1.0)
    for d in (beam, beam_lm, lex_lm):
        d.decode(utts[0][:20])  # numba: compile, or load the cache
    warm = time.perf_counter() - t0
    same = all(beam.decode(u) == prefix_beam_search(u, T, BLANK, 8) for u in utts)
    # rounds interleave the decoders so that a change in machine load hits all alike; the
    # best round of each counts
    fns = [("best path", best.decode),
           ("Python prefix beam 8 (oracle)", lambda u: prefix_beam_search(u, T, BLANK, 8)),
           ("compiled prefix beam 8", beam.decode),
           ("compiled beam 8 + 4-gram label LM", beam_lm.decode),
           ("compiled beam 8 + lexicon + word 2-gram", lex_lm.decode)]
    best_rate = {name: 0.0 for name, _ in fns}
    for _ in range(2 if quick else 3):
        for name, fn in fns:
            items = utts[:2] if "Python" in name else utts
            best_rate[name] = max(best_rate[name], rate(fn, items, 0.2 if quick else 0.5))
    rows = list(best_rate.items())
    py = best_rate["Python prefix beam 8 (oracle)"]

    erng = np.random.default_rng(1)
    refs = [erng.integers(0, 80, 60).tolist() for _ in range(500)]
    hyps = [erng.integers(0, 80, 60).tolist() for _ in range(500)]
    t1 = time.thread_time()
    ref_tot = sum(sum(edit_ops_reference(r, h)) for r, h in zip(refs, hyps))
    t_py = time.thread_time() - t1
    t1 = time.thread_time()
    reps = 20
    for _ in range(reps):
        fast_tot = int(label_errors(refs, hyps).sum())
    t_fast = (time.thread_time() - t1) / reps
    assert fast_tot == ref_tot

    # the training step's label errors for one task (32 sequences): the per-sequence loop
    # it had (best path + Python DP per sequence) vs best_path_batch + one cpdist call
    from rnntrain.decode.score import padded_as_strings, ragged_as_strings
    from rnntrain.decode.search import best_path_batch
    tr = np.random.default_rng(2)
    Tt, N, blank = 300, 32, 30
    path = tr.integers(0, 31, (Tt, N))
    path[tr.random((Tt, N)) < 0.6] = blank
    out_len = tr.integers(200, Tt + 1, N)
    targets = [tr.integers(0, 30, 60) for _ in range(N)]

    def old_step():
        e = 0
        for j, t in enumerate(targets):
            p = path[: int(out_len[j]), j]
            k = np.ones(len(p), bool)
            k[1:] = p[1:] != p[:-1]
            e += sum(edit_ops_reference(t.tolist(), [int(x) for x in p[k] if x != blank]))
        return e

    def new_step():
        hyp, n = best_path_batch(path, out_len, blank)
        return int(label_errors(ragged_as_strings(targets)[0], padded_as_strings(hyp, n)).sum())
    assert old_step() == new_step()
    t_old = 1.0 / rate(lambda _: old_step(), [0], 0.3)
    t_new = 1.0 / rate(lambda _: new_step(), [0], 0.3)

    try:
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    out = ["## Decoding and edit distance", "",
           f"{len(utts)} CTC-like utterances of {T} frames x {C} classes (see "
           f"`bench/decode.py`), one thread, thread CPU time; load average at the end: "
           f"{load}. Compiled hypotheses equal the Python oracle's: "
           f"**{'yes' if same else 'NO'}**. First call (numba compile or cache load): "
           f"{warm:.1f} s.", "",
           "| decoder | utterances/s | ms per utterance | vs Python beam |",
           "|---|---:|---:|---:|"]
    for name, r in rows:
        out.append(f"| {name} | {r:,.1f} | {1e3 / r:.2f} | {r / py:,.0f}x |")
    out += ["", f"Edit distance, 500 pairs of 60 labels: Python DP {t_py * 1e3:.0f} ms, "
            f"rapidfuzz (one `cpdist` call) {t_fast * 1e3:.2f} ms "
            f"({t_py / t_fast:,.0f}x); totals equal ({ref_tot}).", "",
            f"Training LER of one task (32 sequences, 300 frames, 60-label targets, the "
            f"work `TaskComputer` does on a worker thread per task): per-sequence loop with the "
            f"Python DP {t_old * 1e3:.1f} ms, vectorised best path + one rapidfuzz call "
            f"{t_new * 1e3:.2f} ms ({t_old / t_new:,.0f}x); the same error count.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
