"""2-D (image) data, the conv front end, the image converter and the OCR tools."""
from __future__ import annotations

import json
import math

import netCDF4
import numpy as np
import pytest
import torch

from rnntrain.config import load_config
from rnntrain.compute.model import build_model, total_subsample
from rnntrain.data.dataset import min_frames
from rnntrain.compute.tasks import collate
from rnntrain.data import ncdata
from rnntrain.data.dataset import Dataset
from tests.conftest import run_cli
from tests.images2d import LABELS, glyph_images, write_rnnlib_way

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402


def conv_cfg(*extra):
    return load_config(None, ["data.train=x", "model.frontend=conv", "model.layers=1",
                              "model.hidden=12", "model.conv_channels=[4,6,8]",
                              "model.conv_pool_h=[2,2,1]", "model.conv_pool_w=[2,1,2]",
                              *extra])


# ---------------------------------------------------------------- reading 2-D files

@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_rnnlib_built_2d_file_reads_as_columns(tmp_path, fmt):
    """A file built as RNNLIB's arabic_offline.py builds it: column frames = image columns
    top to bottom (the independent computation: numpy's transpose of the original image)."""
    rng = np.random.default_rng(3)
    imgs = [rng.integers(0, 256, (h, w), dtype=np.uint8) for h, w in ((5, 9), (7, 4), (3, 11))]
    path = write_rnnlib_way(tmp_path / "hw.nc", imgs, ["a b", "b", "a a b"], ["a", "b"], fmt)
    ds = Dataset.open(str(path), chunk_frames=40)        # several chunks
    assert ds.is_2d and ds.lengths.tolist() == [9, 4, 11] and ds.heights.tolist() == [5, 7, 3]
    assert ds.frame_height == 7 and ds.frame_size == 7
    got = {}
    for k in range(len(ds.chunks)):
        got.update(ds.load_chunk(k))
    for i, im in enumerate(imgs):
        want = np.zeros((im.shape[1], 7), np.float32)       # (W, padded height)
        want[:, :im.shape[0]] = ((im.astype(np.float64) - 226.8663) / 81.62196).T
        np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-6)
    assert [t.tolist() for t in ds.targets] == [[0, 1], [1], [0, 0, 1]]


def test_write_images_round_trip_and_rnnlib_order(tmp_path):
    imgs, targets = glyph_images(5, seed=1, short_height=5)
    ncdata.write_images(tmp_path / "g.nc", imgs, targets, LABELS, tags=[f"t{i}" for i in range(5)])
    with netCDF4.Dataset(tmp_path / "g.nc") as nc:
        assert nc.dimensions["numDims"].size == 2
        sd = nc["seqDims"][:]
        assert sd.tolist() == [[im.shape[0], im.shape[1]] for im in imgs]
        assert nc["seqLengths"][:].tolist() == [im.size for im in imgs]
        rows = np.asarray(nc["inputs"][:])
    # pixel (y, x) of image 0 is row x * H + y (RNNLIB's order)
    h0 = imgs[0].shape[0]
    y, x = 3, 6
    assert rows[x * h0 + y, 0] == imgs[0][y, x]
    ds = Dataset.open(str(tmp_path / "g.nc"))
    payload = ds.load_chunk(0)
    for i, im in enumerate(imgs):
        back = payload[i].reshape(im.shape[1], ds.frame_height).T[:im.shape[0]]
        np.testing.assert_array_equal(back, im)


def test_shard_2d_keeps_images(tmp_path):
    from data_tools.shard import shard
    imgs, targets = glyph_images(12, seed=2, short_height=6)
    ncdata.write_images(tmp_path / "g.nc", imgs, targets, LABELS, tags=[f"t{i}" for i in range(12)])
    man = shard([str(tmp_path / "g.nc")], 2, str(tmp_path / "sh"), chunk_frames=150)
    ds = Dataset.open(str(man))
    assert ds.is_2d and len(ds.chunks) > 2
    by_tag = {f"t{i}": im for i, im in enumerate(imgs)}
    seen = 0
    for k in range(len(ds.chunks)):
        for s, cols in ds.load_chunk(k).items():
            im = by_tag[ds.tags[s]]
            assert ds.heights[s] == im.shape[0] and ds.lengths[s] == im.shape[1]
            np.testing.assert_array_equal(cols.reshape(im.shape[1], 8).T[:im.shape[0]], im)
            seen += 1
    assert seen == 12
    out = run_cli("data_tools", "inspect", man)
    assert out.returncode == 0, out.stderr
    assert "height histogram" in out.stdout and "width histogram" in out.stdout


def test_columns_layout_equals_2d(tmp_path):
    """--layout columns (1-D frames + imageHeight) serves the same frames as 2-D."""
    imgs, targets = glyph_images(4, seed=3)
    ncdata.write_images(tmp_path / "a.nc", imgs, targets, LABELS)
    with ncdata.NcWriter(tmp_path / "b.nc", LABELS, 8, [im.shape[1] for im in imgs], targets,
                         attrs={"imageHeight": 8}) as w:
        for im in imgs:
            w.append(im.T)
    a, b = Dataset.open(str(tmp_path / "a.nc")), Dataset.open(str(tmp_path / "b.nc"))
    assert (a.frame_size, a.frame_height) == (b.frame_size, b.frame_height) == (8, 8)
    pa, pb = a.load_chunk(0), b.load_chunk(0)
    for i in range(4):
        np.testing.assert_array_equal(pa[i], pb[i])


# ---------------------------------------------------------------- the conv front end

@pytest.mark.parametrize("train_mode", [False, True])
@pytest.mark.parametrize("height", [8, 1])
def test_conv_masking_exact(height, train_mode):
    """Each image's outputs alone equal its outputs inside a zero-padded batch (eval mode,
    and training mode without dropout: the group norm is per image over valid columns)."""
    torch.manual_seed(0)
    cfg = conv_cfg()
    model = build_model(cfg.model, 2 * height, 5, height).train(train_mode)
    rng = np.random.default_rng(1)
    widths = [13, 4, 9, 1, 7]       # not multiples of the pooling (4): partial windows
    frames = [rng.normal(size=(w, 2 * height)).astype(np.float32) for w in widths]
    x, lengths = collate(frames)
    with torch.no_grad():
        lp, out_len = model(x, lengths)
        assert out_len.tolist() == [math.ceil(w / 4) for w in widths]
        for j, f in enumerate(frames):
            xa, la = collate([f])
            a, al = model(xa, la)
            assert al.item() == out_len[j]
            torch.testing.assert_close(a[:, 0], lp[: al.item(), j], rtol=1e-5, atol=1e-5)


def test_conv_ctc_feasibility_after_subsampling(tmp_path):
    """Feasible = ceil(W / total subsample) >= labels + repeats (brute force), and the model
    emits exactly ceil(W / 4) frames, so CTC is finite on every feasible image."""
    cfg = conv_cfg()
    assert total_subsample(cfg.model) == 4
    imgs, targets = glyph_images(20, seed=4, max_labels=6)
    imgs = [im[:, : max(1, im.shape[1] // (1 + i % 4))] for i, im in enumerate(imgs)]  # some too narrow
    ncdata.write_images(tmp_path / "g.nc", imgs, targets, LABELS)
    ds = Dataset.open(str(tmp_path / "g.nc"))
    keep = ds.feasible(total_subsample(cfg.model))
    want = [math.ceil(im.shape[1] / 4) >= min_frames(t) for im, t in zip(imgs, ds.targets)]
    assert keep.tolist() == want and 0 < sum(want) < 20
    model = build_model(cfg.model, ds.frame_size, ds.num_labels, ds.frame_height).eval()
    payload = ds.load_chunk(0)
    ids = [i for i in range(20) if keep[i]]
    from rnntrain.compute.model import ctc_loss_sum
    for i in ids:
        x, le = collate([payload[i]])
        with torch.no_grad():
            lp, ol = model(x, le)
            assert ol.item() == math.ceil(imgs[i].shape[1] / 4)
            assert torch.isfinite(ctc_loss_sum(lp, ol, [ds.targets[i]], model.blank))


def test_conv_bf16_runs_and_config_errors():
    cfg = conv_cfg()
    model = build_model(cfg.model, 8, 5, 8)
    x, le = collate([np.random.default_rng(0).normal(size=(11, 8)).astype(np.float32)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ol = model(x, le)
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all() and ol.item() == 3
    from rnntrain.errors import ConfigError
    for bad, msg in ((["model.conv_pool_w=[2,2]"], "one entry per block"),
                     (["model.conv_kernel=4"], "must be odd"),
                     (["model.conv_channels=[4,0,8]"], ">= 1"),
                     (["model.conv_channels=4"], "list of integers"),
                     (["model.conv_norm=batch"], "choose one of group, none")):
        with pytest.raises(ConfigError, match=msg):
            conv_cfg(*bad)


# ---------------------------------------------------------------- the image converter

def test_images_converter_pixels(tmp_path):
    """Real PNG/JPEG/TIFF files written here → the expected pixels in the .nc file."""
    rng = np.random.default_rng(5)
    dark_on_light = rng.integers(150, 256, (6, 10), dtype=np.uint8)   # median light
    light_on_dark = rng.integers(0, 100, (6, 7), dtype=np.uint8)
    rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    Image.fromarray(dark_on_light).save(tmp_path / "a.png")
    Image.fromarray(light_on_dark).save(tmp_path / "b.tif")
    Image.fromarray(rgb).save(tmp_path / "c.png")
    (tmp_path / "list.tsv").write_text("a.png\tcafe\u0301 x\n# a comment\n\nb.tif\tab\n"
                                       f"{tmp_path / 'c.png'}\t\u00e9\u00e9!\n")
    out = run_cli("data_tools", "images", "--list", tmp_path / "list.tsv", "--out",
                  tmp_path / "o.nc", "--chars", "--height", "0")
    assert out.returncode == 0, out.stderr
    ds = Dataset.open(str(tmp_path / "o.nc"))
    assert ds.is_2d and ds.heights.tolist() == [6, 6, 6] and ds.lengths.tolist() == [10, 7, 5]
    # NFC: "e" + combining acute is one label U+00E9; the space is <space>
    assert sorted(ds.labels) == sorted(["!", "<space>", "U+00E9", "a", "b", "c", "f", "x"])
    names = [[ds.labels[k] for k in t] for t in ds.targets]
    assert names[0] == ["c", "a", "f", "U+00E9", "<space>", "x"]
    assert names[2] == ["U+00E9", "U+00E9", "!"]
    p = ds.load_chunk(0)
    gray_c = np.asarray(Image.fromarray(rgb).convert("L"), np.float32) / 255
    want = [1 - dark_on_light / np.float32(255), light_on_dark / np.float32(255),
            1 - gray_c if np.median(gray_c) > 0.5 else gray_c]
    for i, w in enumerate(want):
        np.testing.assert_allclose(p[i].T, w, atol=1e-6)
    with netCDF4.Dataset(tmp_path / "o.nc") as nc:
        meta = json.loads(nc.getncattr("rnntrain_images"))
    assert meta["invert"] == "auto" and meta["chars"] is True


def test_images_converter_height_and_columns(tmp_path):
    a = np.full((20, 30), 255, np.uint8)
    a[5:15, 10:12] = 0                                     # a dark bar on white
    Image.fromarray(a).save(tmp_path / "a.png")
    Image.fromarray(a[:, :15]).save(tmp_path / "b.jpg", quality=95)
    (tmp_path / "l.tsv").write_text("a.png\tx y\nb.jpg\ty\n")
    out = run_cli("data_tools", "images", "--list", tmp_path / "l.tsv", "--out",
                  tmp_path / "c.nc", "--height", "10", "--trim", "none", "--layout", "columns",
                  "--invert", "yes")
    assert out.returncode == 0, out.stderr
    ds = Dataset.open(str(tmp_path / "c.nc"))
    assert not ds.is_2d and ds.column_height == 10 and ds.lengths.tolist() == [15, 8]
    assert ds.labels == ["x", "y"]
    want = np.asarray(Image.fromarray(1 - a.astype(np.float32) / 255).resize((15, 10),
                                                                           Image.BILINEAR))
    np.testing.assert_allclose(ds.load_chunk(0)[0].T, want, atol=1e-6)
    # a token outside --labels: one line naming the list line
    out = run_cli("data_tools", "images", "--list", tmp_path / "l.tsv", "--out",
                  tmp_path / "d.nc", "--labels", "x")
    assert out.returncode == 2 and "line 1" in out.stderr and "'y'" in out.stderr
    assert "Traceback" not in out.stderr
    (tmp_path / "m.tsv").write_text("missing.png\tx\n")
    out = run_cli("data_tools", "images", "--list", tmp_path / "m.tsv", "--out", tmp_path / "e.nc")
    assert out.returncode == 2 and "missing.png" in out.stderr and "not found" in out.stderr


def test_render_lines(tmp_path):
    (tmp_path / "t.txt").write_text("Hello, world 42\n\nA second line that is longer\n")
    out = run_cli("data_tools", "render-lines", "--out", tmp_path / "r", "--count", "3",
                  "--fonts", "DejaVuSans,STIXGeneral", "--text", tmp_path / "t.txt",
                  "--max-chars", "20")
    assert out.returncode == 0, out.stderr
    rows = [ln.split("\t") for ln in (tmp_path / "r" / "list.tsv").read_text().splitlines()]
    assert [t for _, t in rows] == ["Hello, world 42", "A second line that", "Hello, world 42"]
    for name, _ in rows:
        im = np.asarray(Image.open(tmp_path / "r" / name))
        assert im.ndim == 2 and im.shape[0] >= 16 and im.min() < 128 < im.max()  # ink, paper
    out = run_cli("data_tools", "render-lines", "--out", tmp_path / "s", "--fonts", "cmmi10")
    assert out.returncode == 2 and "cmmi10" in out.stderr and "math/symbol" in out.stderr


def ink_box(font_path, ch, size=40):
    """(top, bottom, left, right) of the ink of ``ch`` drawn at ``size`` pixels, rows
    relative to the baseline (negative: above it)."""
    from PIL import ImageDraw, ImageFont
    font = ImageFont.truetype(str(font_path), size)
    im = Image.new("L", (4 * size, 4 * size), 255)
    ImageDraw.Draw(im).text((size, 2 * size), ch, font=font, fill=0, anchor="ls")
    a = np.asarray(im) < 128
    rows, cols = np.flatnonzero(a.any(axis=1)), np.flatnonzero(a.any(axis=0))
    return rows[0] - 2 * size, rows[-1] - 2 * size, cols[0], cols[-1]


def test_glyph_check_finds_the_tex_layout_of_the_bakoma_fonts():
    """render-lines' glyph check (data_tools/render.py): matplotlib's Computer Modern files
    keep TeX's OT1 layout under a Unicode cmap. The check flags exactly the printable ASCII
    characters those fonts draw as other glyphs, and real renderings show the wrong glyphs:
    cmr10's '_' is a dot accent high above the baseline, its '|' an en dash, its '<' an
    inverted exclamation mark that descends below the baseline, cmti10's '$' a pound sign
    that does not."""
    from data_tools.render import find_font, wrong_glyphs
    ascii_ = [chr(c) for c in range(32, 127)]
    tex = set('"\'<>\\^_`{|}~')
    assert set(wrong_glyphs(find_font("cmr10"), ascii_)) == tex
    assert set(wrong_glyphs(find_font("cmss10"), ascii_)) == tex
    assert set(wrong_glyphs(find_font("cmti10"), ascii_)) == tex | {"$"}
    assert set(wrong_glyphs(find_font("cmtt10"), ascii_)) == {"'", "`"}  # curly quotes
    for good in ("DejaVuSans", "DejaVuSerif-BoldItalic", "STIXGeneral"):
        assert wrong_glyphs(find_font(good), ascii_) == {}
    assert wrong_glyphs(find_font("cmr10"), "é\u4e00") == {"é": "no glyph",
                                                            "\u4e00": "no glyph"}
    cmr, cmti, dv = find_font("cmr10"), find_font("cmti10"), find_font("DejaVuSans")
    top, bottom, left, right = ink_box(dv, "_")
    assert bottom >= 0                                 # an underscore: on/below the line
    top, bottom, left, right = ink_box(cmr, "_")
    assert bottom < -15                                # a dot accent, above x-height
    top, bottom, left, right = ink_box(dv, "|")
    assert bottom - top > 3 * (right - left)           # a bar: tall and thin
    top, bottom, left, right = ink_box(cmr, "|")
    assert right - left > 3 * (bottom - top)           # an en dash: wide and flat
    assert ink_box(dv, "<")[1] <= 0 < ink_box(cmr, "<")[1]      # ¡ descends, < does not
    assert ink_box(cmr, "$")[1] > 0 >= ink_box(cmti, "$")[1]    # $ descends, £ does not


def test_render_lines_never_draws_a_line_in_a_font_that_draws_it_wrongly(tmp_path):
    """A line with a character one of --fonts draws wrongly goes to the other fonts only;
    which font drew a line shows in the image's size (clean renderings at one size: no
    rotation, stretch, blur or noise) compared with render_line's image of that line in
    each font. A line no font draws is refused before anything is written."""
    from data_tools.render import find_font, render_line
    (tmp_path / "t.txt").write_text("a<b\nab\n")
    out = run_cli("data_tools", "render-lines", "--out", tmp_path / "r", "--count", "16",
                  "--fonts", "cmr10,DejaVuSans", "--text", tmp_path / "t.txt", "--sizes",
                  "20-20", "--rotate", "0", "--blur", "0", "--noise", "0", "--seed", "3")
    assert out.returncode == 0, out.stderr

    def shape(text, font):
        return render_line(text, find_font(font), 20, np.random.default_rng(0), 0, 0, 0).size
    for text in ("a<b", "ab"):        # the two fonts' images of a line differ in size
        assert shape(text, "cmr10") != shape(text, "DejaVuSans")
    drawn = {"a<b": set(), "ab": set()}
    for row in (tmp_path / "r" / "list.tsv").read_text().splitlines():
        name, text = row.split("\t")
        size = Image.open(tmp_path / "r" / name).size
        font = {shape(text, f): f for f in ("cmr10", "DejaVuSans")}[size]
        drawn[text].add(font)
    assert drawn == {"a<b": {"DejaVuSans"}, "ab": {"cmr10", "DejaVuSans"}}
    out = run_cli("data_tools", "render-lines", "--out", tmp_path / "s", "--fonts", "cmr10",
                  "--text", tmp_path / "t.txt", "--count", "2")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "line 1 ('a<b')" in out.stderr and "cmr10: '<'" in out.stderr
    assert "exclamdown" in out.stderr and not (tmp_path / "s").exists()
    (tmp_path / "x.ttf").write_bytes(b"not a font at all" * 10)
    out = run_cli("data_tools", "render-lines", "--out", tmp_path / "s", "--fonts",
                  tmp_path / "x.ttf", "--count", "1")
    assert out.returncode == 2 and "x.ttf" in out.stderr and "Traceback" not in out.stderr


def test_render_margin_and_stretch_geometry():
    """--margin puts that much paper above and below the text, --stretch scales the width:
    checked on a clean line (no rotation, blur or noise) against the font's own metrics."""
    from PIL import ImageFont
    from data_tools.render import find_font, render_line
    font_path, size, text = find_font("DejaVuSans"), 20, "Ag text"
    ascent, descent = ImageFont.truetype(str(font_path), size).getmetrics()

    def draw(**kw):
        return np.asarray(render_line(text, font_path, size, np.random.default_rng(5),
                                      0.0, 0.0, 0.0, **kw))
    plain = draw()
    wide = draw(margin=(1.0, 1.0), stretch=(2.0, 2.0))
    assert wide.shape == (ascent + descent + 2 * size, round(plain.shape[1] * 2.0))
    ink_rows = np.flatnonzero((wide < 128).any(axis=1))
    assert ink_rows[0] >= size and ink_rows[-1] < size + ascent + descent  # paper margins
    ink_cols = np.flatnonzero((plain < 128).any(axis=0))
    wide_cols = np.flatnonzero((wide < 128).any(axis=0))
    span, wide_span = ink_cols[-1] - ink_cols[0], wide_cols[-1] - wide_cols[0]
    assert abs(wide_span - 2 * span) <= 3          # the ink itself is twice as wide
    for bad in (["--stretch", "0-1"], ["--margin", "x"], ["--margin", "2-1"]):
        out = run_cli("data_tools", "render-lines", "--out", "unused", *bad)
        assert out.returncode == 2 and bad[0] in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------- end to end

def write_glyph_sets(tmp_path):
    imgs, targets = glyph_images(24, seed=11, short_height=6)
    ncdata.write_images(tmp_path / "train.nc", imgs, targets, LABELS,
                        tags=[f"g{i}" for i in range(24)])
    return tmp_path / "train.nc"


# slow (left out of the default run): by default, test_train.py overfits through
# the same loop and the conv cases above check the front end itself
@pytest.mark.slow
def test_tiny_2d_set_overfits_through_cli(tmp_path):
    """Train conv + BLSTM on 24 glyph-string images (heights 8 and 6) through the CLI, then
    `rnntrain eval` and `decode` on the same images: label error rate 0."""
    train = write_glyph_sets(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[data]\ntrain = "{train}"\nval = "{train}"\n'
                   "[model]\nfrontend = \"conv\"\nconv_channels = [8, 16]\nconv_pool_h = [2, 2]\n"
                   "conv_pool_w = [1, 1]\nlayers = 1\nhidden = 32\n"
                   "[optim]\nlr = 0.01\nclip_norm = 5.0\n"
                   "[train]\nepochs = 40\n[batch]\nbatch_frames = 200\n[log]\nevery_steps = 50\n"
                   "[compute]\nthreads = 1\n")
    run = tmp_path / "run"
    out = run_cli("rnntrain", "train", cfg, f"run.dir={run}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    ev = run_cli("rnntrain", "eval", run / "checkpoints" / "best.pt", train, "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["ler"] == 0.0
    ck = torch.load(run / "checkpoints" / "best.pt", weights_only=False)
    assert ck["image_height"] == 8


# slow (left out of the default run): by default, test_resume.py kills and resumes
@pytest.mark.slow
def test_conv_2d_sigkill_resume_bit_identical(tmp_path):
    """Conv front end on 2-D data, two worker threads, channel dropout and input noise:
    killed twice (once inside a checkpoint write) and resumed, the final weights and
    optimizer state equal an uninterrupted run's bit for bit."""
    from tests.test_resume import EPOCHS, EVERY, assert_same_final, kill_points, \
        killed_and_resumed, launch, steps_per_epoch, train_cmd
    imgs, targets = glyph_images(60, seed=12, short_height=6)
    ncdata.write_images(tmp_path / "train.nc", imgs, targets, LABELS)
    cfg = tmp_path / "exp.toml"
    cfg.write_text(f'[data]\ntrain = "{tmp_path / "train.nc"}"\n'
                   "[model]\nfrontend = \"conv\"\nconv_channels = [4, 8]\n"
                   "conv_pool_h = [2, 2]\nconv_pool_w = [2, 1]\nconv_dropout = 0.2\n"
                   "layers = 1\nhidden = 16\n"
                   f"[train]\nepochs = {EPOCHS}\ninput_noise = 0.1\n[batch]\nbatch_frames = 60\n"
                   "[log]\nevery_steps = 1\n[compute]\nthreads = 2\n"
                   f"[checkpoint]\nevery_steps = {EVERY}\nkeep_last = 2\n")
    rc, err = launch(train_cmd(cfg, tmp_path / "straight"))
    assert rc == 0, err[-3000:]
    run = killed_and_resumed(tmp_path, cfg, kill_points(5, steps_per_epoch(err), 2))
    assert_same_final(tmp_path / "straight", run)


@pytest.mark.mpi
# slow (left out of the default run): by default, test_mpi.py checks N ranks = 1
@pytest.mark.slow
def test_conv_2d_two_ranks_train_like_one(tmp_path):
    """2 MPI ranks with global batch B end an epoch with the weights of 1 rank with batch
    B (conv front end, 2-D images of two heights; no dropout: its masks are drawn per
    task, and tasks differ with the rank count)."""
    from tests.conftest import mpiexec
    from tests.test_mpi import launch, rel_diff
    if mpiexec() is None:
        pytest.skip("mpiexec not found")
    imgs, targets = glyph_images(40, seed=13, short_height=6)
    ncdata.write_images(tmp_path / "train.nc", imgs, targets, LABELS)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[data]\ntrain = "{tmp_path / "train.nc"}"\n'
                   "[model]\nfrontend = \"conv\"\nconv_channels = [4, 8]\nconv_pool_h = [2, 2]\n"
                   "conv_pool_w = [2, 1]\nlayers = 1\nhidden = 16\n"
                   "[train]\nepochs = 1\n[batch]\nbatch_frames = 120\n[compute]\nthreads = 1\n"
                   "[log]\nevery_steps = 4\n")
    r, _ = launch(1, "tests/mpi_train.py", tmp_path, cfg, "serial=batch.batch_multiple=2")
    assert r.returncode == 0, r.stderr[-3000:]
    r, _ = launch(2, "tests/mpi_train.py", tmp_path, cfg, "ar2=dist.mode=allreduce")
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = dict(np.load(tmp_path / "serial.npz")), dict(np.load(tmp_path / "ar2.npz"))
    assert any(k.startswith("frontend.") for k in a)
    assert rel_diff(a, b) <= 1e-5
