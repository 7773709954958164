"""Inputs people already have: Kaldi data directories, Lhotse cut sets, FLAC/OGG files,
through the real ``rnntrain-data`` CLI; features checked against the front end applied to
the independently sliced signal, normalised with numpy statistics."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from scipy.io import wavfile

from data_tools import features as feat
from rnntrain.data.ncdata import read_file
from tests.conftest import run_cli

RATE = 8000


def _signal(seed, seconds):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return 0.3 * np.sin(2 * np.pi * (300 + 50 * seed) * t) + 0.05 * rng.normal(size=t.size)


def _wav(path, x):
    wavfile.write(path, RATE, (x * 32767).astype(np.int16))
    return (x * 32767).astype(np.int16).astype(np.float64) / 32768.0  # what the file holds


def _normalised(raw):
    allf = np.concatenate(raw)
    return [(r - allf.mean(axis=0)) / allf.std(axis=0) for r in raw]


def _error_line(r):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r.stderr.strip().splitlines()[-1]


def test_kaldi_dir_with_segments_and_utt2spk(tmp_path):
    cfg = feat.FeatureConfig(rate=RATE)
    rec = {"recA": _wav(tmp_path / "a.wav", _signal(1, 2.0)),
           "recB": _wav(tmp_path / "b.wav", _signal(2, 1.5))}
    d = tmp_path / "data" / "train"
    d.mkdir(parents=True)
    # absolute and relative (to the data folder) paths both appear in real wav.scp files
    (d / "wav.scp").write_text(f"recA {tmp_path / 'a.wav'}\nrecB ../../b.wav\n")
    segs = [("spk1-u1", "recA", 0.10, 0.80), ("spk1-u2", "recA", 0.90, 1.95),
            ("spk2-u1", "recB", 0.0, -1), ("spk2-u2", "recB", 0.5, 1.2)]
    (d / "segments").write_text("".join(f"{u} {r} {s} {e}\n" for u, r, s, e in segs))
    text = {"spk1-u1": "yes no", "spk1-u2": "no", "spk2-u1": "yes yes no"}  # spk2-u2: none
    (d / "text").write_text("".join(f"{u} {t}\n" for u, t in text.items()))
    (d / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u, *_ in segs))
    r = run_cli("data_tools", "kaldi", d, "--out", tmp_path / "train.nc")
    assert r.returncode == 0, r.stderr
    assert "3 utterances from 2 recordings, 2 speakers; 1 without a transcript" in r.stdout
    raw = []
    for u, rid, s, e in segs[:3]:
        x = rec[rid][int(round(s * RATE)):None if e == -1 else int(round(e * RATE))]
        raw.append(feat.compute(x, cfg).astype(np.float64))
    h, seqs = read_file(tmp_path / "train.nc")
    assert h.tags == list(text) and h.labels == ["no", "yes"]
    assert [" ".join(h.labels[k] for k in t) for t in h.targets] == list(text.values())
    for got, want in zip(seqs, _normalised(raw)):
        np.testing.assert_allclose(got, want, atol=1e-4)
    # characters as labels, '|' between words
    r = run_cli("data_tools", "kaldi", d, "--out", tmp_path / "chars.nc", "--units", "chars")
    assert r.returncode == 0, r.stderr
    h = read_file(tmp_path / "chars.nc")[0]
    assert [" ".join(h.labels[k] for k in t) for t in h.targets][0] == "y e s | n o"


def test_kaldi_dir_errors_name_file_and_line(tmp_path):
    _wav(tmp_path / "a.wav", _signal(1, 0.5))
    d = tmp_path / "k"
    d.mkdir()
    (d / "text").write_text("u1 yes\nu2 no\n")
    (d / "wav.scp").write_text(f"u1 {tmp_path / 'a.wav'}\nu2 sph2pipe -f wav /x/u2.sph |\n")
    line = _error_line(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "o.nc"))
    assert f"{d / 'wav.scp'} line 2" in line and "piped command" in line and "u2" in line
    (d / "wav.scp").write_text(f"u1 {tmp_path / 'a.wav'}\nu2 {tmp_path / 'missing.wav'}\n")
    line = _error_line(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "o.nc"))
    assert f"{d / 'wav.scp'} line 2 (utterance 'u2')" in line and "file not found" in line
    (d / "wav.scp").write_text(f"u1 {tmp_path / 'a.wav'}\n")
    line = _error_line(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "o.nc"))
    assert f"{d / 'text'} line 2" in line and "'u2' is not in" in line
    assert not (tmp_path / "o.nc").exists()


def test_flac_and_ogg_read_like_the_wav_they_came_from(tmp_path):
    sf = pytest.importorskip("soundfile")
    x = _signal(3, 0.6)
    held = _wav(tmp_path / "a.wav", x)
    sf.write(tmp_path / "a.flac", held, RATE, subtype="PCM_16")  # lossless: same samples
    sf.write(tmp_path / "b.ogg", x, RATE)                          # Vorbis: lossy
    (tmp_path / "list.tsv").write_text("a.wav\tyes\na.flac\tyes\nb.ogg\tno\n")
    r = run_cli("data_tools", "audio", "--list", tmp_path / "list.tsv", "--out",
                tmp_path / "o.nc")
    assert r.returncode == 0, r.stderr
    h, seqs = read_file(tmp_path / "o.nc")
    np.testing.assert_array_equal(seqs[0], seqs[1])  # FLAC decodes to the WAV's samples
    assert seqs[2].shape == seqs[0].shape
    # Vorbis is lossy: its features are close to the original's, not equal
    assert np.corrcoef(seqs[2].ravel(), seqs[0].ravel())[0, 1] > 0.9


def test_audio_list_errors_name_list_and_line_for_the_first_entry_too(tmp_path):
    (tmp_path / "list.tsv").write_text("# header\nmissing.wav\tyes\n")
    line = _error_line(run_cli("data_tools", "audio", "--list", tmp_path / "list.tsv",
                               "--out", tmp_path / "o.nc"))
    assert f"{tmp_path / 'list.tsv'} line 2: " in line and "missing.wav: file not found" in line
    (tmp_path / "bad.flac").write_bytes(b"not audio at all")
    (tmp_path / "list.tsv").write_text("bad.flac\tyes\n")
    line = _error_line(run_cli("data_tools", "audio", "--list", tmp_path / "list.tsv",
                               "--out", tmp_path / "o.nc"))
    assert f"{tmp_path / 'list.tsv'} line 1: " in line and "cannot read as audio" in line


def test_lhotse_cut_set(tmp_path):
    lhotse = pytest.importorskip("lhotse")
    cfg = feat.FeatureConfig(rate=RATE)
    held = _wav(tmp_path / "long.wav", _signal(4, 2.0))
    rec = lhotse.Recording.from_file(tmp_path / "long.wav", recording_id="long")
    cuts = []
    for i, (start, dur, text) in enumerate([(0.2, 0.7, "yes no"), (1.0, 0.9, "no")]):
        sup = lhotse.SupervisionSegment(id=f"s{i}", recording_id="long", start=start,
                                        duration=dur, text=text)
        cuts.append(lhotse.MonoCut(id=f"c{i}", start=start, duration=dur, channel=0,
                                   recording=rec, supervisions=[sup]))
    path = tmp_path / "cuts.jsonl.gz"
    lhotse.CutSet.from_cuts(cuts).to_file(path)
    r = run_cli("data_tools", "lhotse", path, "--out", tmp_path / "o.nc")
    assert r.returncode == 0, r.stderr
    raw = [feat.compute(held[int(round(s * RATE)):int(round(s * RATE)) + int(round(d * RATE))],
                        cfg).astype(np.float64) for s, d in ((0.2, 0.7), (1.0, 0.9))]
    h, seqs = read_file(tmp_path / "o.nc")
    assert h.tags == ["c0", "c1"] and h.labels == ["no", "yes"]
    for got, want in zip(seqs, _normalised(raw)):
        np.testing.assert_allclose(got, want, atol=1e-4)
    # a cut whose audio is gone: named, one line
    with gzip.open(path, "rt") as fh:
        recs = [json.loads(ln) for ln in fh]
    recs[1]["recording"]["sources"][0]["source"] = str(tmp_path / "gone.wav")
    with gzip.open(tmp_path / "bad.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(x) + "\n" for x in recs)
    line = _error_line(run_cli("data_tools", "lhotse", tmp_path / "bad.jsonl.gz", "--out",
                               tmp_path / "bad.nc"))
    assert "cut 2 ('c1')" in line
