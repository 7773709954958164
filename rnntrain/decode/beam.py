"""CTC prefix beam search at compiled speed, with a lexicon and an n-gram LM.

``Decoder`` is the one object the commands use (``eval``, ``decode``, ``tune-decoder``,
and anything else that turns log-probabilities into labels): best path when ``beam`` is
0, otherwise a prefix beam search compiled with numba (``nogil``: threads decode
sequences in parallel). Without a lexicon and an LM it returns exactly what
``search.prefix_beam_search`` (the Python oracle) returns: the same candidate labels per
frame (the ``beam + 1`` best by ``np.argsort``), the same log-add order, the same stable
sort of the beams.

Scores. A hypothesis l with words w_1..w_K is ranked by

    log P_ctc(l | x) + lm_weight · log P_LM(l) + word_bonus · K + label_bonus · |l|

where P_LM is a label-level LM (every label is a token, the word separator too) or a
word-level LM (a token per completed word), both ending with </s>. Without a separator,
``word_bonus`` is paid per label. ``label_bonus`` is paid per label (the separator
included) whether or not there is a separator: the insertion bonus of a character-level
LM, which otherwise favours short hypotheses, with words still known for the WER. During the search the LM and bonus terms cover the
tokens emitted so far (a word is scored when its separator is emitted); at the end, the
last word and </s> are added. With a lexicon, a label may only extend a hypothesis along
the lexicon's prefix tree, the separator only follows a complete word, and only
hypotheses that end on a complete word (or on a separator) are returned.

Prefixes live in a trie of nodes built during the search; a prefix's LM state, LM score,
word count and position in the lexicon tree are computed once, when it is first proposed,
and it becomes a node only if it enters the beam.
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from rnntrain.decode.lm import UNK_FLOOR, ArpaLM, BOS, EOS, UNK
from rnntrain.decode.search import best_path
from rnntrain.errors import DataError, UserError
from rnntrain.fsutil import read_text

try:  # numba is a dependency; without it the same functions run as (slow) Python
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only where numba is missing
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

LOG2 = math.log(2.0)
NINF = -math.inf
# columns of the prefix-node table
PARENT, LABEL, STATE, COUNT, WORD, WLEN, HASH, LEN = range(8)
N_COLS = 8
MIX = 0x5BD1E995


@njit(cache=True, nogil=True)
def _logaddexp(x, y):
    # numpy's npy_logaddexp, term for term, so sums agree with the Python oracle's bits;
    # with one side -inf its result is exactly the other side (x + log1p(0)): skip the math
    if y == NINF:
        return x
    if x == NINF:
        return y
    if x == y:
        return x + LOG2
    tmp = x - y
    if tmp > 0:
        return x + math.log1p(math.exp(-tmp))
    elif tmp <= 0:
        return y + math.log1p(math.exp(tmp))
    return tmp


@njit(cache=True, nogil=True)
def _lm_step(state, tok, keys, ids, prob, bow, suffix, order, V, N):
    """(ln P(tok | state), next state): back off from the longest listed history."""
    s = 0.0
    h = state
    if tok < 0:
        while h != 0:
            s += bow[h]
            h = suffix[h]
        return s + UNK_FLOOR, 0
    while True:
        key = h * V + tok
        i = np.searchsorted(keys, key)
        if i < keys.shape[0] and keys[i] == key:
            g = ids[i]
            if order[g] >= N:
                return s + prob[g], suffix[g]
            return s + prob[g], g
        if h == 0:
            return s + UNK_FLOOR, 0
        s += bow[h]
        h = suffix[h]


@njit(cache=True, nogil=True)
def _lm_cached(state, tok, c_key, c_lp, c_st, keys, ids, prob, bow, suffix, order, V, N):
    """``_lm_step`` through a direct-mapped cache keyed by (state, token)."""
    if tok < 0:
        return _lm_step(state, tok, keys, ids, prob, bow, suffix, order, V, N)
    key = state * V + tok
    h = _slot(key, c_key.shape[0] - 1)
    if c_key[h] == key:
        return c_lp[h], c_st[h]
    d, st = _lm_step(state, tok, keys, ids, prob, bow, suffix, order, V, N)
    c_key[h] = key
    c_lp[h] = d
    c_st[h] = st
    return d, st


@njit(cache=True, nogil=True)
def _word_tok(wn, wt_end, wt_tok, unk):
    if wn > 0 and wt_end[wn]:
        return wt_tok[wn]
    return unk


@njit(cache=True, nogil=True)
def _slot(key, mask):
    return ((int(key) ^ (int(key) >> 29)) * MIX) & mask


@njit(cache=True, nogil=True)
def _same_child(nodes, q, p, c):
    """Is node q the prefix of node p followed by label c? (Walks up to a shared node.)"""
    if nodes[q, LABEL] != c:
        return False
    a, b = nodes[q, PARENT], p
    while a != b:
        if a <= 0 or b <= 0 or nodes[a, LABEL] != nodes[b, LABEL] \
                or nodes[a, HASH] != nodes[b, HASH]:
            return False
        a, b = nodes[a, PARENT], nodes[b, PARENT]
    return True


@njit(cache=True, nogil=True)
def _grow(nodes, lm_total, stamp, slot):
    n = nodes.shape[0]
    nn = np.full((2 * n, nodes.shape[1]), -1, np.int64)
    nn[:n] = nodes
    lt = np.zeros(2 * n)
    lt[:n] = lm_total
    s2 = np.full(2 * n, -1, np.int64)
    s2[:n] = stamp
    sl = np.zeros(2 * n, np.int64)
    sl[:n] = slot
    return nn, lt, s2, sl


@njit(cache=True, nogil=True)
def _search(lp, cand, blank, beam, space, constrain, use_words,
            wt_first, wt_next, wt_label, wt_end, wt_tok,
            lm_mode, label_tok, keys, ids, prob, bow, suffix, order, V, N, bos_state,
            eos, unk, alpha, beta, gamma, nodes, lm_total, stamp, slot):
    """lp: (T, C) float64, cand: (T, K) labels to try per frame → (best node, its final
    score, whether it ends on a complete word, the work arrays (grown if need be))."""
    T = lp.shape[0]
    K = cand.shape[1]
    # the work arrays come from the caller (reused: no fresh pages per sequence)
    stamp[:] = -1
    nodes[0, STATE] = bos_state if lm_mode > 0 else 0
    nodes[0, COUNT] = 0
    nodes[0, WORD] = 0 if use_words else -1
    nodes[0, WLEN] = 0
    nodes[0, LEN] = 0
    n_nodes = 1
    C = lp.shape[1]
    # the beam's prefixes by a hash of their labels: p + c may be a prefix already in the
    # beam (reached through another node, if that prefix left the beam and came back);
    # otherwise it is new this frame (only p extends to it) and gets a fresh node
    hsize = 16
    while hsize < 4 * beam:
        hsize *= 2
    hmask = hsize - 1
    hkey = np.zeros(hsize, np.int64)
    hval = np.full(hsize, -1, np.int64)
    nodes[0, HASH] = 0

    nb = 1
    b_node = np.zeros(beam * (K + 1) + 1, np.int64)
    b_pb = np.full(beam * (K + 1) + 1, NINF)
    b_pnb = np.full(beam * (K + 1) + 1, NINF)
    b_pb[0] = 0.0
    m = beam * (K + 1) + 1
    x_node = np.zeros(m, np.int64)
    x_pb = np.empty(m)
    x_pnb = np.empty(m)
    x_score = np.empty(m)
    top = np.zeros(beam, np.int64)
    # LM lookups repeat (the same history + token from frame to frame): a direct-mapped cache
    c_key = np.full(4096, -1, np.int64)
    c_lp = np.zeros(4096)
    c_st = np.zeros(4096, np.int64)
    x_par = np.zeros(m, np.int64)
    x_lab = np.zeros(m, np.int64)
    x_st = np.zeros(m, np.int64)
    x_cnt = np.zeros(m, np.int64)
    x_wn = np.zeros(m, np.int64)
    x_wlen = np.zeros(m, np.int64)
    x_len = np.zeros(m, np.int64)
    x_key = np.zeros(m, np.int64)
    x_lm = np.zeros(m)
    top_s = np.empty(beam)

    for t in range(T):
        row = lp[t]
        nx = 0
        hval[:] = -1
        for i in range(nb):
            q = b_node[i]
            if q > 0:
                h = _slot(nodes[q, HASH], hmask)
                while hval[h] != -1:
                    h = (h + 1) & hmask
                hkey[h] = nodes[q, HASH]
                hval[h] = q
        for i in range(nb):
            p = b_node[i]
            pb = b_pb[i]
            pnb = b_pnb[i]
            ptot = _logaddexp(pb, pnb)
            # three kinds of add, each (node, blank-ending, non-blank-ending); -1: none
            for kk in range(-1, K):
                ab2 = NINF
                anb2 = NINF
                if kk == -1:
                    tgt, ab, anb = p, ptot + row[blank], NINF
                    tgt2 = -1
                else:
                    c = cand[t, kk]
                    if c == blank:
                        continue
                    last = nodes[p, LABEL]
                    # the child p + c: in the beam already, or new (-1: the lexicon forbids)
                    key = (int(nodes[p, HASH]) * MIX + int(c) + 1) & 0x3FFFFFFFFFFFFFFF
                    h = _slot(key, hmask)
                    ch = -1
                    while hval[h] != -1:
                        if hkey[h] == key and _same_child(nodes, hval[h], p, c):
                            ch = hval[h]
                            break
                        h = (h + 1) & hmask
                    valid = True
                    if ch == -1:
                        ok = True
                        st = nodes[p, STATE]
                        cnt = nodes[p, COUNT]
                        wn = nodes[p, WORD]
                        add = 0.0
                        if c == space:
                            if constrain and not (wn > 0 and wt_end[wn]):
                                ok = False
                            if ok and nodes[p, WLEN] > 0:
                                cnt += 1
                                if lm_mode == 2:
                                    d, st = _lm_cached(st, _word_tok(wn, wt_end, wt_tok, unk),
                                                       c_key, c_lp, c_st, keys, ids, prob, bow,
                                                       suffix, order, V, N)
                                    add += d
                            new_wn = 0 if use_words else -1
                            new_wlen = 0
                        else:
                            new_wn = -1
                            if use_words and wn >= 0:
                                g = wt_first[wn]
                                while g != -1 and wt_label[g] != c:
                                    g = wt_next[g]
                                new_wn = g
                            if constrain and new_wn < 0:
                                ok = False
                            new_wlen = nodes[p, WLEN] + 1
                            if space < 0:
                                cnt += 1
                        if ok and lm_mode == 1:
                            d, st = _lm_cached(st, label_tok[c], c_key, c_lp, c_st, keys, ids,
                                               prob, bow, suffix, order, V, N)
                            add += d
                        if ok:
                            # a new prefix: an entry of this frame's list, made a node only
                            # if it enters the beam (most never do: no table writes for them)
                            j = nx
                            nx += 1
                            x_node[j] = -1
                            x_par[j] = p
                            x_lab[j] = c
                            x_st[j] = st
                            x_cnt[j] = cnt
                            x_wn[j] = new_wn
                            x_wlen[j] = new_wlen
                            x_len[j] = nodes[p, LEN] + 1
                            x_key[j] = key
                            x_lm[j] = lm_total[p] + add
                            x_pb[j] = NINF
                            x_pnb[j] = NINF
                            ch = -2 - j
                        else:
                            valid = False
                    if c == last:
                        tgt, ab, anb = p, NINF, pnb + row[c]      # repeat collapses
                        tgt2 = ch if valid else -1                 # needs a blank between
                        ab2, anb2 = NINF, pb + row[c]
                    else:
                        if not valid:
                            continue
                        tgt, ab, anb = ch, NINF, ptot + row[c]
                        tgt2 = -1
                for rep in range(2):
                    if rep == 1:
                        if tgt2 == -1:
                            break
                        tgt, ab, anb = tgt2, ab2, anb2
                    if tgt <= -2:  # the new prefix's one add
                        j = -2 - tgt
                    else:
                        if stamp[tgt] != t:
                            stamp[tgt] = t
                            slot[tgt] = nx
                            x_node[nx] = tgt
                            x_lm[nx] = lm_total[tgt]
                            x_cnt[nx] = nodes[tgt, COUNT]
                            x_len[nx] = nodes[tgt, LEN]
                            x_pb[nx] = NINF
                            x_pnb[nx] = NINF
                            nx += 1
                        j = slot[tgt]
                    x_pb[j] = _logaddexp(x_pb[j], ab)
                    x_pnb[j] = _logaddexp(x_pnb[j], anb)
        for j in range(nx):
            x_score[j] = _logaddexp(x_pb[j], x_pnb[j])
            if lm_mode > 0:
                x_score[j] += alpha * x_lm[j]
            x_score[j] += beta * x_cnt[j]
            if gamma != 0.0:
                x_score[j] += gamma * x_len[j]
        # the oracle's stable sort, then the first `beam`: one pass keeping the best `beam`
        # in order; an entry moves up only past strictly lower scores, so ties stay in
        # insertion order, as sorted() keeps them
        nb = 0
        for j in range(nx):
            sc = x_score[j]
            if nb == beam and not (sc > top_s[nb - 1]):
                continue
            pos = nb if nb < beam else beam - 1
            while pos > 0 and sc > top_s[pos - 1]:
                top[pos] = top[pos - 1]
                top_s[pos] = top_s[pos - 1]
                pos -= 1
            top[pos] = j
            top_s[pos] = sc
            if nb < beam:
                nb += 1
        for i in range(nb):
            j = top[i]
            if x_node[j] < 0:
                if n_nodes == nodes.shape[0]:
                    nodes, lm_total, stamp, slot = _grow(nodes, lm_total, stamp, slot)
                q = n_nodes
                n_nodes += 1
                nodes[q, PARENT] = x_par[j]
                nodes[q, LABEL] = x_lab[j]
                nodes[q, STATE] = x_st[j]
                nodes[q, COUNT] = x_cnt[j]
                nodes[q, WORD] = x_wn[j]
                nodes[q, WLEN] = x_wlen[j]
                nodes[q, HASH] = x_key[j]
                nodes[q, LEN] = x_len[j]
                lm_total[q] = x_lm[j]
                stamp[q] = -1
                x_node[j] = q
            b_node[i] = x_node[j]
            b_pb[i] = x_pb[j]
            b_pnb[i] = x_pnb[j]

    # the end: the last word, </s>; each surviving hypothesis' final score
    f_score = np.empty(nb)
    f_complete = np.zeros(nb, np.bool_)
    for i in range(nb):
        q = b_node[i]
        lm = lm_total[q]
        cnt = nodes[q, COUNT]
        st = nodes[q, STATE]
        complete = True
        if space >= 0 and nodes[q, WLEN] > 0:
            wn = nodes[q, WORD]
            if constrain and not (wn > 0 and wt_end[wn]):
                complete = False
            cnt += 1
            if lm_mode == 2:
                d, st = _lm_step(st, _word_tok(wn, wt_end, wt_tok, unk), keys, ids, prob, bow,
                                 suffix, order, V, N)
                lm += d
        if lm_mode > 0 and eos >= 0:
            d, st = _lm_step(st, eos, keys, ids, prob, bow, suffix, order, V, N)
            lm += d
        sc = _logaddexp(b_pb[i], b_pnb[i])
        if lm_mode > 0:
            sc += alpha * lm
        sc += beta * cnt
        if gamma != 0.0:
            sc += gamma * nodes[q, LEN]
        f_score[i] = sc
        f_complete[i] = complete
    return b_node[:nb].copy(), f_score, f_complete, (nodes, lm_total, stamp, slot)


def _ranked(score: np.ndarray, complete: np.ndarray) -> list[int]:
    """The final beam's entries, best first: the complete hypotheses by score (ties in
    beam order), or, when none is complete, all of them so. The first is the search's
    best: the first highest-scoring complete hypothesis."""
    idx = np.flatnonzero(complete) if complete.any() else np.arange(len(score))
    return [int(i) for i in sorted(idx.tolist(), key=lambda i: -score[i])]


def _labels_of(nodes: np.ndarray, q: int) -> list[int]:
    out = []
    while q > 0:
        out.append(int(nodes[q, LABEL]))
        q = int(nodes[q, PARENT])
    return out[::-1]


def spell(word: str, labels: Sequence[str], index: dict[str, int]) -> list[int] | None:
    """A word → label indices: greedy longest match of label names (None: cannot)."""
    out, i = [], 0
    longest = max((len(x) for x in labels), default=1)
    while i < len(word):
        for n in range(min(longest, len(word) - i), 0, -1):
            k = index.get(word[i:i + n])
            if k is not None:
                out.append(k)
                i += n
                break
        else:
            return None
    return out


def read_lexicon(path, labels: Sequence[str], blank: int, space: int
                 ) -> list[tuple[str, list[int]]]:
    """Lexicon file → [(word, label spelling)].

    One word per line: ``WORD`` (spelled with the alphabet's label names, longest match
    first) or ``WORD<TAB or space>LABEL LABEL ...`` (an explicit spelling, as RNNLIB's
    dictionaries). Blank lines and lines starting with '#' are ignored.
    """
    index = {name: k for k, name in enumerate(labels) if k not in (blank, space)}
    if not os.path.exists(path):
        raise DataError(path, "lexicon file not found")
    text = read_text(path, "lexicon")  # a FIFO would block, /dev/zero never end
    out = []
    for ln, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        word = parts[0]
        if len(parts) > 1:
            bad = [p for p in parts[1:] if p not in index]
            if bad:
                raise DataError(path, f"line {ln}: word '{word}' is spelled with '{bad[0]}', "
                                "which is not a label of the model's alphabet (or is the "
                                "blank or the separator)")
            out.append((word, [index[p] for p in parts[1:]]))
        else:
            s = spell(word, labels, index)
            if s is None:
                raise DataError(path, f"line {ln}: word '{word}' cannot be spelled with the "
                                "model's labels (give its labels after it on the line)")
            out.append((word, s))
    if not out:
        raise DataError(path, "the lexicon lists no words")
    return out


class Decoder:
    """CTC decoding for one alphabet: best path, beam, lexicon, LM. Thread-safe.

    labels: the alphabet (label names, index = class; ``blank`` is the CTC blank).
    beam: 0 = best path. space: the word separator's label name (needed by a lexicon, a
    word-level LM and the word error rate). lexicon: a word list (``read_lexicon``).
    lm: an ARPA file or an ``ArpaLM``; label-level when every word it lists is a label
    name, word-level otherwise. lm_weight, word_bonus, label_bonus: see the module
    docstring.
    """

    def __init__(self, labels: Sequence[str], blank: int, beam: int = 8,
                 space: str | None = None, lexicon=None, lm=None, lm_weight: float = 0.5,
                 word_bonus: float = 0.0, label_bonus: float = 0.0):
        self.labels, self.blank, self.beam = list(labels), int(blank), int(beam)
        if self.beam < 0:
            raise UserError(f"--beam {beam}: must be 0 (best path) or a positive width")
        self.space = -1
        if space is not None:
            if space not in self.labels:
                raise UserError(f"--space '{space}' is not a label of the model's alphabet "
                                f"({', '.join(self.labels[:12])}{' ...' if len(labels) > 12 else ''})")
            self.space = self.labels.index(space)
            if self.space == self.blank:
                raise UserError(f"--space '{space}' is the CTC blank")
        self.lm_weight, self.word_bonus = float(lm_weight), float(word_bonus)
        self.label_bonus = float(label_bonus)
        self.lm = ArpaLM.load(lm) if isinstance(lm, (str, os.PathLike)) else lm
        self.lexicon = (read_lexicon(lexicon, self.labels, self.blank, self.space)
                        if isinstance(lexicon, (str, os.PathLike)) else lexicon)
        if (self.lm is not None or self.lexicon is not None) and self.beam == 0:
            raise UserError("--lm and --lexicon work in the beam search: give --beam N (N > 0)")
        if self.lexicon is not None and self.space < 0:
            raise UserError("--lexicon needs --space LABEL (the label that separates words)")
        self.lm_mode = 0
        if self.lm is not None:
            names = set(self.labels)
            words = [w for w in self.lm.vocab if w not in (BOS, EOS, UNK)]
            self.lm_mode = 1 if all(w in names for w in words) else 2
            if self.lm_mode == 2 and self.space < 0:
                raise UserError(f"{self.lm.path or 'the LM'} is a word-level model (it lists "
                                f"words such as '{next(w for w in words if w not in names)}' "
                                "that are not labels): give --space LABEL")
        self._build()
        self._local = threading.local()

    def _build(self):
        lm = self.lm
        if lm is not None:
            tb = lm.tables
            self._lm_args = (tb.sorted_keys, tb.sorted_ids, tb.prob, tb.bow, tb.suffix,
                             tb.order, int(tb.vocab_size), int(tb.max_order),
                             int(tb.bos_state), int(tb.eos), int(tb.unk))
            self.label_tok = np.array([lm.token(n) if lm.token(n) >= 0 else tb.unk
                                       for n in self.labels], np.int64)
        else:
            z = np.zeros(1, np.int64)
            self._lm_args = (z, z, np.zeros(1), np.zeros(1), z, z, 1, 1, 0, -1, -1)
            self.label_tok = np.full(len(self.labels), -1, np.int64)
        # the word tree: the lexicon's words, or (word-level LM, no lexicon) the LM's words
        # that the alphabet can spell, so a completed word finds its LM token
        words: list[tuple[str, list[int]]] = []
        if self.lexicon is not None:
            words = self.lexicon
        elif self.lm_mode == 2:
            index = {n: k for k, n in enumerate(self.labels) if k not in (self.blank, self.space)}
            for w in lm.vocab:
                if w in (BOS, EOS, UNK):
                    continue
                s = spell(w, self.labels, index)
                if s:
                    words.append((w, s))
        self.use_words = bool(words)
        first, nxt, lab, end, tok = [-1], [-1], [-1], [False], [-1]
        children: dict[tuple[int, int], int] = {}
        unk = self._lm_args[10]
        for w, sp in words:
            q = 0
            for c in sp:
                ch = children.get((q, c))
                if ch is None:
                    ch = len(first)
                    children[(q, c)] = ch
                    first.append(-1)
                    lab.append(c)
                    end.append(False)
                    tok.append(-1)
                    nxt.append(first[q])
                    first[q] = ch
                q = ch
            end[q] = True
            t = lm.token(w) if lm is not None else -1
            tok[q] = t if t >= 0 else unk
        self._words = (np.array(first, np.int64), np.array(nxt, np.int64),
                       np.array(lab, np.int64), np.array(end, np.bool_),
                       np.array(tok, np.int64))

    def with_weights(self, lm_weight: float, word_bonus: float,
                     label_bonus: float | None = None) -> "Decoder":
        """A copy with other weights (shares the LM tables and the word tree); the label
        bonus stays as it is unless given."""
        d = object.__new__(Decoder)
        d.__dict__.update(self.__dict__)
        d.lm_weight, d.word_bonus = float(lm_weight), float(word_bonus)
        if label_bonus is not None:
            d.label_bonus = float(label_bonus)
        d._local = threading.local()
        return d

    def decode_scored(self, log_probs: np.ndarray, length: int | None = None
                      ) -> tuple[list[int], float]:
        """log_probs: (T, C) → (labels, score as in the module docstring; best path: the
        sum of the chosen frames' log-probabilities)."""
        return self.decode_nbest(log_probs, length, 1)[0]

    def decode_nbest(self, log_probs: np.ndarray, length: int | None = None, n: int = 1
                     ) -> list[tuple[list[int], float]]:
        """log_probs: (T, C) → up to ``n`` (labels, score) pairs, best first, from the
        final beam (distinct label sequences; with a lexicon, only those ending on a
        complete word when any does). The first is ``decode_scored``'s. Best path
        (beam 0) gives one."""
        lp = np.asarray(log_probs, dtype=np.float64)
        T = lp.shape[0] if length is None else int(length)
        lp = lp[:T]
        if self.beam == 0:
            return [(best_path(lp, T, self.blank), float(lp.max(1).sum()) if T else 0.0)]
        k = min(max(self.beam, 1) + 1, lp.shape[1])
        # the oracle's candidates: np.argsort per frame, reversed, the first beam + 1
        cand = np.ascontiguousarray(np.argsort(lp, axis=1)[:, ::-1][:, :k]).astype(np.int64)
        keys, ids, prob, bow, suffix, order, V, N, bos, eos, unk = self._lm_args
        first, nxt, lab, end, tok = self._words
        ws = getattr(self._local, "ws", None)
        if ws is None:
            ws = (np.full((4096, N_COLS), -1, np.int64), np.zeros(4096), np.full(4096, -1, np.int64),
                  np.zeros(4096, np.int64))
        qs, scores, complete, ws = _search(
            np.ascontiguousarray(lp), cand, self.blank, self.beam, self.space,
            self.lexicon is not None, self.use_words, first, nxt, lab, end, tok,
            self.lm_mode, self.label_tok, keys, ids, prob, bow, suffix, order, V, N, bos,
            eos, unk, self.lm_weight, self.word_bonus, self.label_bonus, *ws)
        self._local.ws = ws  # per thread: decode_batch's threads each keep their own
        out: list[tuple[list[int], float]] = []
        seen: set[tuple[int, ...]] = set()
        for i in _ranked(scores, complete):
            labels = _labels_of(ws[0], int(qs[i]))
            if not complete[i]:  # every surviving hypothesis ends inside a word: drop that part
                while labels and labels[-1] != self.space:
                    labels.pop()
            if tuple(labels) in seen:  # trimmed to one already listed
                continue
            seen.add(tuple(labels))
            out.append((labels, float(scores[i])))
            if len(out) == n:
                break
        return out

    def decode(self, log_probs: np.ndarray, length: int | None = None) -> list[int]:
        return self.decode_scored(log_probs, length)[0]

    def decode_batch(self, log_probs: np.ndarray, lengths: Sequence[int], threads: int = 1
                     ) -> list[list[int]]:
        """log_probs: (T, N, C), lengths (N,) → N label lists; ``threads`` > 1 decodes
        sequences in parallel (the compiled search releases the GIL)."""
        lp = np.asarray(log_probs)
        n = lp.shape[1]
        if threads <= 1 or n < 2 or self.beam == 0:
            return [self.decode(lp[:, j], int(lengths[j])) for j in range(n)]
        with ThreadPoolExecutor(min(threads, n), thread_name_prefix="decode") as ex:
            return list(ex.map(lambda j: self.decode(lp[:, j], int(lengths[j])), range(n)))

    def describe(self) -> str:
        if self.beam == 0:
            return "best path"
        parts = [f"beam {self.beam}"]
        if self.lexicon is not None:
            parts.append(f"lexicon ({len(self.lexicon)} words)")
        if self.lm is not None:
            kind = "label" if self.lm_mode == 1 else "word"
            parts.append(f"{self.lm.order}-gram {kind} LM x {self.lm_weight:g}")
        if self.word_bonus:
            parts.append(f"bonus {self.word_bonus:g}")
        if self.label_bonus:
            parts.append(f"label bonus {self.label_bonus:g}")
        return " + ".join(parts)

