"""Done-when of issue 15 on real speech: a tiny model trained on FSDD recordings converted
by ``rnntrain-data audio`` transcribes the raw WAV files exactly as ``decode`` and ``eval``
see the converted file — through the CLI, the Python API and both export formats.

Needs ../shared/data (FSDD); skipped without it. One model is trained for the module.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import rnntrain
from rnntrain.data.ncdata import read_file
from tests.conftest import run_cli

_ROOT = Path(__file__).resolve().parents[1]
# $RNNTRAIN_DATA as the recipes read it, else ../shared/data beside the checkout (or beside
# the folder of worktrees)
REC = next((p / "fsdd" / "recordings" for p in
            [Path(os.environ.get("RNNTRAIN_DATA", _ROOT / "missing")),
             _ROOT.parent / "shared" / "data", _ROOT.parents[1] / "shared" / "data"]
            if (p / "fsdd" / "recordings").is_dir()), _ROOT / "missing")
# slow (left out of the default run): by default, test_infer.py checks transcribe, the API
# and both exports against the training network on synthetic data and converted audio
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not REC.is_dir(), reason="no FSDD recordings in shared/data")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("fsdd")
    wavs = [REC / f"{g}_{s}_{t}.wav" for g in range(10) for s in ("george", "jackson")
            for t in (10, 11, 12)]
    (d / "train.tsv").write_text("".join(f"{w}\t{w.name[0]}\n" for w in wavs))
    r = run_cli("data_tools", "audio", "--list", d / "train.tsv", "--out", d / "train.nc")
    assert r.returncode == 0, r.stderr
    (d / "c.toml").write_text(
        f'[data]\ntrain = "{d / "train.nc"}"\n[model]\nlayers = 1\nhidden = 32\nsubsample = 2\n'
        f'[optim]\nlr = 0.02\n[train]\nepochs = 15\n[batch]\nbatch_frames = 400\n'
        f'[compute]\nthreads = 1\n'
        f'[run]\ndir = "{d / "run"}"\n')
    r = run_cli("rnntrain", "train", d / "c.toml", timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli("rnntrain", "decode", d / "run", d / "train.nc")  # a run folder
    assert r.returncode == 0, r.stderr
    decoded = dict(ln.split("\t") for ln in r.stdout.splitlines())
    assert sorted(decoded) == sorted(w.name for w in wavs)
    return d, wavs, decoded


def _hyps(stdout: str) -> dict[str, str]:
    return {Path(ln.split("\t")[0]).name: ln.split("\t")[1] for ln in stdout.splitlines()}


def test_transcribing_the_raw_wavs_gives_what_decode_and_eval_give(run):
    d, wavs, decoded = run
    assert any(decoded.values())  # the model emits labels: the comparison is not vacuous
    r = run_cli("rnntrain", "transcribe", d / "run", d / "train.tsv")
    assert r.returncode == 0, r.stderr
    assert _hyps(r.stdout) == decoded
    for ln in r.stdout.splitlines():  # peak times: one per label, inside the recording
        _, hyp, times = ln.split("\t")
        assert len(times.split()) == len(hyp.split())
        assert all(re.fullmatch(r"\d+\.\d\d", t) for t in times.split())
    # eval on the converted file counts the same hypotheses' errors
    r = run_cli("rnntrain", "eval", d / "run", d / "train.nc", "--json")
    assert r.returncode == 0, r.stderr
    errors = sum(h != w.name[0] for w, h in zip(wavs, (decoded[w.name] for w in wavs)))
    assert json.loads(r.stdout)["seq_error"] == pytest.approx(errors / len(wavs))


def test_python_api_makes_the_training_frames_from_raw_audio(run, tmp_path):
    d, wavs, decoded = run
    m = rnntrain.load(d / "run")
    assert m.labels == [str(k) for k in range(10)] and m.frontend.features.kind == "fbank"
    assert m.frame_seconds == pytest.approx(0.02)   # 10 ms hop x stacking 2
    h, rows = read_file(d / "train.nc")
    for i in range(0, len(wavs), 7):
        np.testing.assert_array_equal(m.frames(wavs[i]), rows[i])   # bit for bit
        assert m.transcribe(wavs[i]).text == decoded[wavs[i].name]
    # other containers and rates: FLAC is lossless, 16 kHz is resampled back to 8 kHz
    import soundfile as sf
    from scipy.signal import resample_poly
    x, rate = sf.read(wavs[0], dtype="int16")
    sf.write(tmp_path / "a.flac", x, rate)
    np.testing.assert_array_equal(m.frames(tmp_path / "a.flac"), rows[0])
    np.testing.assert_array_equal(m.frames(x), rows[0])          # int16 PCM at the model rate
    sig = x / 32768.0
    np.testing.assert_array_equal(m.frames(sig), rows[0])        # the same as floats
    assert m.transcribe(sig).text == decoded[wavs[0].name]
    up = resample_poly(sig, 2, 1)
    sf.write(tmp_path / "a16k.wav", up, 2 * rate, subtype="FLOAT")
    f16 = m.frames(tmp_path / "a16k.wav")
    assert f16.shape == rows[0].shape
    # 8k → 16k → 8k: log-mel bands away from the band edges stay close (normalised units)
    assert np.median(np.abs(f16[2:-2, 2:35] - rows[0][2:-2, 2:35])) < 0.05
    lp = m.log_probs(rows[0])
    assert lp.shape == (-(-len(rows[0]) // 2), 11)
    np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1, atol=1e-5)


def test_both_exports_transcribe_the_wavs_like_the_checkpoint(run):
    d, wavs, decoded = run
    # TorchScript through the Python API (in this process), ONNX through the commands
    m = rnntrain.load(d / "run")
    ts = rnntrain.load(m.export(d / "m.ts", "torchscript",
                                check_frames=[m.frames(w) for w in wavs[:4]]))
    assert {w.name: ts.transcribe(w).text for w in wavs} == decoded
    r = run_cli("rnntrain", "export", d / "run", "--format", "onnx", "--out", d / "m.onnx",
                "--check", *wavs[:4])
    assert r.returncode == 0, r.stderr
    r = run_cli("rnntrain", "transcribe", d / "m.onnx", d / "train.tsv", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert _hyps(r.stdout) == decoded
    for e in (ts, rnntrain.load(d / "m.onnx")):
        assert e.frontend == m.frontend and e.labels == m.labels  # the metadata travelled
