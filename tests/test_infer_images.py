"""Models trained on images, used: image files in ``rnntrain transcribe`` and the Python
API against ``rnntrain decode`` on the converted file, exports of the convolutional front
end against the training network, the converter unchanged by sharing its image code with
inference, and hostile files given to transcribe and export (one line, exit 2)."""
from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np
import pytest
import torch

import rnntrain
from rnntrain.compute.model import build_model
from rnntrain.config import load_config
from rnntrain.data.dataset import Dataset
from tests.conftest import run_cli
from tests.images2d import glyph_images
from tests.test_bad_input import assert_clean_error
from tests.test_infer import make_checkpoint, reference_log_probs

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

CONV = ["model.frontend=conv", "model.layers=1", "model.hidden=12",
        "model.conv_channels=[4,6]", "model.conv_pool_h=[2,2]", "model.conv_pool_w=[2,3]"]


def write_line_images(folder, n=6, seed=4):
    """Glyph-string lines as dark ink on light paper, PNG / TIFF / JPEG, of unequal widths
    and two heights (16 and 11) → (LIST.tsv path, file names)."""
    imgs, targets = glyph_images(n, seed=seed, height=16, short_height=11)
    names, lines = [], []
    for i, (im, t) in enumerate(zip(imgs, targets)):
        name = f"l{i}." + ("png", "tif", "jpg")[i % 3]
        u8 = (255 - im * 255).round().astype(np.uint8)
        Image.fromarray(u8).save(folder / name, **({"quality": 90} if name.endswith("jpg")
                                                    else {}))
        names.append(name)
        lines.append(f"{name}\t{t}\n")
    (folder / "list.tsv").write_text("".join(lines))
    return folder / "list.tsv", names


def image_run(folder, layout: str, height: int, seed: int = 0, chars: bool = False):
    """Convert the images with the real converter, then write a checkpoint with the
    training writer (``checkpoint.save``) for an untrained conv model with fixed weights."""
    from data_tools.images import ImageSettings, convert_images
    from rnntrain.config import to_dict
    from rnntrain.run.checkpoint import ModelCard, save
    from rnntrain.run.state import TrainState
    folder.mkdir()
    lst, names = write_line_images(folder)
    convert_images(lst, folder / "img.nc", ImageSettings(height, "auto"), layout=layout,
                   chars=chars, progress=False)
    ds = Dataset.open(str(folder / "img.nc"))
    cfg = load_config(None, [f"data.train={folder / 'img.nc'}", *CONV])
    torch.manual_seed(seed)
    net = build_model(cfg.model, ds.frame_size, ds.num_labels, ds.frame_height).eval()
    run = folder / "run"
    (run / "checkpoints").mkdir(parents=True)
    save(run / "checkpoints" / "best.pt", ModelCard.of_data(ds, to_dict(cfg)),
         {"model": net, "optim": torch.optim.SGD(net.parameters(), lr=0.1),
          "state": TrainState(epoch=1, step=1)})
    return run, ds, net, names


@pytest.fixture(scope="module")
def imrun(tmp_path_factory):
    """2-D layout, heights kept (16 and 11: the short images are padded below)."""
    return image_run(tmp_path_factory.mktemp("img") / "d", "2d", 0)


@pytest.fixture(scope="module")
def imrun_columns(tmp_path_factory):
    """--layout columns, every image scaled to 12 pixels high."""
    return image_run(tmp_path_factory.mktemp("imgc") / "d", "columns", 12)


def served_columns(ds):
    got = {}
    for k in range(len(ds.chunks)):
        got.update(ds.load_chunk(k))
    return [got[i] for i in range(ds.num_seqs)]


def tsv(out: str) -> list[tuple[str, str]]:
    rows = [ln.split("\t") for ln in out.splitlines()]
    return [(os.path.basename(r[0]), r[1]) for r in rows]


# ---------------------------------------------------------------- the converter

GOLDEN = {  # sha256 of the converter's files before its image code moved to the front end
    ("2d", 0): "1d6bcd52d796f209fdfa0d8c556d0e1cdaac6f5e5782b995220075da01e0ea4f",
    ("columns", 10): "f5a67b0ffca100dbb8d3ffde845ab24a6ecb430b38e1da74a1fd2033da19ec3d",
    ("2d", 7): "1300cf0007044a8cd373483aca068244c35fa224ac8e7ea53faa907c86b9cc56",
}


def test_converter_files_are_byte_identical_after_the_move(tmp_path):
    """The converter, now calling rnntrain.frontend.images, writes byte for byte the files
    it wrote with its own copy (hashes taken with that copy; Pillow, netCDF4 pinned in
    constraints.txt): light/dark/RGBA images, kept heights, scaled, both layouts."""
    from data_tools.images import ImageSettings, convert_images
    from rnntrain.frontend.images import prepare
    rng = np.random.default_rng(20)
    a = rng.integers(140, 256, (13, 40), dtype=np.uint8)
    a[4:9, 5:30:3] = 10
    Image.fromarray(a).save(tmp_path / "a.png")
    Image.fromarray(rng.integers(0, 90, (9, 17), dtype=np.uint8)).save(tmp_path / "b.tif")
    Image.fromarray(rng.integers(0, 256, (11, 23, 4), dtype=np.uint8), "RGBA").save(
        tmp_path / "c.png")
    (tmp_path / "l.tsv").write_text("a.png\tab c\nb.tif\tc\nc.png\ta\n")
    for (layout, h), want in GOLDEN.items():
        out = tmp_path / f"{layout}{h}.nc"
        convert_images(tmp_path / "l.tsv", out, ImageSettings(h, "auto"), chars=True,
                       layout=layout, progress=False)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == want, (layout, h)
        # and inference's preparation gives the pixels the file holds
        cols = served_columns(Dataset.open(str(out)))
        for i, name in enumerate(("a.png", "b.tif", "c.png")):
            px = prepare(tmp_path / name, ImageSettings(h, "auto"))
            np.testing.assert_array_equal(cols[i][:, :px.shape[0]], px.T)


# ---------------------------------------------------------------- transcribe = decode

def test_transcribe_images_gives_what_decode_gives_on_the_converted_file(imrun):
    """Best path and beam search: the PNG/TIFF/JPEG files (a list, or named one by one)
    give the hypotheses decode gives on the .nc file rnntrain-data images made of them."""
    run, ds, net, names = imrun
    folder = run.parent
    got = {}
    for opts in ([], ["--beam", "4"]):
        dec = run_cli("rnntrain", "decode", run, folder / "img.nc", *opts)
        assert dec.returncode == 0, dec.stderr[-2000:]
        got[len(opts)] = want = tsv(dec.stdout)
        assert [n for n, _ in want] == names
        assert sum(1 for _, h in want if h) >= 3, "an all-blank model proves nothing"
    # the images, then the converted file itself (its sequences named by their tags)
    tr = run_cli("rnntrain", "transcribe", run, folder / "list.tsv", folder / "img.nc", "--json")
    assert tr.returncode == 0, tr.stderr[-2000:]
    lines = [json.loads(ln) for ln in tr.stdout.splitlines()]
    assert [(os.path.basename(d["input"]), d["text"]) for d in lines] == got[0] + got[0]
    assert [d["frames"] for d in lines] == [math.ceil(w / 6) for w in ds.lengths] * 2
    tr = run_cli("rnntrain", "transcribe", run, *[folder / n for n in names], "--beam", "4")
    assert tr.returncode == 0, tr.stderr[-2000:]
    assert tsv(tr.stdout) == got[2]


def test_character_models_transcribe_to_text(tmp_path):
    """A model trained on images converted with --chars spells its hypothesis as text (the
    <space> label as a space); its label names stay available; the CLI prints the same."""
    import rnntrain
    run, ds, _, names = image_run(tmp_path / "c", "2d", 0, chars=True)
    assert ds.labels[0] == "<space>" and len(ds.labels) == 5
    m = rnntrain.load(run)
    # log-probs whose best path is  a _ <space> b b  → labels a, <space>, b
    path = [ds.labels.index("a"), m.blank, 0, ds.labels.index("b"), ds.labels.index("b")]
    lp = np.full((len(path), m.blank + 1), -10.0, np.float32)
    lp[np.arange(len(path)), path] = 0.0
    t = m.decode(lp)
    assert t.labels == ["a", "<space>", "b"] and t.text == "a b"
    tr = run_cli("rnntrain", "transcribe", run, *[run.parent / n for n in names], "--json")
    assert tr.returncode == 0, tr.stderr[-2000:]
    lines = [json.loads(ln) for ln in tr.stdout.splitlines()]
    assert len(lines) == len(names) and any(d["labels"] for d in lines)
    for d in lines:  # each line's text spells its own labels
        assert d["text"] == "".join(" " if x == "<space>" else x for x in d["labels"])


# slow (left out of the default run): by default,
# test_transcribe_images_gives_what_decode_gives_on_the_converted_file and test_lm_decode.py
@pytest.mark.slow
def test_transcribe_images_with_an_lm_gives_what_decode_gives(imrun, tmp_path):
    from data_tools.ngram import build, write_arpa
    run, ds, _, names = imrun
    folder = run.parent
    sents = [[ds.labels[k] for k in t] for t in ds.targets]
    write_arpa(build(sents, 2, "wb"), tmp_path / "lm.arpa")
    opts = ["--lm", tmp_path / "lm.arpa", "--lm-weight", "1.5", "--beam", "6"]
    dec = run_cli("rnntrain", "decode", run, folder / "img.nc", *opts)
    tr = run_cli("rnntrain", "transcribe", run, folder / "list.tsv", *opts)
    assert dec.returncode == 0 and tr.returncode == 0, dec.stderr[-1500:] + tr.stderr[-1500:]
    assert tsv(tr.stdout) == tsv(dec.stdout)


@pytest.mark.parametrize("layout", ["2d", "columns"])
def test_python_api_prepares_images_as_the_converter_did(request, layout):
    run, ds, net, names = request.getfixturevalue("imrun" if layout == "2d" else
                                                  "imrun_columns")
    folder = run.parent
    m = rnntrain.load(run)
    assert m.image is not None and m.input_size == ds.frame_size
    cols = served_columns(ds)
    for i, name in enumerate(names):
        f = m.frames(folder / name)
        np.testing.assert_array_equal(f, cols[i])           # the frames decode serves
        with Image.open(folder / name) as im:               # a Pillow image: the same
            np.testing.assert_array_equal(m.frames(im), cols[i])
        np.testing.assert_array_equal(m.log_probs(f), reference_log_probs(net, [cols[i]])[0])
        assert m.transcribe(folder / name).labels == m.decode(m.log_probs(cols[i])).labels


# ---------------------------------------------------------------- exports

@pytest.mark.parametrize("layout", ["2d", "columns"])
def test_conv_exports_match_the_network_on_any_width(request, tmp_path, layout):
    pytest.importorskip("onnxruntime")
    run, ds, net, names = request.getfixturevalue("imrun" if layout == "2d" else
                                                  "imrun_columns")
    folder = run.parent
    m = rnntrain.load(run)
    rng = np.random.default_rng(2)
    # widths around the pooling (2 × 3 = 6): multiples, one more, one less, a single column
    widths = (37, 36, 13, 6, 5, 1)
    batch = [rng.random((w, ds.frame_size)).astype(np.float32) for w in widths]
    want = reference_log_probs(net, batch)
    for fmt in ("torchscript", "onnx"):
        # checked on the training file's images by default (its data.train)
        e = rnntrain.load(m.export(tmp_path / f"m.{fmt}", fmt))
        assert e.engine.name == fmt and e.image == m.image and e.subsample == 6
        got = e.log_probs_batch(batch)
        for w, a, b in zip(widths, want, got):
            assert len(b) == math.ceil(w / 6) == len(a)    # ceil per pooling block
            assert np.abs(a - b).max() <= 1e-4
        for name in names:
            assert e.transcribe(folder / name).labels == m.transcribe(folder / name).labels


def test_transcribe_with_an_exported_conv_model_through_the_cli(imrun, tmp_path):
    pytest.importorskip("onnxruntime")
    run, ds, net, names = imrun
    folder = run.parent
    r = run_cli("rnntrain", "export", run, "--format", "onnx", "--out", tmp_path / "m.onnx")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "img.nc (6 sequences)" in r.stdout and "images" in r.stdout
    tr = run_cli("rnntrain", "transcribe", tmp_path / "m.onnx", folder / "list.tsv")
    assert tr.returncode == 0, tr.stderr[-2000:]
    m = rnntrain.load(run)
    assert tsv(tr.stdout) == [(n, m.transcribe(folder / n).text) for n in names]


def test_one_dimensional_conv_model_exports(tmp_path, synth_pair):
    """The conv front end on speech-like features (height 1: time convolutions)."""
    pytest.importorskip("onnxruntime")
    from rnntrain.config import to_dict
    from rnntrain.data.ncdata import read_file
    from rnntrain.run.checkpoint import FORMAT_VERSION, save_atomic
    h, seqs = read_file(synth_pair[1])
    cfg = load_config(None, ["data.train=x.nc", *CONV, "model.conv_norm=none"])
    torch.manual_seed(3)
    net = build_model(cfg.model, h.input_size, len(h.labels)).eval()
    save_atomic({"format": FORMAT_VERSION, "model": net.state_dict(), "config": to_dict(cfg),
                 "labels": list(h.labels), "input_size": h.input_size}, tmp_path / "c.pt")
    m = rnntrain.load(tmp_path / "c.pt")
    batch = seqs[:6]
    want = reference_log_probs(net, batch)
    for fmt in ("torchscript", "onnx"):
        e = rnntrain.load(m.export(tmp_path / f"c.{fmt}", fmt, check_frames=seqs[6:9]))
        for a, b in zip(want, e.log_probs_batch(batch)):
            assert a.shape == b.shape and np.abs(a - b).max() <= 1e-4


# ---------------------------------------------------------------- wrong kinds, hostile files

@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """An audio model, an image model, and files that are not what they claim."""
    from scipy.io import wavfile
    from rnntrain.frontend import FrontEnd
    from rnntrain.frontend.features import FeatureConfig
    d = tmp_path_factory.mktemp("hostile")
    fc = FeatureConfig()
    make_checkpoint(d / "audio.pt", fc.size, ["a", "b", "c"], frontend=FrontEnd(
        "audio", fc.size, np.zeros(fc.size), np.ones(fc.size), fc).to_dict())
    image = image_run(d / "im", "2d", 12)[0]
    rng = np.random.default_rng(0)
    wavfile.write(d / "ok.wav", 8000, (rng.standard_normal(4000) * 3000).astype(np.int16))
    wav = (d / "ok.wav").read_bytes()
    (d / "trunc.wav").write_bytes(wav[:len(wav) // 2])          # data cut mid-recording
    Image.fromarray(rng.integers(0, 255, (20, 50), dtype=np.uint8)).save(d / "ok.png")
    png = bytearray((d / "ok.png").read_bytes())
    (d / "trunc.png").write_bytes(bytes(png[:len(png) // 2]))
    png[60:80] = bytes(20)                                      # zeros inside the pixel data
    (d / "corrupt.png").write_bytes(bytes(png))
    for name in ("empty.wav", "empty.png", "empty.tsv"):
        (d / name).write_bytes(b"")
    (d / "latin1.tsv").write_bytes("ok.wav\tcaf\u00e9\nok.wav\n".encode("latin-1"))
    (d / "missing.tsv").write_text("ok.wav\n# a comment\nnothere.wav\n")
    (d / "names_fifo.tsv").write_text("ok.wav\nfifo.wav\n")
    os.mkfifo(d / "fifo.wav")
    os.mkfifo(d / "fifo.tsv")
    (d / "nothing").mkdir()
    (d / "folder.wav").mkdir()
    from tests.test_ocr_data import bomb_png
    bomb_png(d / "bomb.png", 60000, 60000)       # Pillow's DecompressionBombError
    bomb_png(d / "big.png", 10000, 10000)        # over its warning limit
    pages = [Image.fromarray(rng.integers(0, 255, (20, 50), dtype=np.uint8)) for _ in "ab"]
    pages[0].save(d / "multi.tif", save_all=True, append_images=pages[1:])
    return d, image


TRANSCRIBE_CASES = {
    # name: (model, input, fragments of the one line)
    "fifo": ("audio.pt", "fifo.wav", ["fifo.wav: not a regular file"]),
    "fifo-list": ("audio.pt", "fifo.tsv", ["fifo.tsv: not a regular file"]),
    "list-naming-fifo": ("audio.pt", "names_fifo.tsv", ["line 2", "fifo.wav: not a regular"]),
    "folder": ("audio.pt", "nothing", ["nothing: a folder without audio, image or .npy"]),
    "folder-named-wav": ("audio.pt", "folder.wav", ["folder.wav: a folder without"]),
    "truncated-wav": ("audio.pt", "trunc.wav", ["trunc.wav: truncated WAV file", "declares"]),
    "empty-wav": ("audio.pt", "empty.wav", ["empty.wav: cannot read as WAV"]),
    "empty-list": ("audio.pt", "empty.tsv", ["empty.tsv: no files listed"]),
    "non-utf8-list": ("audio.pt", "latin1.tsv", ["latin1.tsv line 1: not UTF-8"]),
    "list-naming-missing": ("audio.pt", "missing.tsv", ["missing.tsv line 3", "nothere.wav: "
                                                        "file not found"]),
    "corrupt-png": ("im/run", "corrupt.png", ["corrupt.png: cannot decode the image"]),
    "truncated-png": ("im/run", "trunc.png", ["trunc.png: cannot decode the image"]),
    "empty-png": ("im/run", "empty.png", ["empty.png: cannot read as an image"]),
    "bomb-png": ("im/run", "bomb.png", ["bomb.png: refused, a decompression bomb"]),
    "huge-png": ("im/run", "big.png", ["big.png: refused, 10000 x 10000"]),
    "multi-page-tiff": ("im/run", "multi.tif", ["multi.tif: a multi-page image (2 pages"]),
    "image-to-audio-model": ("audio.pt", "ok.png", ["ok.png: an image, but this model was "
                                                    "trained on audio"]),
    "audio-to-image-model": ("im/run", "ok.wav", ["ok.wav: this model was trained on images",
                                                  "not audio"]),
}


@pytest.mark.parametrize("case", list(TRANSCRIBE_CASES))
def test_hostile_inputs_to_transcribe_are_one_line(hostile, case):
    d, _ = hostile
    model, name, fragments = TRANSCRIBE_CASES[case]
    r = run_cli("rnntrain", "transcribe", d / model, d / name, timeout=120)
    assert_clean_error(r, *fragments)
    assert r.stdout == ""


# slow (left out of the default run): by default, test_hostile_inputs_to_transcribe_are_one_line
@pytest.mark.slow
def test_transcribe_still_reads_the_good_files_of_the_hostile_set(hostile):
    d, _ = hostile
    for model, name in (("audio.pt", "ok.wav"), ("im/run", "ok.png")):
        r = run_cli("rnntrain", "transcribe", d / model, d / name, "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["input"] == str(d / name)


@pytest.mark.parametrize("case", ["folder", "unwritable", "no-folder"])
def test_export_to_a_bad_place_is_one_line(hostile, tmp_path, case):
    d, image = hostile
    if case == "folder":
        out, want = tmp_path, "is a folder; give a file name"
    elif case == "no-folder":
        out, want = tmp_path / "nope" / "m.onnx", "its folder does not exist"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        if writable(ro):   # root ignores the mode; sysfs refuses new files even to root
            ro = "/sys"
            if writable(ro):
                pytest.skip("no folder here refuses writes")
        out, want = os.path.join(ro, "m.onnx"), "cannot write in"
    r = run_cli("rnntrain", "export", image, "--format", "onnx", "--out", out, timeout=120)
    assert_clean_error(r, str(out), want)
    assert not list(tmp_path.glob(".*tmp*"))


def writable(folder) -> bool:
    p = os.path.join(folder, f".probe{os.getpid()}")
    try:
        open(p, "wb").close()
    except OSError:
        return False
    os.unlink(p)
    return True
