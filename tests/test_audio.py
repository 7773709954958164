"""Audio front end and converters: features against independent computations, statistics
shared by every split, FSDD strings never crossing the train/test takes, read-back through
the trainer's reader, and one-line errors for bad input."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from scipy.io import wavfile

from rnntrain.frontend import features as feat
from data_tools.audio import ArraySource, AudioSource, convert
from rnntrain.frontend.audio import read_audio as read_wav
from rnntrain.data.dataset import Dataset
from rnntrain.data.ncdata import read_file
from rnntrain.data.reader import ChunkReader
from tests.conftest import run_cli


def _signal(seed=0, seconds=0.5, rate=8000):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.normal(size=t.size)


def _mel(f):
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _edges_reference(n_mels, fmax):
    """Filter edges by bisection on the mel formula (no inverse formula used)."""
    targets = np.linspace(0.0, _mel(fmax), n_mels + 2)
    out = []
    for m in targets:
        lo, hi = 0.0, fmax * 2
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _mel(mid) < m else (lo, mid)
        out.append((lo + hi) / 2)
    return np.array(out)


def test_one_frame_matches_a_direct_dft():
    cfg = feat.FeatureConfig(rate=8000)
    x = _signal()
    k = 7  # a frame in the middle
    # independent: pre-emphasis by a loop, Hamming by its formula, DFT as a sum
    y = np.array([x[n] - (0.97 * x[n - 1] if n else 0.0) for n in range(len(x))])
    w = 200
    assert cfg.win == w and cfg.hop == 80 and cfg.n_fft == 256
    frame = y[k * 80:k * 80 + w] * (0.54 - 0.46 * np.cos(2 * np.pi * np.arange(w) / (w - 1)))
    m = np.arange(129)[:, None]
    dft = (frame[None, :] * np.exp(-2j * np.pi * m * np.arange(w)[None, :] / 256)).sum(axis=1)
    power = np.abs(dft) ** 2
    ours = feat.power_spectrum(feat.frame_signal(x, cfg), cfg)
    np.testing.assert_allclose(ours[k], power, rtol=1e-9, atol=1e-9)
    # log-mel of that frame with triangles built from the reference edges
    e = _edges_reference(40, 4000.0)
    f = np.arange(129) * 8000 / 256
    tri = np.array([[max(0.0, min((fi - e[j]) / (e[j + 1] - e[j]),
                                  (e[j + 2] - fi) / (e[j + 2] - e[j + 1])))
                     for fi in f] for j in range(40)])
    np.testing.assert_allclose(feat.log_mel(x, cfg)[k], np.log(tri @ power), rtol=1e-6)


def test_mel_filters_are_unit_triangles_with_the_right_areas():
    # a long window gives a fine frequency grid, so areas are accurate
    cfg = feat.FeatureConfig(rate=16000, win_ms=256.0, n_mels=24)
    fb = feat.mel_filterbank(cfg)
    e = _edges_reference(24, 8000.0)
    df = cfg.rate / cfg.n_fft
    f = np.arange(fb.shape[1]) * df
    for j in range(24):
        lo, mid, hi = e[j], e[j + 1], e[j + 2]
        row = fb[j]
        assert (row[(f <= lo) | (f >= hi)] < 1e-9).all()
        assert row.max() <= 1 + 1e-12 and row.max() > 1 - df / (mid - lo)
        assert abs(f[row.argmax()] - mid) <= df
        # area of a triangle of height 1 on base (hi - lo)
        assert abs(row.sum() * df - (hi - lo) / 2) < df
    # centres are equally spaced in mel
    centres = _mel(e[1:-1])
    np.testing.assert_allclose(np.diff(centres), np.diff(centres)[0], rtol=1e-9)


def test_mfcc_is_the_dct_of_log_mel_with_regression_deltas():
    cfg = feat.FeatureConfig(kind="mfcc")
    x = _signal(1)
    lm = feat.log_mel(x, cfg)
    out = feat.compute(x, cfg)
    assert out.shape == (len(lm), 39) and cfg.size == 39
    n = 40
    basis = np.array([[np.sqrt((1 if k == 0 else 2) / n) * np.cos(np.pi * k * (2 * i + 1) / (2 * n))
                       for i in range(n)] for k in range(13)])
    c = lm @ basis.T
    np.testing.assert_allclose(out[:, :13], c, rtol=1e-4, atol=1e-4)
    t = 10
    d_ref = sum(k * (c[t + k] - c[t - k]) for k in (1, 2)) / 10
    np.testing.assert_allclose(out[t, 13:26], d_ref, rtol=1e-4, atol=1e-4)
    ramp = np.arange(20.0)[:, None] * np.array([[1.0, -2.0]])
    np.testing.assert_allclose(feat.deltas(ramp)[2:-2], [[1.0, -2.0]] * 16)


def test_frame_count_and_short_signals():
    cfg = feat.FeatureConfig()
    for s in (1, 199, 200, 201, 280, 281, 8000):
        assert len(feat.compute(np.ones(s) * 0.1, cfg)) == feat.num_frames(s, cfg)
    assert feat.num_frames(200, cfg) == 1 and feat.num_frames(281, cfg) == 3


def _write(path, x, rate=8000, dtype="int16", stereo=False):
    if dtype == "int16":
        data = np.round(x * 32767).astype(np.int16)
    else:
        data = x.astype(np.float32)
    if stereo:
        data = np.stack([data, data], axis=1)
    wavfile.write(path, rate, data)


def test_wav_formats_rates_and_channels_agree(tmp_path):
    x = _signal(2)
    _write(tmp_path / "a.wav", x)
    _write(tmp_path / "b.wav", x, dtype="float32", stereo=True)
    from scipy.signal import resample_poly
    _write(tmp_path / "c.wav", resample_poly(x, 2, 1), rate=16000)
    src = AudioSource(feat.FeatureConfig())
    a, b, c = (src.features(str(tmp_path / n)) for n in ("a.wav", "b.wav", "c.wav"))
    np.testing.assert_allclose(a, b, atol=2e-3)
    assert c.shape == a.shape
    # resampling 8k → 16k → 8k keeps the spectrum away from the band edges
    np.testing.assert_allclose(a[2:-2, 2:35], c[2:-2, 2:35], atol=0.1)  # log energies
    assert read_wav(str(tmp_path / "b.wav"))[1].ndim == 1


def _lists(tmp_path, n_train=4, n_val=2):
    """Small WAV lists; the val list repeats the first training file."""
    wavs = []
    for i in range(n_train + n_val):
        p = tmp_path / f"utt{i}.wav"
        _write(p, _signal(10 + i, seconds=0.3 + 0.1 * i) * (0.5 + 0.2 * i))
        wavs.append(p)
    words = ["yes no", "no", "yes yes no", "no no", "yes", "no yes"]
    tr = tmp_path / "train.tsv"
    tr.write_text("".join(f"{w.name}\t{words[i]}\n" for i, w in enumerate(wavs[:n_train])))
    va = tmp_path / "val.tsv"
    va.write_text(f"{wavs[0].name}\t{words[0]}\n" + "".join(
        f"{w.name}\t{words[n_train + i]}\n" for i, w in enumerate(wavs[n_train:])))
    return wavs, tr, va


def test_statistics_from_train_are_applied_identically_to_every_split(tmp_path):
    wavs, tr, va = _lists(tmp_path)
    r = run_cli("data_tools", "audio", "--list", tr, "--out", tmp_path / "train.nc")
    assert r.returncode == 0, r.stderr
    r = run_cli("data_tools", "audio", "--list", va, "--out", tmp_path / "val.nc",
                "--stats", tmp_path / "train.nc.stats.json")
    assert r.returncode == 0, r.stderr
    cfg = feat.FeatureConfig()
    raw = [feat.compute(read_wav(str(w))[1], cfg).astype(np.float64) for w in wavs]
    allf = np.concatenate(raw[:4])
    mean, std = allf.mean(axis=0), allf.std(axis=0)  # independent: numpy over all frames
    h, seqs = read_file(tmp_path / "train.nc")
    hv, vseqs = read_file(tmp_path / "val.nc")
    assert h.labels == hv.labels == ["no", "yes"]
    assert hv.tags == ["utt0.wav", "utt4.wav", "utt5.wav"]
    for got, x in zip(seqs, raw[:4]):
        np.testing.assert_allclose(got, (x - mean) / std, atol=1e-4)
    for got, x in zip(vseqs, [raw[0]] + raw[4:]):
        np.testing.assert_allclose(got, (x - mean) / std, atol=1e-4)
    np.testing.assert_array_equal(vseqs[0], seqs[0])  # same file → same rows in both splits
    z = np.concatenate(seqs)
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(z.std(axis=0), 1, atol=1e-3)
    # the val split did not get statistics of its own
    assert not (tmp_path / "val.nc.stats.json").exists()


def test_converted_arrays_read_back_through_the_trainer_reader(tmp_path):
    rng = np.random.default_rng(3)
    arrays = [rng.normal(loc=2.0, scale=3.0, size=(int(rng.integers(5, 40)), 6)) for _ in range(9)]
    lines = []
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"x{i}.npy", a.astype(np.float32))
        lines.append(f"x{i}.npy\t{' '.join(rng.choice(['a', 'b', 'c'], size=i % 4 + 1))}\n")
    (tmp_path / "list.tsv").write_text("".join(lines))
    convert(tmp_path / "list.tsv", tmp_path / "out.nc", ArraySource(), progress=False)
    allf = np.concatenate(arrays).astype(np.float32).astype(np.float64)
    mean, std = allf.mean(axis=0), allf.std(axis=0)
    ds = Dataset.open(str(tmp_path / "out.nc"), 100)  # small chunks: several of them
    assert len(ds.chunks) > 1 and ds.labels == ["a", "b", "c"] and ds.input_size == 6
    got = {}
    with ChunkReader(ds.load_chunk, list(range(len(ds.chunks)))) as reader:
        for _ in ds.chunks:
            got.update(reader.next()[1])
    assert sorted(got) == list(range(9))
    for i, a in enumerate(arrays):
        np.testing.assert_allclose(got[i], (a.astype(np.float32) - mean) / std, atol=1e-5)
        want = lines[i].split("\t")[1].split()
        assert [ds.labels[k] for k in ds.targets[i]] == want
        assert ds.tags[i] == f"x{i}.npy"


def _fake_fsdd(root: Path, speakers=("anna", "bob"), takes=range(12), test_garbage=False,
               train_garbage=False):
    """Tiny FSDD-named recordings; the split that must not be read is not even a WAV."""
    root.mkdir()
    rng = np.random.default_rng(0)
    for spk in speakers:
        for d in range(10):
            for t in takes:
                p = root / f"{d}_{spk}_{t}.wav"
                if (t <= 4 and test_garbage) or (t >= 5 and train_garbage):
                    p.write_bytes(b"not a wav file")
                else:
                    _write(p, 0.1 * rng.normal(size=400))
    return root


def _takes(sources: Path) -> list[tuple[str, list[tuple[str, int]]]]:
    out = []
    for line in sources.read_text().splitlines():
        name, recs = line.split("\t")
        parsed = [re.match(r"(\d)_(\w+?)_(\d+)\.wav", r).groups() for r in recs.split()]
        out.append((name, [(spk, int(t)) for _, spk, t in parsed]))
    return out


def test_fsdd_strings_never_use_a_test_take_for_training(tmp_path):
    rec = _fake_fsdd(tmp_path / "rec", test_garbage=True)
    r = run_cli("data_tools", "fsdd-strings", "--recordings", rec, "--split", "train",
                "--count", 60, "--digits", "2-4", "--seed", 5, "--out", tmp_path / "train")
    assert r.returncode == 0, r.stderr  # a test take would have failed to read
    for _, picks in _takes(tmp_path / "train" / "sources.tsv"):
        assert all(t >= 5 for _, t in picks) and len({s for s, _ in picks}) == 1
        assert 2 <= len(picks) <= 4
    # and the reverse: test strings never read a training take
    rec2 = _fake_fsdd(tmp_path / "rec2", test_garbage=False, train_garbage=True)
    r = run_cli("data_tools", "fsdd-strings", "--recordings", rec2, "--split", "test",
                "--count", 30, "--seed", 6, "--out", tmp_path / "test")
    assert r.returncode == 0, r.stderr
    assert all(t <= 4 for _, picks in _takes(tmp_path / "test" / "sources.tsv") for _, t in picks)
    # transcripts in list.tsv are the digits of the recordings used
    lst = (tmp_path / "test" / "list.tsv").read_text().splitlines()
    src = (tmp_path / "test" / "sources.tsv").read_text().splitlines()
    for a, b in zip(lst, src):
        assert a.split("\t")[1].split() == [s[0] for s in b.split("\t")[1].split()]
    # a --takes range outside the split is refused
    r = run_cli("data_tools", "fsdd-strings", "--recordings", rec, "--split", "train",
                "--takes", "3-9", "--count", 1, "--out", tmp_path / "x")
    assert r.returncode == 2 and "outside" in r.stderr and "Traceback" not in r.stderr


def test_bad_or_missing_files_give_one_line_errors(tmp_path):
    wavs, tr, _ = _lists(tmp_path)
    (tmp_path / "bad.wav").write_bytes(b"RIFF nonsense")
    cases = {
        "missing.tsv": ("utt0.wav\tyes\nnope.wav\tno\n", r"line 2: .*nope\.wav: file not found"),
        "bad.tsv": ("utt0.wav\tyes\nbad.wav\tno\n", r"line 2: .*bad\.wav: cannot read as WAV"),
        "token.tsv": ("utt0.wav\tyes\n", None),
    }
    for name, (text, pattern) in cases.items():
        (tmp_path / name).write_text(text)
        if pattern is None:
            continue
        r = run_cli("data_tools", "audio", "--list", tmp_path / name, "--out", tmp_path / "o.nc")
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and re.search(pattern, r.stderr), r.stderr
    r = run_cli("data_tools", "audio", "--list", tmp_path / "token.tsv", "--out", tmp_path / "o.nc",
                "--labels", "no,maybe")
    assert r.returncode == 2 and "'yes' is not in the alphabet" in r.stderr
    assert not (tmp_path / "o.nc").exists()
