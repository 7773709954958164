"""Using a trained model without the shared recordings: exports against the training
network on real inputs, decoding files without targets, the front end carried from the
converter into checkpoints, CTC peak times against brute force, the Python API, and
one-line errors. (tests/test_infer_e2e.py does the same on real speech.)"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys

import netCDF4
import numpy as np
import pytest
import torch

import rnntrain
from rnntrain.compute.model import build_model
from rnntrain.config import Config, to_dict
from rnntrain.data.ncdata import NcWriter, read_attrs, read_file
from rnntrain.decode.search import best_path
from rnntrain.decode.align import align, path_positions
from rnntrain.run.checkpoint import FORMAT_VERSION, save_atomic
from tests.conftest import ROOT, run_cli


def make_checkpoint(path, input_size, labels, cell="lstm", bidirectional=True, subsample=1,
                    frontend=None, seed=0):
    """A checkpoint as training writes it, with torch's default random weights (their
    outputs are far from all-blank, so hypotheses are not empty)."""
    cfg = Config()
    cfg.data.train = "x.nc"
    cfg.model.layers, cfg.model.hidden = 2, 12
    cfg.model.cell, cfg.model.bidirectional, cfg.model.subsample = cell, bidirectional, subsample
    torch.manual_seed(seed)
    net = build_model(cfg.model, input_size, len(labels))
    save_atomic({"format": FORMAT_VERSION, "model": net.state_dict(), "config": to_dict(cfg),
                 "labels": list(labels), "input_size": input_size, "frontend": frontend},
                path)
    return net.eval()


def reference_log_probs(net, seqs):
    """The training network on one zero-padded batch → [(T'_i, C)]."""
    lengths = torch.tensor([len(s) for s in seqs])
    x = torch.zeros(int(lengths.max()), len(seqs), seqs[0].shape[1])
    for i, s in enumerate(seqs):
        x[:len(s), i] = torch.from_numpy(s)
    with torch.no_grad():
        lp, out = net(x, lengths)
    return [lp[:int(out[i]), i].numpy() for i in range(len(seqs))]


@pytest.mark.parametrize("bidirectional,subsample", [(True, 3), (False, 1)])
def test_exports_match_the_training_network_on_real_inputs(tmp_path, synth_pair,
                                                           bidirectional, subsample):
    h, seqs = read_file(synth_pair[1])
    net = make_checkpoint(tmp_path / "m.pt", h.input_size, h.labels,
                          bidirectional=bidirectional, subsample=subsample)
    m = rnntrain.load(tmp_path / "m.pt")
    batch = seqs[:7]                                   # unequal lengths, padded together
    assert len({len(s) for s in batch}) > 3
    want = reference_log_probs(net, batch)
    for fmt, name in (("torchscript", "m.ts"), ("onnx", "m.onnx")):
        e = rnntrain.load(m.export(tmp_path / name, fmt, check_frames=seqs[7:10]))
        assert e.engine.name == fmt and e.labels == h.labels and e.subsample == subsample
        got = e.log_probs_batch(batch)
        for a, b in zip(want, got):
            assert a.shape == b.shape and np.abs(a - b).max() <= 1e-4
        # another batch size and length than the export's example: one sequence alone
        one = e.log_probs(seqs[12])
        assert np.abs(one - reference_log_probs(net, [seqs[12]])[0]).max() <= 1e-4
        for s in batch:
            assert e.transcribe(s).labels == m.transcribe(s).labels
            assert m.transcribe(s).labels == [h.labels[k] for k in best_path(
                reference_log_probs(net, [s])[0], 10**9, len(h.labels))]


def test_peephole_exports_to_torchscript_and_onnx_refuses_naming_the_cell(tmp_path, synth_pair):
    h, seqs = read_file(synth_pair[1])
    net = make_checkpoint(tmp_path / "p.pt", h.input_size, h.labels, cell="peephole",
                          subsample=2)
    e = rnntrain.load(rnntrain.load(tmp_path / "p.pt").export(tmp_path / "p.ts", "torchscript"))
    for a, b in zip(reference_log_probs(net, seqs[:5]), e.log_probs_batch(seqs[:5])):
        assert np.abs(a - b).max() <= 1e-4
    r = run_cli("rnntrain", "export", tmp_path / "p.pt", "--format", "onnx",
                "--out", tmp_path / "p.onnx")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "cell 'peephole'" in r.stderr
    assert not (tmp_path / "p.onnx").exists()


def _without_targets(src, dst):
    """Inputs and lengths only (no labels, no targetStrings), written with netCDF4 itself."""
    h, seqs = read_file(src)
    with netCDF4.Dataset(dst, "w", format="NETCDF4") as ds:
        ds.createDimension("numSeqs", len(seqs))
        ds.createDimension("numTimesteps", int(h.lengths.sum()))
        ds.createDimension("inputPattSize", h.input_size)
        ds.createVariable("seqLengths", "i4", ("numSeqs",))[:] = h.lengths
        ds.createVariable("inputs", "f4", ("numTimesteps", "inputPattSize"))[:] = \
            np.concatenate(seqs)
    return h, seqs


def test_decode_and_transcribe_need_no_targets_and_skip_nothing(tmp_path, synth_pair, capsys):
    h, seqs = _without_targets(synth_pair[1], tmp_path / "bare.nc")
    # placeholder targets far longer than any sequence: decode must not skip them
    longest = int(h.lengths.max())
    with NcWriter(tmp_path / "dummy.nc", h.labels, h.input_size, h.lengths,
                  [" ".join([h.labels[0]] * (longest + 1))] * len(seqs), h.tags) as w:
        w.append(np.concatenate(seqs))
    net = make_checkpoint(tmp_path / "m.pt", h.input_size, h.labels)
    want = [" ".join(h.labels[k] for k in best_path(lp, len(lp), len(h.labels)))
            for lp in reference_log_probs(net, seqs)]
    assert sum(1 for w in want if w) > len(want) // 2
    from rnntrain.cli import main
    for name in ("bare.nc", "dummy.nc"):
        assert main(["decode", str(tmp_path / "m.pt"), str(tmp_path / name)]) == 0
        assert [ln.split("\t")[1] for ln in capsys.readouterr().out.splitlines()] == want
    m = rnntrain.load(tmp_path / "m.pt")
    from rnntrain.infer.transcribe import transcribe
    import io
    buf = io.StringIO()
    assert transcribe(m, [str(tmp_path / "bare.nc")], threads=2, out=buf, progress=False) == \
        len(seqs)
    lines = buf.getvalue().splitlines()
    assert [ln.split("\t")[1] for ln in lines] == want
    assert [ln.split("\t")[0] for ln in lines] == [f"#{i}" for i in range(len(seqs))]
    # no front end: peak positions are model frames, within each sequence
    for ln, s in zip(lines, seqs):
        peaks = [int(p) for p in ln.split("\t")[2].split()]
        assert len(peaks) == len(ln.split("\t")[1].split()) and all(0 <= p < len(s) for p in peaks)
    # a folder of .npy arrays, as JSON lines in file order (no front end: used as they are)
    (tmp_path / "feats").mkdir()
    for i in (0, 1, 2):
        np.save(tmp_path / "feats" / f"u{i}.npy", seqs[i])
    buf = io.StringIO()
    transcribe(m, [str(tmp_path / "feats")], as_json=True, out=buf, progress=False)
    recs = [json.loads(ln) for ln in buf.getvalue().splitlines()]
    assert [r["input"].endswith(f"u{i}.npy") for i, r in enumerate(recs)] == [True] * 3
    assert [r["text"] for r in recs] == want[:3]
    assert all(len(r["peak_frames"]) == len(r["labels"]) and "times" not in r for r in recs)
    # eval still needs targets: one line naming the variable
    assert main(["eval", str(tmp_path / "m.pt"), str(tmp_path / "bare.nc")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "variable 'targetStrings': missing variable" in err[0]


def _arrays(tmp_path, n=8, f=5, seed=3):
    rng = np.random.default_rng(seed)
    arrays = [(rng.normal(2.0, 3.0, size=(int(rng.integers(20, 60)), f))).astype(np.float64)
              for _ in range(n)]
    lines = []
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"x{i}.npy", a)
        lines.append(f"x{i}.npy\t{' '.join(rng.choice(['a', 'b', 'c'], size=i % 3 + 1))}\n")
    (tmp_path / "list.tsv").write_text("".join(lines))
    return arrays


@pytest.mark.parametrize("fmt", ["NETCDF3_CLASSIC", "NETCDF4"])
def test_front_end_travels_from_the_converter_into_the_checkpoint(tmp_path, fmt):
    from data_tools.audio import ArraySource, Stats, convert
    from rnntrain.data.dataset import Dataset
    from rnntrain.frontend import ATTR, FrontEnd
    from rnntrain.config import to_dict
    from rnntrain.run.checkpoint import ModelCard, read, save
    from rnntrain.run.state import TrainState
    arrays = _arrays(tmp_path)
    convert(tmp_path / "list.tsv", tmp_path / "a.nc", ArraySource(), fmt=fmt, progress=False)
    stats = Stats.load(tmp_path / "a.nc.stats.json")
    fe = FrontEnd.from_json(read_attrs(tmp_path / "a.nc")[ATTR])
    assert fe.source == "arrays" and fe.features is None and fe.size == 5
    np.testing.assert_array_equal(fe.mean, stats.mean)   # exact: JSON keeps float64
    np.testing.assert_array_equal(fe.std, stats.std)
    ds = Dataset.open(str(tmp_path / "a.nc"))
    assert FrontEnd.from_dict(ds.frontend) == fe
    # training's checkpoint writer copies it
    cfg = Config()
    cfg.data.train = "a.nc"
    cfg.model.layers, cfg.model.hidden = 1, 4
    net = build_model(cfg.model, 5, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    save(tmp_path / "best.pt", ModelCard.of_data(ds, to_dict(cfg)),
         {"model": net, "optim": opt, "state": TrainState()})
    assert read(tmp_path / "best.pt").card.frontend == ds.frontend
    # a raw .npy given to the model is normalised exactly as the converter wrote it
    m = rnntrain.load(tmp_path / "best.pt")
    _, rows = read_file(tmp_path / "a.nc")
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(m.frames(tmp_path / f"x{i}.npy"), rows[i])
        np.testing.assert_array_equal(m.frames(a), rows[i])
    # a sharded copy keeps it
    from data_tools.shard import shard
    man = shard([str(tmp_path / "a.nc")], 2, str(tmp_path / "sh"), chunk_seqs=2)
    assert Dataset.open(str(man)).frontend == ds.frontend


def _all_alignments(T, hyp, C, blank):
    """Every frame labelling that collapses to hyp (brute force over C**T paths)."""
    for path in itertools.product(range(C), repeat=T):
        out, prev = [], -1
        for p in path:
            if p != prev and p != blank:
                out.append(p)
            prev = p
        if out == hyp:
            yield path


@pytest.mark.parametrize("hyp", [[0, 1], [1, 1], [2], [0, 2, 0]])
def test_peaks_lie_on_the_best_alignment_found_by_brute_force(hyp):
    rng = np.random.default_rng(sum(hyp) + len(hyp))
    T, C, blank = 7, 4, 3
    lp = np.log(rng.dirichlet(np.ones(C), size=T))
    best = max(_all_alignments(T, hyp, C, blank), key=lambda p: sum(lp[t, c] for t, c in
                                                                  enumerate(p)))
    # the frames of label j on that path: the j-th run of non-blank frames
    runs, t = [], 0
    while t < T:
        e = t
        while e + 1 < T and best[e + 1] == best[t]:
            e += 1
        if best[t] != blank:
            runs.append(range(t, e + 1))
        t = e + 1
    want = [max(r, key=lambda f: lp[f, hyp[j]]) for j, r in enumerate(runs)]
    assert align(lp, hyp, blank).peaks == want
    labels = best_path(lp, T, blank)
    peaks = align(lp, labels, blank, positions=path_positions(np.argmax(lp, 1), blank)).peaks
    assert labels == best_path(lp, T, blank) and len(peaks) == len(labels)
    assert all(np.argmax(lp[p]) == k for p, k in zip(peaks, labels))


def test_import_is_light_and_every_public_name_resolves():
    code = ("import sys, rnntrain\n"
            "assert 'torch' not in sys.modules and 'netCDF4' not in sys.modules\n"
            "print([n for n in rnntrain.__all__ if getattr(rnntrain, n, None) is None])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_python_train_returns_the_run_folder_and_load_reads_it(tmp_path, synth_pair):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[data]\ntrain = "{synth_pair[0]}"\n[model]\nlayers = 1\nhidden = 8\n'
                   f'[train]\nepochs = 5\n[compute]\nthreads = 1\n')
    code = ("import rnntrain, sys\n"
            "run = rnntrain.train(sys.argv[1], 'optim.lr=0.01', train={'epochs': 1}, "
            "run__dir=sys.argv[2])\n"
            "m = rnntrain.load(run)\n"
            "print(run); print(' '.join(m.labels))\n")
    r = subprocess.run([sys.executable, "-c", code, str(cfg), str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    run, labels = r.stdout.strip().splitlines()[-2:]
    assert run == str(tmp_path / "run") and labels.split() == read_file(synth_pair[0])[0].labels
    saved = (tmp_path / "run" / "config.toml").read_text()
    assert "epochs = 1" in saved and "lr = 0.01" in saved     # the overrides were applied
    assert len([ln for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                if json.loads(ln)["split"] == "train"]) >= 1


def test_bad_inputs_to_transcribe_are_one_line(tmp_path, synth_pair, capsys):
    from rnntrain.cli import main
    h, _ = read_file(synth_pair[1])
    make_checkpoint(tmp_path / "m.pt", h.input_size, h.labels)
    np.save(tmp_path / "wide.npy", np.zeros((20, h.input_size + 1), np.float32))
    from scipy.io import wavfile
    wavfile.write(tmp_path / "a.wav", 8000, np.zeros(800, np.int16))
    (tmp_path / "list.tsv").write_text("wide.npy\nnothere.npy\n")
    cases = [("wide.npy", rf"wide\.npy: {h.input_size + 1} features per frame, the model "
                          rf"takes {h.input_size}"),
             ("a.wav", r"a\.wav: this model has no front end"),
             ("missing.wav", r"missing\.wav: file not found"),
             ("list.tsv", r"list\.tsv line 2: .*nothere\.npy: file not found")]
    import re
    for name, pattern in cases:
        rc = main(["transcribe", str(tmp_path / "m.pt"), str(tmp_path / name)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and re.search(pattern, err[0]), err
    assert main(["transcribe", str(tmp_path), str(tmp_path / "a.wav")]) == 2
    assert "without checkpoints/best.pt" in capsys.readouterr().err
