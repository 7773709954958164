"""LM training text for the printed-lines recipe (``rnntrain-data faker-text``) and
perplexity (``rnntrain-data perplexity``), through the command line."""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import run_cli

pytest.importorskip("faker")


def test_faker_text_is_render_lines_text_minus_the_excluded_lines(tmp_path):
    from data_tools.render import faker_lines
    first = faker_lines(300, 7, 24)
    # a list holding some of those lines (and one that never occurs)
    excl = tmp_path / "list.tsv"
    banned = first[5:40:3] + ["no such line"]
    excl.write_text("".join(f"img/{i:06d}.png\t{t}\n" for i, t in enumerate(banned)))
    out = tmp_path / "lm.txt"
    r = run_cli("data_tools", "faker-text", "--out", out, "--count", "300", "--seed", "7",
                "--max-chars", "24", "--exclude", excl)
    assert r.returncode == 0, r.stderr
    got = out.read_text().splitlines()
    assert len(got) == 300 and not set(got) & set(banned)
    # the same seeded stream with the banned lines removed, topped up from further on
    stream = faker_lines(600, 7, 24)
    want = [s for s in stream if s not in set(banned)][:300]
    assert got == want
    dropped = sum(1 for s in stream[:stream.index(want[-1]) + 1] if s in set(banned))
    assert f"dropped {dropped} " in r.stdout and dropped >= len(banned) - 1
    assert all(len(s) <= 24 for s in got)
    # reproducible
    r2 = run_cli("data_tools", "faker-text", "--out", tmp_path / "again.txt", "--count", "300",
                 "--seed", "7", "--max-chars", "24", "--exclude", excl)
    assert r2.returncode == 0 and (tmp_path / "again.txt").read_text() == out.read_text()
    bad = run_cli("data_tools", "faker-text", "--out", tmp_path / "x.txt", "--exclude",
                  tmp_path / "missing.tsv")
    assert bad.returncode == 2 and "missing.tsv" in bad.stderr and "Traceback" not in bad.stderr


def test_perplexity_of_a_witten_bell_unigram_by_hand(tmp_path):
    """Unigram WB: P(w) = (c(w) + T/|V|) / (N + T), T = distinct words seen, |V| with </s>
    and <unk>; the held-out text's perplexity over its tokens and </s>."""
    (tmp_path / "train.txt").write_text("a b a\nb a\n")
    lm = tmp_path / "u.arpa"
    r = run_cli("data_tools", "ngram", tmp_path / "train.txt", "--order", "1", "--smoothing",
                "wb", "--out", lm)
    assert r.returncode == 0, r.stderr
    # counts: a 3, b 2, </s> 2 (N = 7, T = 3); vocabulary a, b, </s>, <unk> (|V| = 4)
    p = {w: (c + 3 / 4) / (7 + 3) for w, c in (("a", 3), ("b", 2), ("</s>", 2), ("<unk>", 0))}
    (tmp_path / "held.txt").write_text("a a\nb c\n")
    ln = sum(math.log(p[w]) for w in ("a", "a", "</s>", "b", "<unk>", "</s>"))
    r = run_cli("data_tools", "perplexity", lm, tmp_path / "held.txt", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["tokens"] == 6 and got["oov"] == 1
    assert got["perplexity"] == pytest.approx(math.exp(-ln / 6), rel=1e-6)
