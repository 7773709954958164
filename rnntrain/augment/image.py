"""Line-image augmentation: one random geometric map (affine + elastic) resampled in one
``scipy.ndimage.map_coordinates`` call, then erosion/dilation, blur, contrast and noise.
Vectorised over the pixels (no per-pixel Python); every draw comes from the generator
passed in, in a fixed order.

Pixels: (P, W, C) float32, the image in rows [0, H) of a canvas of the model's input
height P (zero below, as ``Dataset.load_chunk`` serves it), ink high and background 0.
The width W is the time axis: scaling and stretching change it (the output is
(P, W', C)); the height P never changes.
"""
from __future__ import annotations

import math

import numpy as np

from rnntrain.augment.params import AugmentParams

def _u(rng: np.random.Generator, a: float) -> float:
    """Uniform in [-a, a] (one draw even when a is 0: the draw order stays fixed)."""
    return float(rng.uniform(-1.0, 1.0)) * a


def output_width(width: int, height: int, p: AugmentParams, rng: np.random.Generator
                 ) -> tuple[int, np.ndarray, np.ndarray]:
    """Draw the affine map (one uniform draw each, in this order: rotation, shear, scale,
    stretch, vertical translation). → (W', A_inv (2, 2), offset (2,)): source (y, x) =
    A_inv @ (output (y, x)) + offset, for output columns 0..W'-1. The map is taken about
    the image's centre; the output's centre is the input's, moved down by the translation."""
    theta = math.radians(_u(rng, p.rotate))
    shear = _u(rng, p.shear)
    s = 1.0 + _u(rng, p.scale)
    sx = s * (1.0 + _u(rng, p.stretch))
    ty = _u(rng, p.translate) * height
    # the slant moves the top and bottom rows by +-shear*H/2: the width grows to keep them
    w_out = max(1, int(round(width * sx + abs(shear) * height * s)))
    c, si = math.cos(theta), math.sin(theta)
    rot = np.array([[c, -si], [si, c]])                  # in (y, x) coordinates
    sh = np.array([[1.0, 0.0], [shear, 1.0]])            # x += shear * y
    a = rot @ sh @ np.diag([s, sx])
    a_inv = np.linalg.inv(a)
    c_in = np.array([(height - 1) / 2.0, (width - 1) / 2.0])
    c_out = np.array([(height - 1) / 2.0 + ty, (w_out - 1) / 2.0])
    return w_out, a_inv, c_in - a_inv @ c_out


def _cells(n: int, spacing: float) -> tuple[np.ndarray, np.ndarray]:
    """Pixel i lies between control points k = floor(i / spacing) and k + 1, at fraction
    f: → (k (n,), f (n,))."""
    pos = np.arange(n) / spacing
    k = np.floor(pos).astype(np.int64)
    return k, pos - k


def elastic_field(h: int, w: int, spacing: float, rng: np.random.Generator) -> np.ndarray:
    """A smooth random displacement field (2, h, w): unit normal (dy, dx) on control points
    ``spacing`` pixels apart, interpolated bilinearly (elementwise: no BLAS, whose thread
    split could change the bits)."""
    ky, fy = _cells(h, spacing)
    kx, fx = _cells(w, spacing)
    g = rng.standard_normal((2, ky[-1] + 2, kx[-1] + 2))
    fy, fx = fy[:, None], fx[None, :]
    a, b = g[:, ky][:, :, kx], g[:, ky][:, :, kx + 1]
    c, d = g[:, ky + 1][:, :, kx], g[:, ky + 1][:, :, kx + 1]
    return (a * (1 - fx) + b * fx) * (1 - fy) + (c * (1 - fx) + d * fx) * fy


def augment_image(img: np.ndarray, height: int, p: AugmentParams,
                  rng: np.random.Generator) -> np.ndarray:
    """img (P, W, C) float32 with the image in rows [0, height) → (P, W', C) float32."""
    # imported here, not at the top: scipy.ndimage takes ~0.5 s to import, and a training
    # without image augmentation (audio, un-augmented lines) never needs it
    from scipy import ndimage
    P, W, C = img.shape
    w_out, a_inv, off = output_width(W, height, p, rng)
    ys, xs = np.mgrid[0:P, 0:w_out].astype(np.float64)
    src = np.stack([a_inv[0, 0] * ys + a_inv[0, 1] * xs + off[0],   # elementwise, no BLAS
                    a_inv[1, 0] * ys + a_inv[1, 1] * xs + off[1]])
    if p.elastic:  # a smooth random displacement field, ~elastic pixels
        src += elastic_field(P, w_out, p.elastic_scale, rng) * p.elastic
    out = np.empty((P, w_out, C), np.float32)
    for ch in range(C):  # channels: 1 for grey lines
        out[:, :, ch] = ndimage.map_coordinates(img[:, :, ch], src, order=1, mode="constant",
                                                cval=0.0)
    if p.morph >= 2 and rng.uniform() < 0.5:  # erosion or dilation, half the time
        k = int(rng.integers(2, p.morph + 1))
        op = ndimage.grey_dilation if rng.uniform() < 0.5 else ndimage.grey_erosion
        out = op(out, size=(k, k, 1))
    if p.blur:
        sigma = float(rng.uniform(0.0, p.blur))
        if sigma > 0.25:  # below that the 3-tap kernel is nearly the identity
            out = ndimage.gaussian_filter(out, (sigma, sigma, 0), mode="constant")
    if p.contrast:  # background to b, ink to a: x -> b + (a - b) x
        ink = 1.0 - float(rng.uniform(0.0, p.contrast))
        bg = float(rng.uniform(0.0, p.contrast / 2))
        out = out * np.float32(ink - bg) + np.float32(bg)
    if p.noise:
        out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(p.noise)
    return out
