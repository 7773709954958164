"""Small 2-D (image) datasets for the OCR tests: glyph strings and RNNLIB-built files."""
from __future__ import annotations

from pathlib import Path

import netCDF4
import numpy as np

LABELS = ["a", "b", "c", "d"]


def glyphs(height: int = 8, seed: int = 7) -> dict[str, np.ndarray]:
    """One fixed random binary pattern (height, 3..5) per label."""
    rng = np.random.default_rng(seed)
    return {lb: (rng.random((height, int(rng.integers(3, 6)))) < 0.5).astype(np.float32)
            for lb in LABELS}


def glyph_images(n: int, seed: int, height: int = 8, max_labels: int = 4, noise: float = 0.05,
                 short_height: int = 0):
    """n images of 1..max_labels glyphs with 2-column gaps → (images (H_i, W_i), targets).
    short_height > 0: every third image is cropped to that height (tests height padding)."""
    g = glyphs(height)
    rng = np.random.default_rng(seed)
    images, targets = [], []
    for i in range(n):
        labs = [LABELS[int(k)] for k in rng.integers(0, len(LABELS), int(rng.integers(1, max_labels + 1)))]
        parts = [np.zeros((height, 2), np.float32)]
        for lb in labs:
            parts += [g[lb], np.zeros((height, 2), np.float32)]
        im = np.concatenate(parts, axis=1)
        im = np.clip(im + rng.normal(0, noise, im.shape), 0, 1).astype(np.float32)
        if short_height and i % 3 == 2:
            im = im[:short_height]
        images.append(im)
        targets.append(" ".join(labs))
    return images, targets


def write_rnnlib_way(path: Path, images_u8: list[np.ndarray], targets: list[str],
                     labels: list[str], fmt: str = "NETCDF4") -> Path:
    """Write a 2-D file exactly as RNNLIB's examples/arabic_offline_handwriting/
    arabic_offline.py does: seqDims = (height, width) from Pillow's size, seqLengths =
    height * width, and the pixels of image.transpose(FLIP_TOP_BOTTOM).transpose(ROTATE_270)
    in Pillow's getdata order, (value - mean) / std, plus its extra wordTargetStrings."""
    from PIL import Image
    mean, std = 226.8663, 81.62196
    dims, rows = [], []
    for a in images_u8:
        image = Image.fromarray(a)
        dims.append((image.size[1], image.size[0]))
        t = image.transpose(Image.FLIP_TOP_BOTTOM).transpose(Image.ROTATE_270)
        flat = np.asarray(t, dtype=np.float64).reshape(-1)  # getdata order: row-major
        rows.append(((flat - mean) / std).astype(np.float32))
    inputs = np.concatenate(rows)[:, None]

    def chars(strings):
        w = max(len(s) for s in strings) + 1
        out = np.zeros((len(strings), w), "S1")
        for i, s in enumerate(strings):
            out[i, :len(s)] = np.frombuffer(s.encode(), "S1") if s else out[i, :0]
        return out
    with netCDF4.Dataset(str(path), "w", format=fmt) as ds:
        ds.createDimension("numSeqs", len(images_u8))
        ds.createDimension("numTimesteps", len(inputs))
        ds.createDimension("inputPattSize", 1)
        ds.createDimension("numDims", 2)
        ds.createDimension("numLabels", len(labels))
        for name, strings in (("seqTags", [f"img{i}.tif" for i in range(len(images_u8))]),
                              ("labels", labels), ("wordTargetStrings", ["w"] * len(targets)),
                              ("targetStrings", targets)):
            c = chars(strings)
            ds.createDimension(f"max_{name}", c.shape[1])
            ds.createVariable(name, "S1", (ds.dimensions["numSeqs" if name != "labels"
                                                         else "numLabels"].name,
                                           f"max_{name}"))[:] = c
        ds.createVariable("seqLengths", "i4", ("numSeqs",))[:] = [h * w for h, w in dims]
        ds.createVariable("seqDims", "i4", ("numSeqs", "numDims"))[:] = np.array(dims)
        ds.createVariable("inputs", "f4", ("numTimesteps", "inputPattSize"))[:] = inputs
    return Path(path)
