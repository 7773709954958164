"""Augmentation settings resolved: the presets and the ``[augment]`` knobs as one frozen
record (``AugmentParams``), and which of them concern images or feature sequences."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from rnntrain.config import AugmentConfig
from rnntrain.errors import ConfigError


@dataclass(frozen=True)
class AugmentParams:
    """The magnitudes the augmenter draws from (see ``config.AugmentConfig`` for each
    field's meaning); 0 is off."""
    prob: float = 0.0
    rotate: float = 0.0
    shear: float = 0.0
    scale: float = 0.0
    stretch: float = 0.0
    translate: float = 0.0
    elastic: float = 0.0
    elastic_scale: float = 0.0
    blur: float = 0.0
    morph: int = 0
    contrast: float = 0.0
    noise: float = 0.0
    freq_masks: int = 0
    freq_mask_width: float = 0.0
    time_masks: int = 0
    time_mask_width: float = 0.0
    time_warp: int = 0
    speed: float = 0.0

    @property
    def image_on(self) -> bool:
        return any(getattr(self, k) for k in IMAGE_KEYS)

    @property
    def features_on(self) -> bool:
        return any(getattr(self, k) for k in FEATURE_KEYS)

    @property
    def active(self) -> bool:
        return self.prob > 0 and (self.image_on or self.features_on or self.noise > 0)


# knobs of one kind of data only ("noise" and "prob" serve both)
IMAGE_KEYS = ("rotate", "shear", "scale", "stretch", "translate", "elastic", "blur", "morph",
              "contrast")
FEATURE_KEYS = ("freq_masks", "time_masks", "time_warp", "speed")

# Sources of the magnitudes. Lines: kraken applies (with chance 0.5) a shift/scale/rotate
# of up to 6 %, 20 % and 3 degrees, blur and optical/elastic distortion; Calamari's
# ocrodeg uses rotations of +-2 degrees, scale and anisotropy of +-10 %; PyLaia adds a
# random affine, erosion and dilation. Line images here are 32-64 pixels high, so one
# pixel of elastic displacement and a blur sigma of one pixel are already visible.
# "lines-light" is for lines about 32 pixels high (recipes/printed_lines.sh's): there one
# pixel is a third of a 2-3 pixel stroke, so "lines"'s erosion/dilation (window 2: one
# pixel thinner or thicker) and elastic bends (0.8 pixels between control points 6 pixels
# apart) change the glyphs' shapes, not just their rendering; measured at 6 epochs, "lines"
# raised the unseen font's CER from 33.5 % to 55.3 % (docs/accuracy.md). It keeps the
# small affine map at half the magnitudes (a distance in pixels is twice as large a share
# of a 32-pixel line as of a 64-pixel one), no elastic field and no erosion/dilation, a
# blur of at most half a pixel, half the contrast jitter and noise, and augments half the
# sequences instead of three quarters.
# Speech: ESPnet's SpecAug (time warp window 5, 2 frequency masks, 2 time masks of up to
# 5 % of the length), Kaldi/ESPnet speed perturbation 0.9-1.1.
PRESETS: dict[str, AugmentParams] = {
    "none": AugmentParams(prob=1.0),
    "lines": AugmentParams(prob=0.75, rotate=1.0, shear=0.2, scale=0.1, stretch=0.1,
                           translate=0.05, elastic=0.8, elastic_scale=6.0, blur=1.0, morph=2,
                           contrast=0.3, noise=0.04),
    "lines-light": AugmentParams(prob=0.5, rotate=0.5, shear=0.1, scale=0.05, stretch=0.05,
                                 translate=0.025, blur=0.5, contrast=0.15, noise=0.02),
    "speech": AugmentParams(prob=1.0, freq_masks=2, freq_mask_width=0.2, time_masks=2,
                            time_mask_width=0.05, time_warp=5, speed=0.1, noise=0.05),
}


def resolve(cfg: AugmentConfig) -> AugmentParams:
    """The preset's magnitudes with every knob that is not -1 put in."""
    base = PRESETS[cfg.preset]
    given = {f.name: getattr(cfg, f.name) for f in fields(AugmentParams)
             if getattr(cfg, f.name) != -1}
    if cfg.preset == "none" and "elastic" in given and "elastic_scale" not in given:
        given["elastic_scale"] = PRESETS["lines"].elastic_scale
    params = replace(base, **given)
    if params.elastic and not params.elastic_scale:
        raise ConfigError("augment.elastic needs augment.elastic_scale > 0 (the distance "
                          "between the displacement field's control points)")
    return params


def check_kind(params: AugmentParams, images: bool, source: str):
    """ConfigError when knobs of the other kind of data are on: image knobs on feature
    sequences or feature knobs on images (``source``: the training data, for the message)."""
    other = FEATURE_KEYS if images else IMAGE_KEYS
    wrong = [k for k in other if getattr(params, k)]
    if wrong:
        kind = "line images" if images else "feature sequences (1-D)"
        want = "images" if not images else "feature sequences"
        hint = ' (use augment.preset = "lines")' if images else \
            ' (use augment.preset = "speech")'
        raise ConfigError(f"augment.{wrong[0]} applies to {want}, but {source} holds {kind}"
                          f"{hint}")
