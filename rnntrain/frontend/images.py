"""Images → pixels: one implementation for the converter (``rnntrain-data images``) and for
inference (``rnntrain transcribe``, ``rnntrain.load(...).transcribe``).

Pixels (PNG, JPEG, TIFF, anything Pillow opens): the EXIF orientation applied, grayscale
in [0, 1] (16-bit and float images scaled to their range; transparency composited on
white paper), then ink high and background 0 (``invert``: "auto" inverts images whose
median is light, i.e. dark text on a light background; "yes"; "no"), so that zero padding
is background. ``height`` > 0 rescales to that many pixels keeping the aspect ratio
(bilinear); 0 keeps the size.

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
    """How an image becomes pixels (saved in the file; ``prepare`` applies it)."""
    height: int = 0            # 0: keep each image's height
    invert: str = "auto"       # "auto", "yes", "no"

    def describe(self) -> dict:
        return {"height": self.height, "invert": self.invert, "scale": "0..1, ink high"}


def open_image(path: Path, where: str):
    """A Pillow image with its header read; UserError naming ``where`` otherwise."""
    Image, _, Unidentified = _pil()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{where}: image file not found" if path.exists() or not
                        os.path.lexists(path) else f"{where}: not a regular file")
    try:
        im = Image.open(path)
        im.size  # noqa: B018  (the header is read here)
        return im
    except (Unidentified, OSError, ValueError, SyntaxError) as e:
        # SyntaxError: Pillow's parsers raise it for some malformed headers
        raise UserError(f"{where}: cannot read as an image ({e})") from None


def target_size(size: tuple[int, int], height: int) -> tuple[int, int]:
    """(width, height) of an image after scaling to ``height`` (0: unchanged)."""
    w, h = size
    if not height or h == height:
        return w, h
    return max(1, round(w * height / h)), height


def pixels(im, settings: ImageSettings, where: str = "") -> np.ndarray:
    """A Pillow image → (H, W) float32 in [0, 1], ink high, scaled per ``settings``."""
    Image, ImageOps, _ = _pil()
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
    w, h = target_size((a.shape[1], a.shape[0]), settings.height)
    if (w, h) != (a.shape[1], a.shape[0]):
        a = np.asarray(Image.fromarray(a).resize((w, h), Image.BILINEAR),
                       dtype=np.float32)
    return np.clip(a, 0.0, 1.0)


def prepare(path, settings: ImageSettings) -> np.ndarray:
    """One image file → (H, W) pixels as the converter writes them."""
    with open_image(Path(path), str(path)) as im:
        return pixels(im, settings, str(path))


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

    def to_dict(self) -> dict:
        return {"height": self.height, "channels": self.channels, "layout": self.layout,
                "space": self.space,
                "settings": {"height": self.settings.height, "invert": self.settings.invert}}

    @classmethod
    def from_dict(cls, d: dict, where: str = "image front end") -> "ImageFrontEnd":
        try:
            s = d["settings"]
            fe = cls(ImageSettings(int(s["height"]), str(s["invert"])), int(d["height"]),
                     int(d.get("channels", 1)), str(d.get("layout", "2d")),
                     str(d.get("space", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: malformed image front-end record ({e})") from None
        if fe.settings.invert not in INVERT or fe.height < 1 or fe.channels < 1 or \
                fe.settings.height < 0 or fe.layout not in LAYOUTS:
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
            settings = ImageSettings(int(d.get("height", 0)), str(d.get("invert", "auto")))
            layout = str(d.get("layout", "2d"))
            space = str(d.get("space") or SPACE) if d.get("chars") else ""
        except (ValueError, TypeError, AttributeError) as e:
            raise UserError(f"{where}: malformed image_frontend record ({e})") from None
        size = int(ck["input_size"])
        channels = size // height if layout == "columns" else size
        return cls.from_dict({"height": height, "channels": max(channels, 1), "layout": layout,
                              "space": space, "settings": {"height": settings.height,
                                           "invert": settings.invert}}, where)
