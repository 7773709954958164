"""``rnntrain-data kaldi`` with Kaldi's own features: feats.scp into binary, compressed and
text archives (written by kaldiio here, and a text archive written by hand), CMVN per
utterance / per speaker / from cmvn.scp checked against numpy, piped commands refused
unless ``--allow-pipes``; every error one line naming the file and the utterance or line.
Through the real CLI; the .nc read back with the project's reader."""
from __future__ import annotations

import os

import numpy as np
import pytest
from scipy.io import wavfile

from rnntrain.data.ncdata import read_file
from tests.conftest import run_cli, run_cli_batch

kaldiio = pytest.importorskip("kaldiio")

SPK = {"spkA-u1": "spkA", "spkA-u2": "spkA", "spkB-u1": "spkB", "spkB-u2": "spkB"}
TEXT = {"spkA-u1": "yes no", "spkA-u2": "no", "spkB-u1": "yes yes", "spkB-u2": "no yes no"}


def _feats(seed=0, f=5):
    """Utterance → (T, F) float32 features with a per-speaker offset (what CMVN removes)."""
    rng = np.random.default_rng(seed)
    off = {"spkA": rng.normal(3, 1, f), "spkB": rng.normal(-2, 1, f)}
    return {u: (rng.normal(size=(6 + 3 * i, f)) * (1 + i) + off[s]).astype(np.float32)
            for i, (u, s) in enumerate(SPK.items())}


def _data_dir(d, utt2spk=True):
    d.mkdir(parents=True, exist_ok=True)
    (d / "text").write_text("".join(f"{u} {t}\n" for u, t in TEXT.items()))
    if utt2spk:
        (d / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in SPK.items()))
    return d


def _global(raw):
    """The corpus-wide normalisation every converter applies (numpy, float64)."""
    allf = np.concatenate(raw)
    return [(r - allf.mean(axis=0)) / allf.std(axis=0) for r in raw]


def _check(nc, want):
    h, seqs = read_file(nc)
    assert h.tags == list(TEXT) and h.labels == ["no", "yes"]
    assert [" ".join(h.labels[k] for k in t) for t in h.targets] == list(TEXT.values())
    for got, w in zip(seqs, _global(want)):
        np.testing.assert_allclose(got, w, atol=2e-5)


def _ok(r):
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _one_line(r):
    assert r.returncode == 2, (r.args, r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_feats_scp_binary_archive_no_cmvn_and_validation_stats(tmp_path):
    x = _feats()
    d = _data_dir(tmp_path / "data" / "train")
    # relative to the data folder (a folder moved on its own), as wav.scp paths
    kaldiio.save_ark(str(d / "feats.ark"), x, scp=str(tmp_path / "f.scp"))
    (d / "feats.scp").write_text((tmp_path / "f.scp").read_text()
                                 .replace(str(d / "feats.ark"), "feats.ark"))
    assert " feats.ark:" in (d / "feats.scp").read_text()
    out = _ok(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "train.nc"))
    assert "4 utterances, 2 speakers; 5 Kaldi features per frame from" in out
    _check(tmp_path / "train.nc", [x[u].astype(np.float64) for u in TEXT])
    # a validation set: the training statistics applied, not its own
    v = _data_dir(tmp_path / "data" / "dev")
    y = _feats(seed=1)
    kaldiio.save_ark(str(v / "feats.ark"), y, scp=str(v / "feats.scp"))
    _ok(run_cli("data_tools", "kaldi", v, "--out", tmp_path / "dev.nc", "--stats",
                tmp_path / "train.nc.stats.json"))
    allf = np.concatenate([x[u].astype(np.float64) for u in TEXT])
    h, seqs = read_file(tmp_path / "dev.nc")
    for u, got in zip(TEXT, seqs):
        np.testing.assert_allclose(got, (y[u] - allf.mean(0)) / allf.std(0), atol=2e-5)
    # the same statistics with another CMVN would normalise different frames: refused
    line = _one_line(run_cli("data_tools", "kaldi", v, "--out", tmp_path / "dev2.nc",
                             "--stats", tmp_path / "train.nc.stats.json", "--cmvn",
                             "utterance"))
    assert "train.nc.stats.json: statistics were computed with features" in line
    assert "'cmvn': 'none'" in line and not (tmp_path / "dev2.nc").exists()


def test_compressed_archive_with_speaker_cmvn_matches_numpy(tmp_path):
    x = _feats()
    d = _data_dir(tmp_path / "d")
    kaldiio.save_ark(str(tmp_path / "c.ark"), x, scp=str(d / "feats.scp"),
                     compression_method=2)  # copy-feats --compress=true's default kind
    held = {u: kaldiio.load_mat(s) for u, s in
            (ln.split() for ln in (d / "feats.scp").read_text().splitlines())}
    assert max(np.abs(held[u] - x[u]).max() for u in x) > 0  # lossy: really compressed
    for vars_ in (False, True):
        args = ["--cmvn", "speaker"] + (["--cmvn-vars"] if vars_ else [])
        out = _ok(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "s.nc", *args))
        assert "CMVN per speaker" in out
        want = []
        for u in TEXT:  # numpy: the speaker's frames, all of its utterances together
            frames = np.concatenate([held[v].astype(np.float64) for v in SPK
                                     if SPK[v] == SPK[u]])
            y = held[u].astype(np.float64) - frames.mean(axis=0)
            want.append(y / frames.std(axis=0) if vars_ else y)
        _check(tmp_path / "s.nc", want)
    # cmvn.scp written as Kaldi's compute-cmvn-stats does (per speaker, sums + count;
    # sums of squares): --cmvn scp gives the frames --cmvn speaker gave
    stats = {}
    for s in ("spkA", "spkB"):
        frames = np.concatenate([held[u].astype(np.float64) for u in SPK if SPK[u] == s])
        m = np.zeros((2, 6))
        m[0, :5], m[0, 5], m[1, :5] = frames.sum(0), len(frames), (frames ** 2).sum(0)
        stats[s] = m
    kaldiio.save_ark(str(tmp_path / "cmvn.ark"), stats, scp=str(d / "cmvn.scp"))
    out = _ok(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "k.nc", "--cmvn", "scp",
                      "--cmvn-vars"))
    assert f"CMVN from {d / 'cmvn.scp'}" in out
    np.testing.assert_allclose(np.concatenate(read_file(tmp_path / "k.nc")[1]),
                               np.concatenate(read_file(tmp_path / "s.nc")[1]), atol=2e-5)


def test_text_archive_written_by_hand_with_utterance_cmvn(tmp_path):
    rng = np.random.default_rng(3)
    x = {u: np.round(rng.normal(size=(4 + i, 3)) * 10, 2) for i, u in enumerate(TEXT)}
    # Kaldi's text form: "key  [\n rows\n rows ]", numbers as written
    ark = tmp_path / "feats.txt.ark"
    ark.write_text("".join(f"{u}  [\n" + "\n".join("  " + " ".join(f"{v:g}" for v in row)
                                                   for row in m) + " ]\n"
                           for u, m in x.items()))
    d = _data_dir(tmp_path / "d", utt2spk=False)
    out = _ok(run_cli("data_tools", "kaldi", d, "--feats", ark, "--out", tmp_path / "t.nc",
                      "--cmvn", "utterance"))
    assert "4 utterances; 3 Kaldi features per frame" in out and "CMVN per utterance" in out
    _check(tmp_path / "t.nc", [x[u] - x[u].mean(axis=0) for u in TEXT])


def test_pipes_are_run_only_when_allowed(tmp_path):
    """wav.scp and feats.scp lines ending in '|' run a shell command: refused by default;
    with --allow-pipes the command's output is read like the file it prints."""
    rate = 8000
    t = np.arange(int(0.5 * rate)) / rate
    wavfile.write(tmp_path / "a.wav", rate, (0.3 * np.sin(2 * np.pi * 440 * t) * 32767
                                             ).astype(np.int16))
    d = tmp_path / "w"
    d.mkdir()
    (d / "text").write_text("u1 yes\nu2 no\n")
    (d / "wav.scp").write_text(f"u1 {tmp_path / 'a.wav'}\nu2 cat {tmp_path / 'a.wav'} |\n")
    m = _feats()["spkA-u1"]
    kaldiio.save_mat(str(tmp_path / "one.mat"), m)
    f = _data_dir(tmp_path / "f")
    (f / "text").write_text("spkA-u1 yes\n")
    (f / "feats.scp").write_text(f"spkA-u1 cat {tmp_path / 'one.mat'} |\n")
    refused = run_cli_batch([("data_tools", "kaldi", str(d), "--out", str(tmp_path / "o.nc")),
                             ("data_tools", "kaldi", str(f), "--out", str(tmp_path / "o.nc"))])
    line = _one_line(refused[0])
    assert f"{d / 'wav.scp'} line 2: 'u2' is a piped command" in line
    assert "--allow-pipes" in line
    assert f"{f / 'feats.scp'} line 1: 'spkA-u1' is a piped command" in _one_line(refused[1])
    assert not (tmp_path / "o.nc").exists()
    _ok(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "p.nc", "--allow-pipes"))
    seqs = read_file(tmp_path / "p.nc")[1]
    np.testing.assert_array_equal(seqs[0], seqs[1])  # the piped WAV is the same audio
    # segments of a piped recording: the same spans as of the file
    (d / "wav.scp").write_text(f"r1 {tmp_path / 'a.wav'}\nr2 cat {tmp_path / 'a.wav'} |\n")
    (d / "segments").write_text("u1 r1 0.1 0.3\nu2 r2 0.1 0.3\n")
    _ok(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "s.nc", "--allow-pipes"))
    seqs = read_file(tmp_path / "s.nc")[1]
    assert len(seqs[0]) < len(read_file(tmp_path / "p.nc")[1][0])
    np.testing.assert_array_equal(seqs[0], seqs[1])
    (d / "segments").unlink()
    _ok(run_cli("data_tools", "kaldi", f, "--out", tmp_path / "q.nc", "--allow-pipes"))
    got = read_file(tmp_path / "q.nc")[1][0]
    np.testing.assert_allclose(got, (m - m.mean(0)) / m.std(0), atol=2e-5)
    # a failing command: one line naming the table line and the command
    (d / "wav.scp").write_text(f"u1 {tmp_path / 'a.wav'}\nu2 false |\n")
    line = _one_line(run_cli("data_tools", "kaldi", d, "--out", tmp_path / "o.nc",
                             "--allow-pipes"))
    assert f"{d / 'wav.scp'} line 2 (utterance 'u2')" in line and "'false' failed" in line


def test_errors_name_the_file_and_the_utterance(tmp_path):
    x = _feats()
    d = _data_dir(tmp_path / "d")
    kaldiio.save_ark(str(d / "feats.ark"), x, scp=str(d / "feats.scp"))
    scp = (d / "feats.scp").read_text().splitlines()
    cases = []

    def case(name, table_lines=None, extra=(), want=(), data=None):
        dd = data or _data_dir(tmp_path / name)
        if table_lines is not None:
            (dd / "feats.scp").write_text("".join(ln + "\n" for ln in table_lines))
        cases.append((name, ["kaldi", str(dd), "--out", str(tmp_path / "o.nc"), *extra], want))

    case("missing utterance", scp[:3], want=["text line 4: utterance 'spkB-u2' is not in",
                                             "feats.scp"])
    case("offset past the end", scp[:3] + [f"spkB-u2 {d / 'feats.ark'}:999999"],
         want=["feats.scp line 4 (utterance 'spkB-u2'):", "feats.ark:999999: cannot read a "
               "Kaldi matrix"])
    os.mkfifo(tmp_path / "fifo.ark")
    case("archive is a FIFO", scp[:3] + [f"spkB-u2 {tmp_path / 'fifo.ark'}:3"],
         want=["feats.scp line 4 (utterance 'spkB-u2'):", "fifo.ark: feature archive is a "
               "FIFO (named pipe), not a regular file"])
    case("duplicate id", scp + scp[:1], want=["feats.scp line 5: id 'spkA-u1' already on "
                                              "line 1"])
    bad = tmp_path / "bad.ark"  # a text archive whose second matrix loses a column
    bad.write_text("spkA-u1  [\n 1 2 3\n 4 5 6 ]\nspkA-u2  [\n 1 2 3\n 4 5 ]\n")
    case("ragged text archive", extra=["--feats", str(bad)],
         want=[f"{bad}: record 2: cannot read a Kaldi matrix (ValueError: the number of "
               "columns changed"])
    vec = tmp_path / "vec.ark"
    vec.write_text("spkA-u1 [ 1 2 3 ]\nspkA-u2 [ 1 2 3 ]\nspkB-u1 [ 1 2 3 ]\n"
                   "spkB-u2 [ 1 2 3 ]\n")
    case("vector, not matrix", extra=["--feats", str(vec)],
         want=[f"{vec} record 1 (utterance 'spkA-u1'): {vec}:", "a 1-D int32 array, not a "
               "(frames, features) matrix"])
    wide = {**x, "spkB-u1": np.zeros((4, 7), np.float32)}
    kaldiio.save_ark(str(tmp_path / "wide.ark"), wide)
    case("feature count changes", extra=["--feats", str(tmp_path / "wide.ark")],
         want=["wide.ark record 3 (utterance 'spkB-u1'):", "7 features per frame, the first "
               "matrix has 5"])
    case("--features with feats", data=d, extra=["--features", "mfcc"],
         want=["--features sets how audio becomes features", "feats.scp"])
    nospk = _data_dir(tmp_path / "nospk", utt2spk=False)
    (nospk / "feats.scp").write_text((d / "feats.scp").read_text())
    case("speaker cmvn without utt2spk", data=nospk, extra=["--cmvn", "speaker"],
         want=[f"{nospk}: --cmvn speaker needs utt2spk"])
    case("scp cmvn without cmvn.scp", data=d, extra=["--cmvn", "scp"],
         want=[f"{d}: --cmvn scp needs cmvn.scp"])
    w = _data_dir(tmp_path / "wavonly")
    (w / "wav.scp").write_text(f"spkA-u1 {tmp_path / 'a.wav'}\n")
    case("cmvn on wav.scp", data=w, extra=["--cmvn", "utterance"],
         want=["--cmvn applies to Kaldi feature matrices"])
    results = run_cli_batch([("data_tools", *argv) for _, argv, _ in cases], timeout=120)
    for (name, _, want), r in zip(cases, results):
        line = _one_line(r)
        for w_ in want:
            assert w_ in line, (name, line)
    assert not (tmp_path / "o.nc").exists()


def test_data_dir_with_feats_and_wav_prefers_feats_unless_told(tmp_path):
    rate = 8000
    wavfile.write(tmp_path / "a.wav", rate, (np.random.default_rng(0).normal(size=rate) *
                                             3000).astype(np.int16))
    d = _data_dir(tmp_path / "d")
    (d / "wav.scp").write_text("".join(f"{u} {tmp_path / 'a.wav'}\n" for u in TEXT))
    kaldiio.save_ark(str(d / "feats.ark"), _feats(), scp=str(d / "feats.scp"))
    assert "5 Kaldi features per frame" in _ok(run_cli(
        "data_tools", "kaldi", d, "--out", tmp_path / "f.nc"))
    assert read_file(tmp_path / "f.nc")[0].input_size == 5
    assert "fbank 40 features at 8000 Hz" in _ok(run_cli(
        "data_tools", "kaldi", d, "--out", tmp_path / "w.nc", "--from", "wav"))
    assert read_file(tmp_path / "w.nc")[0].input_size == 40
