"""Images → pixels: one implementation for the converter (``rnntrain-data images``) and for
inference (``rnntrain transcribe``, ``rnntrain.load(...).transcribe``).

Pixels (PNG, JPEG, TIFF, anything Pillow opens): the EXIF orientation applied, grayscale
in [0, 1] (16-bit and float images scaled to their range; transparency composited on
white paper), then ink high and background 0 (``invert``: "auto" inverts images whose
median is light, i.e. dark text on a light background; "yes"; "no"), so that zero padding
is background. Line geometry: ``trim`` >= 0 crops the image to its ink (the rows and
columns holding a pixel darker than halfway between the paper and the ink, so a loosely
cropped line reads like a tightly cropped one) and keeps ``trim`` pixels of background on
every side; ``height`` > 0 rescales to that many pixels keeping the aspect ratio
(bilinear; with trimming the ink is scaled to ``height - 2 * trim`` and then padded, so
every prepared line is exactly ``height`` high); 0 keeps the size. The converter's default
is kraken's and Calamari's line height, ``DEFAULT_HEIGHT`` = 48, margins kept (trimming,
e.g. ``DEFAULT_TRIM`` = 4, is an option: on tightly cropped scans it slowed learning,
docs/accuracy.md).
``LineGeometry`` maps a prepared column (or model frame) back to the original image's
pixel columns.

Images are refused, one line naming the file, when they are larger than Pillow's
decompression-bomb limit (``MAX_PIXELS``, read from the header before any pixel is
decoded) or hold several pages/frames (a multi-page TIFF, an animated GIF): a line image
is one picture.

``ImageFrontEnd`` is what a model trained on converted images needs to prepare a new
image exactly as its training file holds it: the converter's settings (the NetCDF
attribute ``rnntrain_images``, copied into checkpoints as ``image_frontend``), the
model's input height P (images are zero-padded below to P, as ``Dataset.load_chunk``
serves 2-D files) and the layout. The model's frame is one image column, top to bottom.

Pillow is imported only when an image is read: it is the ``images`` extra.

Shapes: pixels (H, W) float32; column frames (W, P·C).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp", ".pgm",
                  ".ppm", ".pbm", ".pnm"}
INVERT = ("auto", "yes", "no")
LAYOUTS = ("2d", "columns")
SPACE = "<space>"
DEFAULT_HEIGHT = 48        # kraken's and Calamari's line height
DEFAULT_TRIM = 4           # --trim's suggested padding around the ink (trimming is opt-in)
MAX_PIXELS = 89_478_485    # Pillow's Image.MAX_IMAGE_PIXELS (its bomb warning threshold)


def char_label(ch: str, space: str = SPACE) -> str:
    """One character's label name: itself (printable ASCII), ``space``, or U+XXXX."""
    if ch == " ":
        return space
    if "!" <= ch <= "~":
        return ch
    return f"U+{ord(ch):04X}"


def label_char(name: str, space: str = SPACE) -> str:
    """The inverse of ``char_label`` (for printing transcriptions as text)."""
    if name == space:
        return " "
    if name.startswith("U+") and len(name) > 2:
        try:
            return chr(int(name[2:], 16))
        except ValueError:
            pass
    return name


def _pil():
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise UserError("reading images needs Pillow (pip install 'rnntrain[images]')") from None
    from PIL import Image, ImageOps, UnidentifiedImageError
    return Image, ImageOps, UnidentifiedImageError


@dataclass
class ImageSettings:
    """How an image becomes pixels (saved in the file; ``prepare`` applies it). The
    defaults are the neutral ones (files and checkpoints written before trimming existed
    read as they were); the converter's command line defaults to ``DEFAULT_HEIGHT`` and
    ``DEFAULT_TRIM``."""
    height: int = 0            # 0: keep each image's height; > 0: scale to it
    invert: str = "auto"       # "auto", "yes", "no"
    trim: int = -1             # -1: keep the margins; >= 0: crop to the ink, pad this much

    def describe(self) -> dict:
        d = {"height": self.height, "invert": self.invert, "scale": "0..1, ink high"}
        if self.trim >= 0:     # absent when off: files without trimming stay as they were
            d["trim"] = self.trim
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ImageSettings":
        """From ``describe()``'s dict (a file's or checkpoint's record)."""
        return cls(int(d.get("height", 0)), str(d.get("invert", "auto")),
                   int(d.get("trim", -1)))

    def check(self, where: str = "image settings"):
        if self.invert not in INVERT:
            raise UserError(f"{where}: invert {self.invert!r}: choose auto, yes or no")
        if self.height < 0:
            raise UserError(f"{where}: height {self.height} must be >= 0")
        if self.trim < -1 or (self.height and self.trim >= 0 and self.height - 2 * self.trim < 2):
            raise UserError(f"{where}: trim padding {self.trim} leaves no room for the ink "
                            f"in {self.height} px (give a padding below {self.height // 2})")


@dataclass(frozen=True)
class LineGeometry:
    """Where a prepared line's columns come from in the original image (after its EXIF
    orientation): prepared column c (of the ``width`` prepared columns) covers original
    columns ``x0 + (c - pad) / scale`` up to ``x0 + (c + 1 - pad) / scale``."""
    x0: int                    # first original column kept (the ink's left edge, or 0)
    scale: float               # prepared pixels per original pixel
    pad: int                   # background columns added left of the ink
    width: int                 # prepared columns
    original_width: int        # columns of the original image

    def column_to_pixel(self, c: float) -> float:
        """A prepared column position (may be fractional) → original pixel column,
        clipped to the image."""
        x = self.x0 + (c - self.pad) / self.scale
        return float(min(max(x, 0.0), self.original_width))

    def frame_to_pixels(self, frame: int, subsample: int) -> tuple[float, float]:
        """Model output frame ``frame`` of a model that pools ``subsample`` columns into
        one frame → the original image's (start, end) pixel columns it covers."""
        return (self.column_to_pixel(frame * subsample),
                self.column_to_pixel((frame + 1) * subsample))


def open_image(path: Path, where: str):
    """A Pillow image with its header read; UserError naming ``where`` otherwise."""
    Image, _, Unidentified = _pil()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{where}: image file not found" if path.exists() or not
                        os.path.lexists(path) else f"{where}: not a regular file")
    try:
        im = Image.open(path)
        w, h = im.size  # the header is read here, no pixels yet
    except Image.DecompressionBombError as e:
        raise UserError(f"{where}: refused, a decompression bomb ({e})") from None
    except (Unidentified, OSError, ValueError, SyntaxError) as e:
        # SyntaxError: Pillow's parsers raise it for some malformed headers
        raise UserError(f"{where}: cannot read as an image ({e})") from None
    try:
        check_size(w, h, where)
        try:
            frames = int(getattr(im, "n_frames", 1))
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise UserError(f"{where}: cannot read as an image ({e})") from None
        if frames > 1:
            raise UserError(f"{where}: a multi-page image ({frames} pages or frames); give "
                            "one line image per file (split it first, e.g. with tiffsplit)")
    except BaseException:
        im.close()
        raise
    return im


def check_size(w: int, h: int, where: str):
    """Refuse an image of more than ``MAX_PIXELS`` pixels before decoding it."""
    if w * h > MAX_PIXELS:
        raise UserError(f"{where}: refused, {w} x {h} = {w * h:,} pixels is more than "
                        f"{MAX_PIXELS:,} (a decompression bomb or not a line image)")


def target_size(size: tuple[int, int], height: int) -> tuple[int, int]:
    """(width, height) of an image after scaling to ``height`` (0: unchanged)."""
    w, h = size
    if not height or h == height:
        return w, h
    return max(1, round(w * height / h)), height


def ink_box(a: np.ndarray) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) (half-open) of the rows and columns holding ink in
    (H, W) pixels with ink high: a pixel is ink above halfway between the paper (the
    median) and the ink (the 99.9th percentile); None for an empty page (no contrast)."""
    paper = float(np.median(a))
    ink = float(np.percentile(a, 99.9))
    if ink - paper < 0.1:
        return None
    mask = a > paper + 0.5 * (ink - paper)
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def geometry(a: np.ndarray, settings: ImageSettings) -> tuple[np.ndarray, LineGeometry]:
    """(H, W) pixels in [0, 1], ink high → the line as ``settings`` shape it (trimmed,
    scaled, padded) and where its columns come from."""
    Image = _pil()[0]
    h0, w0 = a.shape
    x0, pad = 0, 0
    if settings.trim >= 0:
        box = ink_box(a)
        if box is not None:
            top, bottom, x0, right = box
            a = a[top:bottom, x0:right]
        pad = settings.trim
    inner = settings.height - 2 * pad if settings.height else 0
    w, h = target_size((a.shape[1], a.shape[0]), inner)
    scale = w / a.shape[1]
    if (w, h) != (a.shape[1], a.shape[0]):
        a = np.asarray(Image.fromarray(np.ascontiguousarray(a)).resize((w, h), Image.BILINEAR),
                       dtype=np.float32)
    if pad:
        a = np.pad(a, pad)
    return a, LineGeometry(x0, scale, pad, a.shape[1], w0)


def pixels(im, settings: ImageSettings, where: str = "") -> np.ndarray:
    """A Pillow image → (H, W) float32 in [0, 1], ink high, shaped per ``settings``."""
    return pixels_geometry(im, settings, where)[0]


def pixels_geometry(im, settings: ImageSettings,
                    where: str = "") -> tuple[np.ndarray, LineGeometry]:
    """``pixels`` and the ``LineGeometry`` that maps its columns to ``im``'s."""
    Image, ImageOps, _ = _pil()
    check_size(*im.size, where)
    try:
        im = ImageOps.exif_transpose(im)
        if im.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
            a = np.asarray(im.convert("F" if im.mode != "F" else im.mode), dtype=np.float32)
            top = 65535.0 if im.mode.startswith("I;16") else max(float(a.max()), 1.0)
            a = a / top
        else:
            if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                bg = Image.new("RGBA", im.size, (255, 255, 255, 255))  # transparent = paper
                im = Image.alpha_composite(bg, im.convert("RGBA"))
            a = np.asarray(im.convert("L"), dtype=np.float32) / 255.0
    except (OSError, ValueError, SyntaxError) as e:
        # a header that reads but data that does not (truncated or corrupt file)
        raise UserError(f"{where}: cannot decode the image ({e})") from None
    inv = settings.invert == "yes" or (settings.invert == "auto" and np.median(a) > 0.5)
    if inv:
        a = 1.0 - a
    a, geo = geometry(a, settings)
    return np.clip(a, 0.0, 1.0), geo


def prepare(path, settings: ImageSettings) -> np.ndarray:
    """One image file → (H, W) pixels as the converter writes them."""
    return prepare_geometry(path, settings)[0]


def prepare_geometry(path, settings: ImageSettings) -> tuple[np.ndarray, LineGeometry]:
    """One image file → (H, W) pixels and the ``LineGeometry`` of its columns."""
    with open_image(Path(path), str(path)) as im:
        return pixels_geometry(im, settings, str(path))


@dataclass(frozen=True)
class ImageFrontEnd:
    """A model's image input: converter settings, input height P, channels C, layout."""
    settings: ImageSettings
    height: int                # P: the model's pixels per column (images padded to it)
    channels: int = 1          # values per pixel (grayscale: 1)
    layout: str = "2d"         # how the training file stored the images
    space: str = ""            # labels are characters (converted with --chars): the label
                               # that stands for the space; "" when labels are not characters

    def text(self, labels: list[str]) -> str | None:
        """Label names → the text they spell, when labels are characters; else None."""
        if not self.space:
            return None
        return "".join(label_char(name, self.space) for name in labels)

    @property
    def frame_size(self) -> int:
        return self.height * self.channels

    def describe(self) -> str:
        s = self.settings
        h = f"scaled to {s.height} px high" if s.height else "kept at their height"
        if s.trim >= 0:
            h = f"trimmed to the ink (pad {s.trim} px), {h}"
        return (f"images {h}, padded to {self.height} px, invert {s.invert}, "
                f"layout {self.layout}")

    def columns(self, a: np.ndarray, where: str) -> np.ndarray:
        """(H, W) pixels → (W, P) column frames, zero below the image (as decode serves a
        2-D file's images: ``ncdata.columns``)."""
        if self.channels != 1:
            raise UserError(f"{where}: the model takes {self.channels} values per pixel; "
                            "image files give grayscale (1)")
        h, w = a.shape
        if h > self.height:
            raise UserError(f"{where}: image height {h} exceeds the model's input height "
                            f"{self.height} (its converter kept heights: scale the image to "
                            f"at most {self.height} px)")
        out = np.zeros((w, self.height), np.float32)
        out[:, :h] = a.T
        return out

    def file_frames(self, path) -> np.ndarray:
        """An image file → (W, P) float32 column frames, the model's input."""
        return self.columns(prepare(path, self.settings), str(path))

    def file_frames_geometry(self, path) -> tuple[np.ndarray, LineGeometry]:
        """``file_frames`` and the ``LineGeometry`` mapping its frames (columns) to the
        original image's pixel columns (``LineGeometry.frame_to_pixels``)."""
        a, geo = prepare_geometry(path, self.settings)
        return self.columns(a, str(path)), geo

    def to_dict(self) -> dict:
        s = {"height": self.settings.height, "invert": self.settings.invert}
        if self.settings.trim >= 0:
            s["trim"] = self.settings.trim
        return {"height": self.height, "channels": self.channels, "layout": self.layout,
                "space": self.space, "settings": s}

    @classmethod
    def from_dict(cls, d: dict, where: str = "image front end") -> "ImageFrontEnd":
        try:
            s = d["settings"]
            fe = cls(ImageSettings(int(s["height"]), str(s["invert"]), int(s.get("trim", -1))),
                     int(d["height"]),
                     int(d.get("channels", 1)), str(d.get("layout", "2d")),
                     str(d.get("space", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: malformed image front-end record ({e})") from None
        if fe.settings.invert not in INVERT or fe.height < 1 or fe.channels < 1 or \
                fe.settings.height < 0 or fe.settings.trim < -1 or fe.layout not in LAYOUTS:
            raise UserError(f"{where}: image front-end record out of range ({d})")
        return fe

    @classmethod
    def from_checkpoint(cls, ck: dict, where: str) -> "ImageFrontEnd | None":
        """From a checkpoint's ``image_frontend`` (the converter's JSON attribute),
        ``image_height`` and ``input_size``; None when it was not trained on converted
        images (no converter record: how its pixels were made is unknown)."""
        text, height = ck.get("image_frontend") or "", int(ck.get("image_height") or 0)
        if not text or height < 1:
            return None
        try:
            d = json.loads(text)
            settings = ImageSettings.from_dict(d)
            layout = str(d.get("layout", "2d"))
            space = str(d.get("space") or SPACE) if d.get("chars") else ""
        except (ValueError, TypeError, AttributeError) as e:
            raise UserError(f"{where}: malformed image_frontend record ({e})") from None
        size = int(ck["input_size"])
        channels = size // height if layout == "columns" else size
        return cls.from_dict({"height": height, "channels": max(channels, 1), "layout": layout,
                              "space": space, "settings": settings.describe()}, where)
