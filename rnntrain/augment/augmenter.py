"""The per-sequence augmenter the workers call just before collation.

``Augmenter(epoch, seq, frames, target)`` → the frames to train on this time. The random
generator is seeded by (train.seed, epoch, global sequence id) alone (a stream of its own:
``AUGMENT_STREAM``), so a sequence gets the same transform whichever worker, task, batch
split, rank count or resume point computes it: the weights stay a function of the config
and seed. A transform that leaves a sequence too short for its CTC target (after the
model's subsampling) is dropped for that draw: the sequence is used unaugmented.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rnntrain.augment.features import augment_features
from rnntrain.augment.image import augment_image
from rnntrain.augment.params import AugmentParams, check_kind, resolve
from rnntrain.data.dataset import min_frames
from rnntrain.data.plan import rng_for

AUGMENT_STREAM = 0x61756700  # "aug": keeps these draws apart from other (seed, ...) streams


@dataclass(frozen=True)
class ImageGeometry:
    """How a served frame is an image column: ``pad_height`` P pixels of ``channels`` C
    values, top to bottom; ``heights`` (N,) the images' own heights (rows below are zero
    padding), None when every image fills P."""
    pad_height: int
    channels: int
    heights: np.ndarray | None = None

    @staticmethod
    def of(ds) -> "ImageGeometry | None":
        """The dataset's image geometry: 2-D data, or 1-D files of image columns
        (``imageHeight``); None for feature sequences."""
        if ds.is_2d:
            return ImageGeometry(ds.frame_height, ds.input_size, ds.heights)
        if ds.column_height > 1:
            return ImageGeometry(ds.column_height, ds.input_size // ds.column_height)
        return None


class Augmenter:
    """params: the resolved magnitudes; seed: train.seed; image: the data's image geometry
    (None: feature sequences); subsample: the model's total time subsampling (frame
    stacking x the conv front end's width pooling), for the CTC feasibility check."""

    def __init__(self, params: AugmentParams, seed: int, image: ImageGeometry | None,
                 subsample: int = 1):
        self.params, self.seed, self.image, self.subsample = params, seed, image, subsample

    @staticmethod
    def for_training(cfg, ds, subsample: int) -> "Augmenter | None":
        """From the config's ``[augment]`` section and the training data; None when
        augmentation is off. ConfigError for knobs of the other kind of data."""
        params = resolve(cfg.augment)
        if not params.active:
            return None
        image = ImageGeometry.of(ds)
        check_kind(params, image is not None, f"data.train {cfg.data.train}")
        return Augmenter(params, cfg.train.seed, image, subsample)

    def describe(self) -> str:
        """One line for the log: the kind of data and the magnitudes that are on."""
        on = ", ".join(f"{k} {v:g}" for k, v in vars(self.params).items() if v)
        kind = "line images" if self.image is not None else "feature sequences"
        return f"{kind}: {on}"

    def rng(self, epoch: int, seq: int) -> np.random.Generator:
        return rng_for(self.seed, AUGMENT_STREAM, epoch, seq)

    def transform(self, frames: np.ndarray, rng: np.random.Generator, seq: int) -> np.ndarray:
        """One draw: frames (T, F) → (T', F), float32."""
        g = self.image
        if g is None:
            return augment_features(frames, self.params, rng)
        t = len(frames)
        img = frames.reshape(t, g.pad_height, g.channels).transpose(1, 0, 2)  # (P, W, C)
        height = int(g.heights[seq]) if g.heights is not None else g.pad_height
        out = augment_image(img, height, self.params, rng)  # (P, W', C)
        return np.ascontiguousarray(out.transpose(1, 0, 2)).reshape(out.shape[1], -1)

    def __call__(self, epoch: int, seq: int, frames: np.ndarray, target) -> np.ndarray:
        """The frames sequence ``seq`` trains on in ``epoch`` (T', F): augmented, or
        ``frames`` itself (not augmented this epoch, or the draw made it infeasible)."""
        rng = self.rng(epoch, seq)
        if rng.uniform() >= self.params.prob:
            return frames
        out = self.transform(frames, rng, seq)
        if -(-len(out) // self.subsample) < min_frames(target):
            return frames  # too short for the target after this draw: unaugmented
        return out
