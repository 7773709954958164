"""On-the-fly training augmentation (the ``[augment]`` config section).

The workers (``compute.tasks.TaskComputer``) call an ``Augmenter`` on each training
sequence just before collation; nothing is stored. Line images get a random affine map,
elastic distortion, erosion/dilation, blur, contrast jitter and noise (``image``);
feature sequences get speed perturbation, SpecAugment's time warp, frequency and time
masks, and noise (``features``). ``params`` holds the presets; ``augmenter`` the
per-sequence draw, a function of (seed, epoch, sequence id) alone.
"""
from rnntrain.augment.augmenter import Augmenter, ImageGeometry
from rnntrain.augment.params import PRESETS, AugmentParams, resolve

__all__ = ["Augmenter", "ImageGeometry", "AugmentParams", "PRESETS", "resolve"]
