"""``rnntrain-data images``: text-line images listed in a LIST.tsv → RNNLIB NetCDF.

LIST.tsv: one image per line, ``path<TAB>transcript``; relative paths are relative to the
list's folder; blank lines and lines starting with ``#`` are skipped. The transcript is
a space-separated list of label names, or with ``--chars`` plain text: normalised to
Unicode NFC, runs of whitespace made one space, then split into characters. Character
label names are the character itself for printable ASCII, ``--space`` (default
``<space>``) for the space and ``U+XXXX`` for everything else, so that every name is
ASCII without whitespace: RNNLIB reads targets as space-separated names from fixed-width
char arrays.

Pixels (PNG, JPEG, TIFF, anything Pillow opens): grayscale in [0, 1] with ink high and
background 0 (``--invert auto`` inverts images whose median is light, i.e. dark text on a
light background), so that zero padding is background. ``--height H`` rescales every
image to H pixels keeping the aspect ratio (bilinear); 0 keeps the sizes. The preparation
is ``rnntrain.frontend.images``, the one ``rnntrain transcribe`` applies to new images.

Layouts: ``2d`` (default) writes RNNLIB's 2-D layout (numDims = 2, seqDims = height,
width, pixels column-major, readable by RNNLIB; see ``rnntrain.data.ncdata``);
``columns`` writes 1-D frames, one per image column of H pixels (needs one height for all
images), with the attribute ``imageHeight = H``. Either trains the same model. The
converter's settings are stored as the JSON attribute ``rnntrain_images`` (inference
prepares new images with them).

Two passes over the list (sizes from the image headers, then pixels), one image in memory
at a time.
"""
from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from .audio import list_lines
from rnntrain.data import ncdata
from rnntrain.errors import UserError
# the image preparation lives in the front end, shared with transcribe; prepare and
# pixels stay importable from here (bench/ocr.py and users' scripts)
from rnntrain.frontend.images import SPACE, ImageSettings, char_label, label_char, \
    open_image, pixels, prepare, target_size  # noqa: F401


@dataclass
class Item:
    line: int
    path: Path
    text: str


def read_list(list_path) -> list[Item]:
    from rnntrain.fsutil import read_text
    lp = Path(list_path)
    out = [Item(n, path, text) for n, path, text in
           list_lines(lp, read_text(lp, "list file"))]
    if not out:
        raise UserError(f"{lp}: no images listed")
    return out


def ascii_alphabet(space: str = SPACE) -> list[str]:
    """``--alphabet ascii``: the space, then the printable ASCII characters in code order."""
    return [space] + [chr(c) for c in range(33, 127)]


def text_labels(text: str, space: str = SPACE) -> list[str]:
    """Plain text → label names: NFC, whitespace runs → one space, stripped."""
    text = " ".join(unicodedata.normalize("NFC", text).split())
    return [char_label(c, space) for c in text]


def convert_images(list_path, out, settings: ImageSettings, chars: bool = False,
                   space: str = SPACE, labels: list[str] | None = None, layout: str = "2d",
                   fmt: str = "NETCDF3_64BIT_OFFSET", progress: bool = True) -> dict:
    """Convert the listed images into ``out``; returns a summary dict."""
    from tqdm import tqdm
    if layout not in ("2d", "columns"):
        raise UserError(f"--layout {layout!r}: choose 2d or columns")
    if settings.invert not in ("auto", "yes", "no"):
        raise UserError(f"--invert {settings.invert!r}: choose auto, yes or no")
    if settings.height < 0:
        raise UserError(f"--height {settings.height} must be >= 0")
    if chars and (not space or space.split() != [space]):
        raise UserError(f"--space {space!r}: give a label name without whitespace")
    items = read_list(list_path)
    targets = [text_labels(it.text, space) if chars else it.text.split() for it in items]
    if labels is None:
        labels = sorted({t for tg in targets for t in tg})
        if not labels:
            raise UserError(f"{list_path}: every transcript is empty; give --labels")
    index = set(labels)
    for it, tg in zip(items, targets):
        bad = [t for t in tg if t not in index]
        if bad:
            shown = f"{label_char(bad[0], space)!r} (label {bad[0]})" if chars else repr(bad[0])
            raise UserError(f"{list_path} line {it.line}: {it.path}: {shown} is not in the "
                            f"alphabet ({len(labels)} labels)")
    # pass 1: sizes from the headers (no pixels decoded)
    sizes = []
    for it in items:
        where = f"{list_path} line {it.line}: {it.path}"
        with open_image(it.path, where) as im:
            sizes.append(target_size(im.size, settings.height))
    widths = [w for w, _ in sizes]
    heights = [h for _, h in sizes]
    attrs = {"rnntrain_images": json.dumps({**settings.describe(), "layout": layout,
                                            "chars": chars, "space": space})}
    if layout == "columns":
        if len(set(heights)) != 1:
            i = next(k for k, h in enumerate(heights) if h != heights[0])
            raise UserError(f"{list_path} line {items[i].line}: {items[i].path}: height "
                            f"{heights[i]} differs from the first image's {heights[0]}; "
                            "--layout columns needs one height (give --height)")
        attrs["imageHeight"] = heights[0]
    tags = [str(it.path.name) for it in items]
    bar = dict(unit="image", disable=not progress or None, leave=False)
    with ncdata.NcWriter(out, labels, heights[0] if layout == "columns" else 1, widths,
                         [" ".join(t) for t in targets], tags, fmt,
                         heights=heights if layout == "2d" else None, attrs=attrs) as w:
        for it, (wd, ht) in zip(tqdm(items, desc="images", **bar), sizes):
            where = f"{list_path} line {it.line}: {it.path}"
            with open_image(it.path, where) as im:
                a = pixels(im, settings, where)
            if a.shape != (ht, wd):
                raise UserError(f"{where}: changed while converting")
            w.append(ncdata.image_rows(a) if layout == "2d" else a.T)
    return {"images": len(items), "labels": len(labels), "columns": int(sum(widths)),
            "heights": (min(heights), max(heights))}


def settings_of(path) -> ImageSettings | None:
    """The converter settings stored in a file written by ``convert_images`` (or None)."""
    with ncdata.NC_LOCK, ncdata._open(str(path)) as ds:
        if "rnntrain_images" not in ds.ncattrs():
            return None
        d = json.loads(ds.getncattr("rnntrain_images"))
    return ImageSettings(int(d.get("height", 0)), str(d.get("invert", "auto")))


def labels_from(path) -> list[str]:
    """The alphabet of an existing RNNLIB file (``--labels-from``)."""
    return list(ncdata.read_header(path).labels)
