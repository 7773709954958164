"""``rnntrain-data rnnlib-config``: RNNLIB configs → TOML that rnntrain loads (and trains)."""
from __future__ import annotations

import numpy as np

from rnntrain.config import load_config
from rnntrain.data.ncdata import read_header
from tests.conftest import run_cli

# IAM-OnDB style online handwriting (RNNLIB's examples/online_transcription)
ONLINE = """\
task transcription
hiddenType lstm
trainFile {train}
valFile {val}
dataFraction 1
maxTestsNoBest 20
hiddenSize 100
learnRate 1e-4
momentum 0.9
optimiser steepest
seqsPerWeightUpdate 4
inputNoiseDev 0.1
randSeed 42
verbose false
"""

# RNNLIB's examples/arabic_online_transcription/arabic_online.config, plus an unknown key
ARABIC = """\
task transcription
hiddenType lstm
trainFile arabic_online.nc
dataFraction 1
maxTestsNoBest 20
hiddenSize 20,60,180
subsampleSize 20,60
hiddenBlock 2;2
learnRate 1e-4
momentum 0.9
optimiser steepest
verbose false
fooBarWidth 7
"""

# TIMIT-style phoneme transcription with stacked input frames and Rprop
TIMIT = """\
# phoneme recognition, MFCC + deltas
task transcription
trainFile train.nc,train_extra.nc
valFile val.nc
testFile test.nc
hiddenSize 100,100,100
bidirectional false
inputBlock 3
optimiser rprop
totalEpochs 50
maxTestsNoBest 0
dataFraction 0.5
initWeightRange 0.2
"""


def convert(tmp_path, text, name="old.config"):
    cfg = tmp_path / name
    cfg.write_text(text)
    r = run_cli("data_tools", "rnnlib-config", cfg, cwd=tmp_path)
    warnings = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    return r, warnings


def test_online_handwriting_config_converts_loads_and_trains(tmp_path, synth_pair):
    train, val = synth_pair
    r, warnings = convert(tmp_path, ONLINE.format(train=train, val=val))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "new.toml"
    out.write_text(r.stdout)
    cfg = load_config(out)
    assert (cfg.data.train, cfg.data.val) == (str(train), str(val))
    assert (cfg.model.layers, cfg.model.hidden, cfg.model.cell, cfg.model.bidirectional) == \
        (1, 100, "peephole", True)
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.momentum, cfg.optim.normalize) == \
        ("sgd", 1e-4, 0.9, "sum")
    assert cfg.train.patience == 21            # RNNLIB stops on the 21st test without best
    assert (cfg.train.seed, cfg.train.input_noise) == (42, 0.1)
    mean = read_header(str(train)).lengths.mean()
    assert cfg.batch.batch_frames == int(round(4 * mean))
    assert not any("unknown" in w for w in warnings)
    assert any("verbose" in w and "ignored" in w for w in warnings)

    # the converted config trains as it is (shortened by overrides)
    t = run_cli("rnntrain", "train", out, "train.epochs=1", "model.hidden=8",
                f"run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert t.returncode == 0, t.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_arabic_config_warns_about_levels_and_unknown_keys(tmp_path):
    r, warnings = convert(tmp_path, ARABIC)
    assert r.returncode == 0, r.stderr
    text = "\n".join(warnings)
    assert "hiddenSize 20,60,180" in text and "using 180" in text
    assert "subsampleSize 20,60: no equivalent" in text
    assert "hiddenBlock 2;2: no equivalent" in text
    assert "fooBarWidth 7: unknown RNNLIB key" in text
    assert "seqsPerWeightUpdate 1" in text       # file not here: batch size must be set
    (tmp_path / "new.toml").write_text(r.stdout)
    cfg = load_config(tmp_path / "new.toml")
    assert (cfg.model.layers, cfg.model.hidden, cfg.data.train) == (3, 180, "arabic_online.nc")
    assert cfg.data.val == "" and cfg.batch.batch_frames == 1000


def test_timit_config_maps_input_block_and_reports_what_has_no_equivalent(tmp_path):
    r, warnings = convert(tmp_path, TIMIT)
    assert r.returncode == 0, r.stderr
    text = "\n".join(warnings)
    for expected in ("trainFile lists 2 files", "optimiser rprop", "dataFraction 0.5",
                     "initWeightRange 0.2", "randSeed 0"):
        assert expected in text, expected
    (tmp_path / "new.toml").write_text(r.stdout)
    cfg = load_config(tmp_path / "new.toml")
    assert (cfg.model.layers, cfg.model.hidden, cfg.model.subsample) == (3, 100, 3)
    assert cfg.model.bidirectional is False
    assert (cfg.data.train, cfg.data.val, cfg.data.test) == ("train.nc", "val.nc", "test.nc")
    assert (cfg.optim.name, cfg.train.epochs, cfg.train.patience) == ("adam", 50, 0)


def test_unconvertible_configs_fail_with_one_line(tmp_path):
    for text, msg in [("task classification\ntrainFile a.nc\nhiddenSize 10\n",
                       "task 'classification' cannot be converted"),
                      ("task transcription\ntrainFile a.nc\n", "hiddenSize is not set"),
                      ("task transcription\ntrainFile a.nc\nhiddenSize 10\n"
                       "bidirectional true,true\n", "1-D sequences only"),
                      ("task transcription\ntrainFile a.nc\nhiddenSize ten\n",
                       "hiddenSize 'ten' is not a number")]:
        r, _ = convert(tmp_path, text)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr
    r = run_cli("data_tools", "rnnlib-config", tmp_path / "missing.config")
    assert r.returncode == 2 and "not found" in r.stderr


def test_parse_takes_the_last_value_and_skips_comments():
    from data_tools.rnnlib_config import parse
    e = parse("# comment\nlearnRate 1e-3\n\nlearnRate  1e-5 \nverbose\n")
    assert e == {"learnRate": "1e-5", "verbose": ""}
    assert np.isclose(float(e["learnRate"]), 1e-5)


def test_dictionary_and_bigrams_point_at_the_decoding_options(tmp_path):
    """RNNLIB's dictionary is rnntrain's --lexicon, its bigrams an --lm: the warning says
    so instead of 'not supported'."""
    r, warnings = convert(tmp_path, "task transcription\ntrainFile t.nc\nhiddenSize 10\n"
                                    "dictionary words.dict\nbigrams b.txt\n")
    assert r.returncode == 0, r.stderr
    text = "\n".join(warnings)
    assert "not supported" not in text
    assert "dictionary words.dict:" in text and "--lexicon words.dict --space LABEL" in text
    assert "bigrams b.txt:" in text and "--lm LM.arpa" in text
