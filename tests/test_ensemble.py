"""Cross-validation folds, ``rnntrain crossfold`` and ensembles (posterior averaging and
Calamari's confidence voting) in eval, decode and transcribe.

Models are small networks with random weights (``test_infer.make_checkpoint``: their
hypotheses are long and varied) or trained for a few steps; the references are computed
independently: numpy float64 averages, hand-made posteriors whose vote is known, a model
trained directly on the fold's sequences.
"""
from __future__ import annotations

import io
import json
import shutil
import sys

import numpy as np
import pytest
import torch

import rnntrain
from rnntrain.cli import main
from rnntrain.config import load_config
from rnntrain.data.folds import fold_masks, fold_of
from rnntrain.data.ncdata import read_file
from rnntrain.decode.search import best_path
from rnntrain.errors import ConfigError
from rnntrain.infer.ensemble import (Read, alternatives, average_log_probs, load_ensemble,
                                     synchronize, vote, vote_log_probs)
from rnntrain.infer.transcribe import transcribe
from tests.conftest import train_here
from tests.test_infer import make_checkpoint, reference_log_probs


# ---------------------------------------------------------------- folds


def test_folds_partition_the_sequences_as_a_function_of_the_seed():
    a = fold_of(103, 5, seed=7)
    assert np.array_equal(a, fold_of(103, 5, seed=7))          # pure
    assert not np.array_equal(a, fold_of(103, 5, seed=8))
    counts = np.bincount(a, minlength=5)
    assert counts.sum() == 103 and counts.max() - counts.min() <= 1
    for i in range(5):
        mine, held = fold_masks(103, 5, i, seed=7)
        assert np.array_equal(held, a == i) and np.array_equal(mine, ~held)


@pytest.mark.parametrize("over,msg", [
    (["data.folds=1"], "2 or more"),
    (["data.folds=3", "data.fold=3"], "must be < data.folds"),
    (["data.fold=1"], "needs data.folds"),
    (["data.folds=3", "data.val=v.nc"], "leave data.val empty"),
])
def test_fold_settings_that_cannot_work_are_refused(over, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, ["data.train=t.nc", *over])


def test_a_fold_trains_on_the_other_folds_and_validates_on_its_own(synth_pair):
    from rnntrain.data.plan import make_plan
    from rnntrain.run.train import open_data
    cfg = load_config(None, [f"data.train={synth_pair[0]}", "data.folds=3", "data.fold=1",
                             "train.seed=4"])
    train_ds, keep, val_ds, val_keep = open_data(cfg)
    mine, held = fold_masks(train_ds.num_seqs, 3, 1, seed=4)
    ok = train_ds.feasible()
    assert np.array_equal(keep, ok & mine) and np.array_equal(val_keep, ok & held)
    assert val_ds.source == train_ds.source and val_ds is not train_ds
    planned = sorted(s for e in (0, 1) for step in make_plan(train_ds, keep, 600, 4, e)
                     for s in step.seqs)
    assert planned == sorted(np.flatnonzero(keep).tolist() * 2)


# ---------------------------------------------------------------- voting


def test_synchronize_cuts_at_common_substrings_as_calamari_does():
    seqs = [list("AbcdEfG"), list("cdEFG")]
    segs = synchronize(seqs)
    texts = [["".join(s[a:b]) for s, (a, b) in zip(seqs, seg)] for seg in segs]
    assert texts == [["Ab", ""], ["cdE", "cdE"], ["f", "F"], ["G", "G"]]
    rng = np.random.default_rng(0)
    for _ in range(200):  # the segments tile every sequence, in order
        seqs = [rng.integers(0, 3, rng.integers(0, 9)).tolist() for _ in range(3)]
        segs = synchronize(seqs)
        for k, s in enumerate(seqs):
            ranges = [seg[k] for seg in segs]
            assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]]
            assert (ranges[0][0], ranges[-1][1]) == (0, len(s)) if ranges else len(s) == 0
    assert synchronize([[1, 2, 3]] * 4) == [[(0, 3)] * 4]


def _posteriors(text: str, alphabet: str, sure: float = 0.9) -> np.ndarray:
    """Log-probs (T, C) that spell ``text``: each character on one frame between blanks,
    with probability ``sure`` (the rest spread evenly)."""
    C = len(alphabet) + 1
    frames = []
    for ch in text:
        for k in (alphabet.index(ch), C - 1):
            p = np.full(C, (1 - sure) / (C - 1))
            p[k] = sure
            frames.append(p)
    return np.log(np.array(frames, np.float32))


@pytest.mark.parametrize("texts,want", [
    (["abc", "abd", "abc"], "abc"),           # a substitution outvoted
    (["abxc", "abc", "abc"], "abc"),          # an insertion: its segment's length loses
    (["ac", "abc", "abc"], "abc"),            # a deletion
    (["abc", "abd", "abd"], "abd"),
])
def test_voting_follows_the_majority_of_confident_models(texts, want):
    alphabet = "abcdx"
    lps = [_posteriors(t, alphabet) for t in texts]
    v = vote_log_probs(lps, len(alphabet))
    assert "".join(alphabet[k] for k in v.labels) == want
    assert all(0 < c <= 1 for c in v.confidences)
    # each label's peak: its frame in the first model that read it there
    assert len(v.peaks) == len(want) and all(0 <= p < len(lps[0]) for p in v.peaks)


def test_a_more_confident_model_wins_a_tied_position():
    alphabet = "abc"
    lps = [_posteriors("ab", alphabet, sure=0.6), _posteriors("ac", alphabet, sure=0.95)]
    v = vote_log_probs(lps, len(alphabet))
    assert "".join(alphabet[k] for k in v.labels) == "ac"
    # the confidence is the mean of the voters' probabilities of the label
    assert v.confidences[1] == pytest.approx((0.95 + 0.4 / 3) / 2, rel=1e-6)


def test_alternatives_are_each_labels_best_frame_probability():
    rng = np.random.default_rng(1)
    lp = np.log(rng.dirichlet(np.ones(4) * 0.3, size=40)).astype(np.float32)
    r = alternatives(lp, blank=3)
    assert r.labels == best_path(lp, len(lp), 3)
    path = lp.argmax(1)
    runs, t = [], 0
    while t < len(path):  # brute force: each run of one argmax, the maximum over it
        e = t
        while e < len(path) and path[e] == path[t]:
            e += 1
        if path[t] != 3:
            runs.append(np.exp(lp[t:e].astype(np.float64)).max(0))
        t = e
    assert np.array_equal(r.probs, np.array(runs).reshape(-1, 4))
    same = vote([r, Read(list(r.labels), r.probs.copy(), list(r.peaks), r.frames), r], 3)
    assert same.labels == r.labels and same.peaks == r.peaks


# ---------------------------------------------------------------- averaging


def test_the_average_of_equal_log_probs_is_exactly_them():
    rng = np.random.default_rng(2)
    lp = np.log(rng.dirichlet(np.ones(6), size=(30, 4))).astype(np.float32)   # (T, N, C)
    for k in (2, 3, 5, 7):
        assert np.array_equal(average_log_probs([lp] * k), lp)
        t = torch.from_numpy(lp)
        assert torch.equal(average_log_probs([t] * k), t)
    other = np.log(rng.dirichlet(np.ones(6), size=(30, 4))).astype(np.float32)
    want = np.log((np.exp(lp.astype(np.float64)) + np.exp(other.astype(np.float64))) / 2)
    np.testing.assert_allclose(average_log_probs([lp, other]), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- eval, decode, transcribe


@pytest.fixture(scope="module")
def random_models(tmp_path_factory, synth_pair):
    """Two different random-weight checkpoints on the validation file's alphabet."""
    d = tmp_path_factory.mktemp("ens")
    h, seqs = read_file(str(synth_pair[1]))
    nets = [make_checkpoint(d / f"m{i}.pt", h.input_size, h.labels, seed=i) for i in (0, 1)]
    return d, h, nets, seqs


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("combine", ["posteriors", "vote", "auto"])
def test_k_copies_of_one_model_give_exactly_that_model(random_models, synth_pair, capsys,
                                                       combine):
    d, h, _, _ = random_models
    one, three = d / "m0.pt", ",".join([str(d / "m0.pt")] * 3)
    val = synth_pair[1]
    for cmd in (["eval", "--json"], ["decode"]):
        rc1, single, _ = _cli(capsys, cmd[0], one, val, *cmd[1:])
        rc3, ens, err = _cli(capsys, cmd[0], three, val, *cmd[1:], "--combine", combine)
        assert rc1 == rc3 == 0, err
        assert ens == single and len(single.splitlines()) >= 1
    want = json.loads(_cli(capsys, "eval", one, val, "--json")[1])
    assert 0 < want["ler"] < 1.5 and want["seqs"] == h.num_seqs
    single, ens = io.StringIO(), io.StringIO()
    transcribe(rnntrain.load(one), [str(val)], threads=2, out=single, progress=False)
    transcribe(load_ensemble(three, combine), [str(val)], threads=2, out=ens, progress=False)
    assert ens.getvalue() == single.getvalue()


def test_averaged_posteriors_decode_as_an_independent_average(random_models, synth_pair,
                                                              capsys):
    d, h, nets, seqs = random_models
    lps = [reference_log_probs(net, seqs) for net in nets]
    want = []
    for a, b in zip(*lps):  # float64 average of the two networks' probabilities
        avg = np.log((np.exp(a.astype(np.float64)) + np.exp(b.astype(np.float64))) / 2)
        want.append(" ".join(h.labels[k] for k in best_path(avg, len(avg), len(h.labels))))
    single = [" ".join(h.labels[k] for k in best_path(a, len(a), len(h.labels)))
              for a in lps[0]]
    assert want != single  # the second model changes something
    pair = f"{d / 'm0.pt'},{d / 'm1.pt'}"
    rc, out, err = _cli(capsys, "decode", pair, synth_pair[1], "--combine", "posteriors")
    assert rc == 0, err
    assert [ln.split("\t")[1] for ln in out.splitlines()] == want
    # voting on the same two: the independent vote of their best paths
    voted = [" ".join(h.labels[k] for k in vote_log_probs([a, b], len(h.labels)).labels)
             for a, b in zip(*lps)]
    assert voted != want  # the two methods disagree here, so the default is told apart
    rc, out, err = _cli(capsys, "decode", pair, synth_pair[1], "--combine", "vote")
    assert rc == 0, err
    assert [ln.split("\t")[1] for ln in out.splitlines()] == voted
    # the default (auto) votes for a plain best path, silently
    rc, out, err = _cli(capsys, "decode", pair, synth_pair[1])
    assert rc == 0 and err == "", err
    assert [ln.split("\t")[1] for ln in out.splitlines()] == voted
    # ... and averages when an option needs the posteriors (JSON's spans, a beam search),
    # saying so in one line
    rc, out, err = _cli(capsys, "decode", pair, synth_pair[1], "--json")
    assert rc == 0 and len(err.strip().splitlines()) == 1, err
    assert "--combine auto: averaging the 2 models' posteriors for --json" in err
    assert [" ".join(json.loads(ln)["labels"]) for ln in out.splitlines()] == want
    rc, beamed, err = _cli(capsys, "decode", pair, synth_pair[1], "--beam", "4")
    assert rc == 0 and "posteriors for --beam" in err and len(err.strip().splitlines()) == 1
    rc, want_beamed, err = _cli(capsys, "decode", pair, synth_pair[1], "--beam", "4",
                                "--combine", "posteriors")
    assert rc == 0 and err == "" and beamed == want_beamed
    # the Python API: load_ensemble's default votes for a best path, averages for n-best
    ens = load_ensemble(pair)
    tsv = io.StringIO()
    transcribe(ens, [str(synth_pair[1])], threads=1, out=tsv, progress=False)
    assert [ln.split("\t")[1] for ln in tsv.getvalue().splitlines()] == voted
    rc, out, err = _cli(capsys, "transcribe", pair, synth_pair[1], "--threads", "1")
    assert rc == 0 and out == tsv.getvalue(), err  # the command's default: the same vote
    rc, out, err = _cli(capsys, "transcribe", pair, synth_pair[1], "--threads", "1", "--full")
    assert rc == 0 and "posteriors for --full" in err
    assert [ln.split("\t")[1] for ln in out.splitlines()] == want
    nb = io.StringIO()  # an n-best list: the averaged posteriors' beam search
    transcribe(ens, [str(synth_pair[1])], beam=4, nbest=2, threads=1, out=nb, progress=False)
    nb_post = io.StringIO()
    transcribe(load_ensemble(pair, "posteriors"), [str(synth_pair[1])], beam=4, nbest=2,
               threads=1, out=nb_post, progress=False)
    assert nb.getvalue() == nb_post.getvalue() and nb.getvalue()


def _permuted_copy(src, dst, perm: list[int]):
    """The same network with its labels (and output rows) in another order."""
    ck = torch.load(src, weights_only=True)
    C = len(ck["labels"]) + 1
    rows = torch.tensor(perm + [C - 1])
    ck["labels"] = [ck["labels"][i] for i in perm]
    for k in ("out.weight", "out.bias"):
        ck["model"][k] = ck["model"][k][rows].clone()
    torch.save(ck, dst)


def test_labels_are_matched_by_name(random_models, synth_pair, capsys):
    d, h, _, _ = random_models
    perm = list(range(len(h.labels)))[::-1]
    _permuted_copy(d / "m0.pt", d / "m0_reversed.pt", perm)
    pair = f"{d / 'm0.pt'},{d / 'm0_reversed.pt'}"
    for combine in ("posteriors", "vote"):
        rc, single, _ = _cli(capsys, "decode", d / "m0.pt", synth_pair[1])
        rc2, ens, err = _cli(capsys, "decode", pair, synth_pair[1], "--combine", combine)
        assert rc == rc2 == 0, err
        assert ens == single


def test_ensembles_that_cannot_combine_are_refused_in_one_line(random_models, synth_pair,
                                                               capsys, tmp_path):
    d, h, nets, seqs = random_models
    make_checkpoint(tmp_path / "slow.pt", h.input_size, h.labels, subsample=3)
    other = h.labels[:-1] + ["zz"]
    make_checkpoint(tmp_path / "abc.pt", h.input_size, other)
    val = synth_pair[1]
    slow = f"{d / 'm0.pt'},{tmp_path / 'slow.pt'}"
    cases = [
        (["decode", slow, val, "--combine", "posteriors"], "one frame rate"),
        (["decode", slow, val, "--beam", "4"], "one frame rate"),  # auto: posteriors asked
        (["decode", f"{d / 'm0.pt'},{tmp_path / 'abc.pt'}", val], "alphabet"),
        (["eval", f"{d / 'm0.pt'},{d / 'm1.pt'}", val, "--combine", "vote", "--beam", "4"],
         "no --beam"),
        (["eval", f"{d / 'm0.pt'},{d / 'm1.pt'}", val, "--combine", "avg"], "--combine"),
    ]
    for args, msg in cases:
        rc, _, err = _cli(capsys, *args)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and msg in lines[0], (args, err)
    # voting needs no common frame rate, and is the default for a best path
    for extra in (["--combine", "vote"], []):
        rc, out, err = _cli(capsys, "decode", slow, val, *extra)
        assert rc == 0 and len(out.splitlines()) == h.num_seqs, err


# ---------------------------------------------------------------- crossfold


def _fold_config(tmp_path, synth_pair):
    cfg = tmp_path / "cf.toml"
    cfg.write_text(f'[data]\ntrain = "{synth_pair[0]}"\nval = "{synth_pair[1]}"\n'
                   "[model]\nlayers = 1\nhidden = 8\n[train]\nepochs = 2\ninput_noise = 0.1\n"
                   "[batch]\nbatch_frames = 600\n[compute]\nthreads = 1\n"
                   "[checkpoint]\nevery_steps = 3\n[log]\nprogress = \"lines\"\n")
    return cfg


def test_crossfold_prints_its_commands_and_refuses_to_mix_folds(tmp_path, synth_pair,
                                                                capsys):
    cfg = _fold_config(tmp_path, synth_pair)
    out = tmp_path / "cf"
    rc, text, err = _cli(capsys, "crossfold", cfg, "--folds", 3, "--out", out, "--print",
                         "model.hidden=6")
    assert rc == 0, err
    lines = text.splitlines()
    assert len(lines) == 3 and all(f"data.fold={i} data.folds=3" in ln and
                                   f"run.dir={out / f'fold-{i}'}" in ln and
                                   ln.endswith("--resume if-any") for i, ln in enumerate(lines))
    rec = json.loads((out / "crossfold.json").read_text())
    assert rec["folds"] == 3 and rec["overrides"] == ["model.hidden=6"]
    for args, msg in [(["--folds", 3, "model.hidden=7"], "holds another crossfold"),
                      (["--folds", 4, "model.hidden=6"], "holds another crossfold"),
                      (["--folds", 3, "data.fold=1"], "sets data.fold itself"),
                      (["--folds", 1], "2 or more")]:
        rc, _, err = _cli(capsys, "crossfold", cfg, "--out", out, "--print", *args)
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    # no fold has trained yet: the folder is not a model yet
    rc, _, err = _cli(capsys, "eval", out, synth_pair[1])
    assert rc == 2 and "without a checkpoint yet: fold-0, fold-1, fold-2" in err


def test_crossfold_resumes_after_a_kill_to_the_weights_of_direct_training(tmp_path,
                                                                         synth_pair, capsys):
    """A crossfold killed inside its first fold (a real subprocess, SIGKILL after step 4)
    and run again ends with each fold's weights bit-identical to training that fold
    directly; its folder is then an ensemble for eval."""
    from tests.test_resume import assert_same_final, launch
    cfg = _fold_config(tmp_path, synth_pair)
    out = tmp_path / "cf"
    cmd = [sys.executable, "-m", "rnntrain", "crossfold", str(cfg), "--folds", "2",
           "--out", str(out), "--show-output"]
    rc, err = launch(cmd, pause="step:4")
    assert rc is None and not (out / "fold-1").exists()
    assert (out / "fold-0" / "checkpoints" / "step-00000003.pt").exists()
    rc, err = launch(cmd)
    assert rc == 0, err[-3000:]
    assert "resumed from" in err and "fold 1 of 2" in err
    for i in (0, 1):
        ref = train_here(cfg, "data.folds=2", f"data.fold={i}", 'data.val=""',
                         f"run.dir={tmp_path / f'direct-{i}'}")
        assert_same_final(ref, out / f"fold-{i}")
    rc, text, err = _cli(capsys, "eval", out, synth_pair[1], "--json")
    assert rc == 0 and json.loads(text)["seqs"] > 0, err
    shutil.rmtree(tmp_path / "direct-0")


def test_a_crossfold_with_a_test_set_scores_its_ensemble_both_ways(tmp_path, synth_pair,
                                                                   capsys):
    from rnntrain.tools.crossfold import fold_runs, score_ensemble
    cfg = _fold_config(tmp_path, synth_pair)
    out = tmp_path / "cf"
    for name, ov in fold_runs(2, [f"data.test={synth_pair[1]}"]):
        train_here(cfg, *ov, f"run.dir={out / name}")
    (out / "crossfold.json").write_text(json.dumps({"runs": ["fold-0", "fold-1"]}))
    score_ensemble(out, str(synth_pair[1]), ["fold-0", "fold-1"])
    table = (out / "ensemble.md").read_text()
    for how in ("vote", "posteriors"):  # as eval scores it
        rc, text, err = _cli(capsys, "eval", out, synth_pair[1], "--json", "--combine", how)
        assert rc == 0, err
        assert f"| ensemble of 2, --combine {how} | {json.loads(text)['ler']:.4f} |" in table
    for i in (0, 1):  # each fold alone: the test score its run logged
        rc, text, err = _cli(capsys, "eval", out / f"fold-{i}", synth_pair[1], "--json")
        assert f"| fold-{i} alone | {json.loads(text)['ler']:.4f} |" in table
