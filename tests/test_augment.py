"""On-the-fly augmentation ([augment], rnntrain.augment): draws that are a function of
(seed, epoch, sequence) alone, transforms that keep lengths consistent with the targets,
the CTC feasibility fallback, and training runs checked against independent computations
(a copy of the data augmented offline, other thread counts, a killed and resumed run)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from rnntrain.augment import PRESETS, Augmenter, ImageGeometry, resolve
from rnntrain.augment.features import augment_features, warp_positions
from rnntrain.augment.image import augment_image
from rnntrain.config import load_config
from rnntrain.data import ncdata
from rnntrain.data.dataset import Dataset, min_frames
from rnntrain.errors import ConfigError
from tests.conftest import run_cli, train_here
from tests.images2d import LABELS, glyph_images

LINES, SPEECH = PRESETS["lines"], PRESETS["speech"]
OFF = replace(PRESETS["none"], prob=1.0)  # every magnitude 0


def _line(h=16, w=60, seed=0) -> np.ndarray:
    """(P=h, W, 1) canvas with random ink in its middle rows."""
    img = np.zeros((h, w, 1), np.float32)
    img[h // 4: 3 * h // 4, 2:-2] = np.random.default_rng(seed).random((h // 2, w - 4, 1)) < 0.4
    return img


# ------------------------------------------------------------------ pure draws

def test_draws_are_a_function_of_seed_epoch_and_sequence():
    rng = np.random.default_rng(5)
    frames = {s: rng.random((40 + 3 * s, 12)).astype(np.float32) for s in range(6)}
    before = {s: f.copy() for s, f in frames.items()}
    aug = Augmenter(LINES, seed=3, image=ImageGeometry(12, 1), subsample=1)
    target = np.array([0, 1])
    first = {(e, s): aug(e, s, frames[s], target) for e in (0, 1) for s in frames}
    # again, in another order, from a second augmenter (another worker, another process)
    other = Augmenter(LINES, seed=3, image=ImageGeometry(12, 1), subsample=1)
    for e, s in sorted(first, reverse=True):
        assert np.array_equal(other(e, s, frames[s], target), first[e, s])
    # another epoch, sequence or seed draws another transform
    assert sum(np.array_equal(first[0, s], first[1, s]) for s in frames) <= 1  # prob 0.75
    seed7 = Augmenter(LINES, seed=7, image=ImageGeometry(12, 1), subsample=1)
    assert any(not np.array_equal(seed7(0, s, frames[s], target), first[0, s]) for s in frames)
    # never in place: the chunk the reader holds stays as read
    assert all(np.array_equal(frames[s], before[s]) for s in frames)


def test_off_builds_no_augmenter_and_knobs_override_the_preset(synth_pair):
    ds = Dataset.open(str(synth_pair[0]))
    cfg = load_config(None, [f"data.train={synth_pair[0]}"])
    assert Augmenter.for_training(cfg, ds, 1) is None  # the default: off
    cfg = load_config(None, [f"data.train={synth_pair[0]}", "augment.preset=speech",
                             "augment.speed=0", "augment.freq_masks=3"])
    p = resolve(cfg.augment)
    assert p.speed == 0 and p.freq_masks == 3 and p.time_warp == SPEECH.time_warp
    cfg = load_config(None, [f"data.train={synth_pair[0]}", "augment.noise=0.1"])
    assert Augmenter.for_training(cfg, ds, 1).params.noise == 0.1  # a knob alone
    cfg = load_config(None, [f"data.train={synth_pair[0]}", "augment.preset=lines"])
    with pytest.raises(ConfigError, match=r"augment\.rotate applies to images.*speech"):
        Augmenter.for_training(cfg, ds, 1)
    cfg = load_config(None, ["data.train=x", "augment.preset=lines-light", "augment.blur=0"])
    assert resolve(cfg.augment) == replace(PRESETS["lines-light"], blur=0.0)
    with pytest.raises(ConfigError, match="augment.prob = -2"):
        load_config(None, ["data.train=x", "augment.prob=-2"])


def test_wrong_kind_is_one_line_before_the_run_folder(tmp_path, synth_pair):
    run = tmp_path / "run"
    r = run_cli("rnntrain", "train", f"data.train={synth_pair[0]}", "augment.preset=lines",
                f"run.dir={run}")
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and "augment.rotate" in r.stderr, r.stderr
    assert not run.exists()


# ------------------------------------------------------------------ image transforms

def _centroid(img: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(img[..., 0] > 0.5)
    return np.array([ys.mean(), xs.mean()])


@pytest.mark.parametrize("knob", ["stretch", "scale", "translate"])
def test_affine_moves_a_dot_where_the_map_says(knob):
    """A 2x2 dot, one knob on: its centre lands where the affine map, computed here from
    the drawn factor, sends it (and the width follows the horizontal factor)."""
    h, w = 20, 50
    img = np.zeros((h, w, 1), np.float32)
    img[4:6, 30:32] = 1.0                                 # centre (4.5, 30.5)
    p = replace(OFF, **{knob: 0.3})
    for seed in range(5):
        g = np.random.default_rng(seed)  # draws: rotation, shear, scale, stretch, translation
        u = [g.uniform(-1, 1) for _ in range(5)][["scale", "stretch", "translate"].index(knob) + 2]
        out = augment_image(img, h, p, np.random.default_rng(seed))
        sy = sx = 1.0
        ty = 0.0
        if knob == "scale":
            sy = sx = 1 + 0.3 * u
        elif knob == "stretch":
            sx = 1 + 0.3 * u
        else:
            ty = 0.3 * u * h
        w_out = max(1, round(w * sx))
        assert out.shape == (h, w_out, 1)
        cy, cx = (h - 1) / 2, (w - 1) / 2
        want = np.array([cy + ty + sy * (4.5 - cy), (w_out - 1) / 2 + sx * (30.5 - cx)])
        np.testing.assert_allclose(_centroid(out), want, atol=0.6)


@pytest.mark.parametrize("preset", ["lines", "lines-light"])
def test_image_transforms_keep_height_and_consistent_width(preset):
    """The line presets on many draws: P and C unchanged, the width within the drawn
    factors' range, finite values; all magnitudes 0 is the identity, bit for bit."""
    img = _line(h=24, w=80)
    p = PRESETS[preset]
    lo = 80 * (1 - p.scale) * (1 - p.stretch) - 1
    hi = 80 * (1 + p.scale) * (1 + p.stretch) + p.shear * 24 * (1 + p.scale) + 1
    widths = set()
    for seed in range(40):
        out = augment_image(img, 24, p, np.random.default_rng(seed))
        assert out.dtype == np.float32 and out.shape[0] == 24 and out.shape[2] == 1
        assert lo <= out.shape[1] <= hi and np.isfinite(out).all()
        widths.add(out.shape[1])
    assert len(widths) > 10
    assert np.array_equal(augment_image(img, 24, OFF, np.random.default_rng(0)), img)


def test_light_preset_keeps_the_stroke_mass_of_a_32_pixel_line():
    """"lines-light" (contrast and noise off) on a 32-pixel line of 2-pixel strokes: the
    ink mass changes only by the affine map's area factor, computed here from the drawn
    scale and stretch (rotation and shear keep areas; no erosion, dilation or elastic
    field; its blur keeps the mass). "lines" on the same line thickens or thins the
    strokes (erosion/dilation, elastic bends) by far more in many draws."""
    light = PRESETS["lines-light"]
    assert light.morph <= 1 and light.elastic == 0 and light.blur <= 0.5
    img = np.zeros((32, 120, 1), np.float32)
    img[10:22, 8:-8:6] = img[10:22, 9:-8:6] = 1.0       # 2-pixel vertical strokes
    img[10:12, 8:-8] = img[20:22, 8:-8] = 1.0           # and two horizontal ones
    off = {name: 0 for name in ("lines-light", "lines")}
    for seed in range(40):
        g = np.random.default_rng(seed)  # draws: rotation, shear, scale, stretch, ...
        u = [g.uniform(-1, 1) for _ in range(5)]
        for name in off:
            p = replace(PRESETS[name], contrast=0.0, noise=0.0)
            area = (1 + p.scale * u[2]) ** 2 * (1 + p.stretch * u[3])
            out = augment_image(img, 32, p, np.random.default_rng(seed))
            off[name] += abs(out.sum() / (img.sum() * area) - 1) > 0.01
    assert off["lines-light"] == 0 and off["lines"] > 10, off


def test_image_frames_round_trip_through_the_column_layout():
    """The augmenter reshapes (W, P·C) column frames to (P, W, C) and back: with all
    magnitudes 0 the frames come back unchanged, 2 channels included."""
    rng = np.random.default_rng(2)
    frames = rng.random((30, 8 * 2)).astype(np.float32)
    aug = Augmenter(OFF, 1, ImageGeometry(8, 2), 1)
    assert np.array_equal(aug(0, 0, frames, [0]), frames)
    aug = Augmenter(replace(OFF, stretch=0.3), 1, ImageGeometry(8, 2), 1)
    out = aug(0, 0, frames, [0])
    assert out.shape[1] == 16 and out.dtype == np.float32 and out.flags.c_contiguous


# ------------------------------------------------------------------ feature transforms

def test_speed_changes_the_length_by_the_drawn_factor():
    x = np.random.default_rng(0).standard_normal((200, 10)).astype(np.float32)
    p = replace(OFF, speed=0.1)
    lengths = set()
    for seed in range(20):
        u = float(np.random.default_rng(seed).uniform(-1, 1))
        out = augment_features(x, p, np.random.default_rng(seed))
        assert len(out) == round(200 / (1 + 0.1 * u)) and out.shape[1] == 10
        lengths.add(len(out))
    assert min(lengths) < 190 and max(lengths) > 210
    # a ramp stays a ramp: linear resampling of a linear signal is exact
    ramp = np.tile(np.arange(200, dtype=np.float32)[:, None], (1, 2))
    out = augment_features(ramp, p, np.random.default_rng(3))
    d = np.diff(out[1:-1, 0])
    np.testing.assert_allclose(d, d.mean(), rtol=1e-4)
    np.testing.assert_allclose(d.mean(), 200 / len(out), rtol=1e-3)


def test_time_warp_keeps_length_and_ends_and_is_monotone():
    rng = np.random.default_rng(1)
    for t in (11, 12, 50, 300):
        pos = warp_positions(t, 5, rng)
        assert len(pos) == t and np.all(np.diff(pos) > 0)  # every frame once, in order
        assert -0.5 <= pos[0] <= 0.5 and t - 1.5 <= pos[-1] <= t - 0.5
        # two linear pieces that meet at one frame boundary (the moved centre)
        steps = np.round(np.diff(pos), 9)
        assert len(set(steps)) <= 3
    assert np.array_equal(warp_positions(10, 5, rng), np.arange(10))  # too short: as is


def test_masks_zero_bands_within_their_widths_and_keep_the_length():
    x = np.random.default_rng(0).uniform(1, 2, (100, 40)).astype(np.float32)
    p = replace(OFF, freq_masks=2, freq_mask_width=0.2, time_masks=2, time_mask_width=0.05)
    for seed in range(20):
        out = augment_features(x, p, np.random.default_rng(seed))
        assert out.shape == x.shape
        zero_cols = np.flatnonzero((out == 0).all(axis=0))
        zero_rows = np.flatnonzero((out == 0).all(axis=1))
        assert len(zero_cols) <= 2 * 8 and len(zero_rows) <= 2 * 5
        kept = np.ones(x.shape, bool)
        kept[:, zero_cols] = False
        kept[zero_rows] = False
        assert np.array_equal(out[kept], x[kept])  # everything else untouched


# ------------------------------------------------------------------ CTC feasibility

@pytest.mark.parametrize("subsample", [1, 3])
def test_a_draw_too_short_for_its_target_falls_back_to_the_original(subsample):
    """Sequences just long enough for their targets: speed-ups that make one infeasible
    give the original frames back (the same object), slow-downs are kept; which is which
    is computed here from the same draw."""
    rng = np.random.default_rng(4)
    target = np.array([0, 1, 1, 2, 3, 3, 3, 1])  # 8 labels + 3 repeats: 11 frames needed
    need = min_frames(target)
    aug = Augmenter(replace(OFF, speed=0.3), seed=2, image=None, subsample=subsample)
    fell = kept = 0
    for seq in range(40):
        x = rng.standard_normal((need * subsample, 6)).astype(np.float32)
        out = aug(0, seq, x, target)
        g = aug.rng(0, seq)
        g.uniform()  # the prob draw
        drawn = aug.transform(x, g, seq)
        if math.ceil(len(drawn) / subsample) < need:
            assert out is x
            fell += 1
        else:
            assert np.array_equal(out, drawn) and math.ceil(len(out) / subsample) >= need
            kept += 1
    assert fell > 5 and kept > 5


# ------------------------------------------------------------------ training runs

def _features_copy(tmp_path, src, aug: Augmenter, epoch: int = 0):
    """``src`` with every sequence replaced by its augmented frames of ``epoch``."""
    ds = Dataset.open(str(src))
    frames = ds.load_chunk(0)
    assert len(ds.chunks) == 1
    seqs = [aug(epoch, s, frames[s], ds.targets[s]) for s in range(ds.num_seqs)]
    targets = [" ".join(ds.labels[k] for k in t) for t in ds.targets]
    out = tmp_path / "augmented.nc"
    ncdata.write_file(out, seqs, targets, ds.labels, ds.tags)
    return out


def _weights(run):
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


TINY = ["model.layers=1", "model.hidden=16", "train.epochs=1", "batch.batch_frames=400",
        "log.every_steps=100", "checkpoint.every_minutes=1000"]


def test_speech_training_equals_training_on_an_offline_augmented_copy(tmp_path, synth_pair):
    """SpecAugment (speed off: the plan, a function of the lengths, stays the same) applied
    by 2 workers in tasks equals training on a file holding those augmented sequences,
    without augmentation: the workers apply exactly the per-sequence draws."""
    train_nc = synth_pair[0]
    over = [f"data.train={train_nc}", *TINY, "compute.threads=2", "augment.preset=speech",
            "augment.speed=0", "augment.noise=0.1"]
    run_a = train_here(None, *over, f"run.dir={tmp_path / 'a'}")
    cfg = load_config(None, over)
    aug = Augmenter.for_training(cfg, Dataset.open(str(train_nc)), 1)
    copy = _features_copy(tmp_path, train_nc, aug)
    run_b = train_here(None, f"data.train={copy}", *TINY, "compute.threads=2",
                       f"run.dir={tmp_path / 'b'}")
    assert _same(_weights(run_a), _weights(run_b))
    run_c = train_here(None, f"data.train={train_nc}", *TINY, "compute.threads=2",
                       f"run.dir={tmp_path / 'c'}")
    assert not _same(_weights(run_a), _weights(run_c))  # augmentation did change them


def _images(tmp_path, n=40, seed=1):
    images, targets = glyph_images(n, seed, height=12)
    path = tmp_path / f"img{seed}.nc"
    ncdata.write_images(path, images, targets, LABELS)
    return path


CONV = ["model.frontend=conv", "model.conv_channels=[4,8]", "model.conv_pool_h=[2,2]",
        "model.conv_pool_w=[2,1]"]


def test_image_training_equals_training_on_an_offline_augmented_copy(tmp_path):
    """The lines preset without width changes (scale, stretch, shear off), conv front end,
    2 workers: the same weights as training on the augmented images written to a file."""
    src = _images(tmp_path)
    over = [f"data.train={src}", *TINY, *CONV, "batch.batch_frames=200", "compute.threads=2",
            "augment.preset=lines", "augment.scale=0", "augment.stretch=0", "augment.shear=0"]
    run_a = train_here(None, *over, f"run.dir={tmp_path / 'a'}")
    ds = Dataset.open(str(src))
    aug = Augmenter.for_training(load_config(None, over), ds, 2)
    frames = ds.load_chunk(0)
    imgs = [aug(0, s, frames[s], ds.targets[s]).T for s in range(ds.num_seqs)]  # (P, W)
    assert sum(not np.array_equal(i, frames[s].T) for s, i in enumerate(imgs)) > 20
    targets = [" ".join(ds.labels[k] for k in t) for t in ds.targets]
    copy = tmp_path / "augmented.nc"
    ncdata.write_images(copy, imgs, targets, ds.labels)
    run_b = train_here(None, f"data.train={copy}", *TINY, *CONV, "batch.batch_frames=200",
                       "compute.threads=2", f"run.dir={tmp_path / 'b'}")
    assert _same(_weights(run_a), _weights(run_b))


def test_one_and_two_workers_give_the_same_weights(tmp_path):
    """Batches of one image each (batch_frames below every width): every step is one
    task whichever thread count, so 1 and 2 workers must agree bit for bit, the lines
    preset (width changes included) drawn on whichever worker runs the sequence; and the
    augmentation off matches a config without the [augment] section."""
    src = _images(tmp_path, n=16, seed=2)
    base = [f"data.train={src}", *TINY, *CONV, "batch.batch_frames=1", "train.epochs=2"]
    w = {t: _weights(train_here(None, *base, f"compute.threads={t}", "augment.preset=lines",
                                f"run.dir={tmp_path / f'w{t}'}")) for t in (1, 2)}
    assert _same(w[1], w[2])
    off = _weights(train_here(None, *base, "compute.threads=2", "augment.preset=none",
                              f"run.dir={tmp_path / 'off'}"))
    absent = _weights(train_here(None, *base, "compute.threads=2", f"run.dir={tmp_path / 'abs'}"))
    assert _same(off, absent) and not _same(off, w[2])


def test_killed_run_with_augmentation_resumes_bit_identically(tmp_path, synth_pair):
    """The speech preset (speed perturbation included), SIGKILLed once mid-epoch and
    resumed: the same final weights and optimizer state as the uninterrupted run."""
    from tests.test_resume import (assert_same_final, kill_points, killed_and_resumed, launch,
                                   steps_per_epoch, train_cmd, write_config)
    cfg = write_config(tmp_path, synth_pair, threads=1)
    cfg.write_text(cfg.read_text() + '[augment]\npreset = "speech"\n')
    rc, err = launch(train_cmd(cfg, tmp_path / "straight"))
    assert rc == 0, err[-3000:]
    assert "augmentation: feature sequences" in err
    run = killed_and_resumed(tmp_path, cfg, kill_points(5, steps_per_epoch(err), 1))
    assert_same_final(tmp_path / "straight", run)


def test_training_without_image_augmentation_never_imports_scipy_ndimage(tmp_path, synth_pair):
    """scipy.ndimage (about half a second to import) is loaded by the first image
    augmentation, not at start-up: a training on features, in a fresh process, ends without
    it; one call of ``augment_image`` in that process loads it."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[data]\ntrain = "{synth_pair[0]}"\nval = "{synth_pair[1]}"\n'
                   f'[model]\nlayers = 1\nhidden = 8\n[train]\nepochs = 1\n'
                   f'[compute]\nthreads = 1\n[run]\ndir = "{tmp_path / "run"}"\n')
    code = ("import sys\n"
            "from rnntrain.config import load_config\n"
            "from rnntrain.run.train import train\n"
            "train(load_config(sys.argv[1], []), sys.argv[1])\n"
            "print('after training', 'scipy.ndimage' in sys.modules)\n"
            "import numpy as np\n"
            "from rnntrain.augment import PRESETS\n"
            "from rnntrain.augment.image import augment_image\n"
            "augment_image(np.zeros((8, 20, 1), np.float32), 8, PRESETS['lines'],\n"
            "              np.random.default_rng(0))\n"
            "print('after augment_image', 'scipy.ndimage' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True,
                       text=True, cwd=tmp_path, env={"PYTHONPATH": str(root),
                                                     "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-2:] == ["after training False", "after augment_image True"]
    assert (tmp_path / "run" / "checkpoints" / "best.pt").exists()
