"""PAGE-XML and ALTO pages: their text lines (polygon, baseline, text) and the line images
cut from the page scan. Read by ``rnntrain-data pagexml`` (ground truth: the lines become
a NetCDF file) and by ``rnntrain transcribe`` (the lines are read and the page is written
back with their text: ``rnntrain.infer.pagexml``).

Formats (read by element names, any namespace version):
- PAGE (PRImA's 2013-07-15 and 2019-07-15 schemas, and the older ones): every
  ``TextLine`` with its ``Coords`` (``points="x,y x,y ..."``, or ``Point`` children) and
  its own ``TextEquiv/Unicode`` (the lowest ``@index`` when there are several; region and
  word TextEquivs are not used); ``Baseline`` when present. The page image:
  ``Page/@imageFilename``.
- ALTO (v2 to v4, ``MeasurementUnit`` pixel): every ``TextLine``, its box (``HPOS``,
  ``VPOS``, ``WIDTH``, ``HEIGHT``) or ``Shape/Polygon``, its text the ``String/@CONTENT``s
  joined at the ``SP`` elements (without any: where the page shows a gap between two
  Strings), a ``HYP`` appended; ``BASELINE`` as points (v4) when given.
  The page image: ``Description/sourceImageInformation/fileName``.

Cropping: the bounding box of the line's polygon, widened by ``--padding`` pixels and
clipped to the page; with ``--crop polygon`` (default) the page outside the polygon
(widened by the padding) is blanked to the paper's grey (the page's median), so parts of
the lines above and below do not leak in. The line is then straightened no further than a
rotation: by the angle of its baseline (first to last point), when it has one. Then the
line geometry of ``images`` (trim, height) applies.

The page image path: as the XML gives it, relative to the XML file's folder, or to the
folder above it (OCR-D workspaces keep the XML in a file-group folder and name images
relative to the workspace), or under ``--image-dir`` (there also by file name alone); a
path that leads outside that folder (``..``, a link) or an absolute path is refused
unless ``--image-dir`` is given (then the file name is looked up there), so a page never
reads an image from a place the user did not name. ``--image FILE`` gives the image of a
single page whose XML names none.

Errors name the XML file and the line (``TextLine tl_3``). Lines without text (no
TextEquiv, or an empty one) are not ground truth: they are left out, counted in a note.
"""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError
from rnntrain.frontend.images import ImageSettings, open_image, pixels



def local(tag) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def kids(el, name: str) -> list:
    return [c for c in el if local(c.tag) == name]


def kid(el, name: str):
    for c in el:
        if local(c.tag) == name:
            return c
    return None


@dataclass
class PageLine:
    """One text line of a page."""
    id: str
    polygon: np.ndarray          # (K, 2) float x, y in page pixels
    baseline: np.ndarray | None  # (M, 2) or None
    text: str

    def box(self, padding: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
        """(left, top, right, bottom), half-open, of the polygon widened by ``padding``
        and clipped to the page (width, height)."""
        x0, y0 = np.floor(self.polygon.min(0)).astype(int) - padding
        x1, y1 = np.ceil(self.polygon.max(0)).astype(int) + padding
        w, h = size
        return max(int(x0), 0), max(int(y0), 0), min(int(x1), w), min(int(y1), h)

    def angle(self) -> float:
        """The baseline's angle in degrees (image coordinates, y down), 0 without one."""
        if self.baseline is None or len(self.baseline) < 2:
            return 0.0
        (xa, ya), (xb, yb) = self.baseline[0], self.baseline[-1]
        if xb == xa and yb == ya:
            return 0.0
        return math.degrees(math.atan2(yb - ya, xb - xa))


@dataclass
class Page:
    xml: Path
    image: str                   # as the XML names it ("" when it names none)
    lines: list[PageLine] = field(default_factory=list)
    empty: int = 0               # lines without text (left out)
    size: tuple[int, int] | None = None  # (width, height) the XML declares
    kind: str = "PAGE"           # "PAGE" or "ALTO"


def parse_points(text: str, where: str) -> np.ndarray:
    """'x,y x,y ...' (PAGE; ALTO also 'x y x y ...') → (K, 2) float."""
    try:
        nums = [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"{where}: points {text[:60]!r} are not 'x,y x,y ...'") from None
    if len(nums) < 4 or len(nums) % 2 or not all(math.isfinite(v) for v in nums):
        raise UserError(f"{where}: points {text[:60]!r} are not 'x,y x,y ...' (two or more "
                        "points)")
    return np.asarray(nums, np.float64).reshape(-1, 2)


def read_xml(path: Path):
    from rnntrain.fsutil import read_bytes
    data = read_bytes(path, "XML file")
    try:
        return ET.fromstring(data)
    except ET.ParseError as e:
        raise UserError(f"{path}: not well-formed XML ({e})") from None


def parse_page(path, with_empty: bool = False) -> Page:
    """A PAGE or ALTO file → its page image name and text lines (``with_empty``: PAGE
    lines without text too, with text "": lines to transcribe)."""
    path = Path(path)
    root = read_xml(path)
    kind = local(root.tag)
    if kind == "PcGts":
        return _parse_page_xml(path, root, with_empty)
    if kind.lower() == "alto":
        return _parse_alto(path, root)
    raise UserError(f"{path}: neither PAGE-XML (PcGts) nor ALTO (alto) but <{kind}>")


def page_points(el, where: str) -> np.ndarray | None:
    if el is None:
        return None
    if el.get("points") is not None:
        return parse_points(el.get("points"), where)
    pts = [(p.get("x"), p.get("y")) for p in kids(el, "Point")]   # PAGE 2009/2010
    if not pts:
        return None
    return parse_points(" ".join(f"{x},{y}" for x, y in pts), where)


def _line_text(line) -> str | None:
    eqs = kids(line, "TextEquiv")
    if not eqs:
        return None

    def order(e):
        try:
            return int(e.get("index", 0))
        except ValueError:
            return 0
    u = kid(min(eqs, key=order), "Unicode")
    return (u.text or "") if u is not None else None


def text_lines(path: Path, root, id_attr: str):
    """→ (id, where, element) of every TextLine under ``root`` in document order (PAGE's
    ``id``, ALTO's ``ID``; ``#n`` for a line without one); an id used twice is an error."""
    seen = set()
    for n, line in enumerate((e for e in root.iter() if local(e.tag) == "TextLine"), 1):
        lid = line.get(id_attr) or f"#{n}"
        where = f"{path} TextLine {lid}"
        if lid in seen:
            raise UserError(f"{where}: the {id_attr} is used twice")
        seen.add(lid)
        yield lid, where, line


def _parse_page_xml(path: Path, root, with_empty: bool = False) -> Page:
    page_el = kid(root, "Page")
    if page_el is None:
        raise UserError(f"{path}: PAGE-XML without a Page element")
    page = Page(path, page_el.get("imageFilename", ""))
    try:
        page.size = (int(page_el.get("imageWidth")), int(page_el.get("imageHeight")))
    except (TypeError, ValueError):
        page.size = None
    for lid, where, line in text_lines(path, page_el, "id"):
        text = _line_text(line)
        if not text or not text.strip():
            page.empty += 1
            if not with_empty:
                continue
            text = ""
        poly = page_points(kid(line, "Coords"), f"{where} Coords")
        if poly is None:
            raise UserError(f"{where}: no Coords (the line's polygon)")
        base = page_points(kid(line, "Baseline"), f"{where} Baseline")
        page.lines.append(PageLine(lid, poly, base, text))
    return page


def _num(el, name: str, where: str) -> float:
    v = el.get(name)
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {name} {v!r} is not a number") from None
    if not math.isfinite(x):
        raise UserError(f"{where}: {name} {v!r} is not a number")
    return x


def _parse_alto(path: Path, root) -> Page:
    desc = kid(root, "Description")
    unit = kid(desc, "MeasurementUnit") if desc is not None else None
    if unit is not None and (unit.text or "").strip() not in ("pixel", ""):
        raise UserError(f"{path}: MeasurementUnit {unit.text.strip()!r}: only pixel "
                        "coordinates are read")
    name = ""
    if desc is not None:
        src = kid(desc, "sourceImageInformation")
        fn = kid(src, "fileName") if src is not None else None
        name = (fn.text or "").strip() if fn is not None else ""
    page = Page(path, name, kind="ALTO")
    layout = kid(root, "Layout")
    pg = kid(layout, "Page") if layout is not None else None
    if pg is not None:
        try:
            page.size = (int(float(pg.get("WIDTH"))), int(float(pg.get("HEIGHT"))))
        except (TypeError, ValueError):
            page.size = None
    for lid, where, line in text_lines(path, root, "ID"):
        text = _alto_text(line, where)
        if not text.strip():
            page.empty += 1
            continue
        shape = kid(line, "Shape")
        poly_el = None
        if shape is not None:
            poly_el = kid(shape, "Polygon")
        if poly_el is not None and poly_el.get("POINTS"):
            poly = parse_points(poly_el.get("POINTS"), f"{where} Polygon")
        else:
            x, y = _num(line, "HPOS", where), _num(line, "VPOS", where)
            w, h = _num(line, "WIDTH", where), _num(line, "HEIGHT", where)
            poly = np.array([[x, y], [x + w, y], [x + w, y + h], [x, y + h]], np.float64)
        bl = line.get("BASELINE", "")
        base = parse_points(bl, f"{where} BASELINE") if len(bl.replace(",", " ").split()) >= 4 \
            else None
        page.lines.append(PageLine(lid, poly, base, text))
    return page


def _alto_text(line, where: str) -> str:
    """A TextLine's Strings joined: at its SP elements when it has any, else where the
    page shows a gap (more than 15 % of the string height) between two Strings (ALTO
    writers that leave SP out: punctuation is often a String of its own)."""
    parts = [c for c in line if local(c.tag) in ("String", "SP", "HYP")]
    has_sp = any(local(c.tag) == "SP" for c in parts)
    text, prev_end = "", None
    for c in parts:
        t = local(c.tag)
        if t == "SP":
            text += " " if text and not text.endswith(" ") else ""
        elif t == "HYP":
            text += c.get("CONTENT", "")
        else:
            if text and not has_sp and not text.endswith(" "):
                try:
                    x, h = float(c.get("HPOS")), float(c.get("HEIGHT") or 0)
                    gap = x - prev_end if prev_end is not None else 1e9
                except (TypeError, ValueError):
                    gap, h = 1e9, 0.0
                if gap > max(2.0, 0.15 * h):
                    text += " "
            text += c.get("CONTENT", "")
            try:
                prev_end = float(c.get("HPOS")) + float(c.get("WIDTH"))
            except (TypeError, ValueError):
                prev_end = None
    return text


# ---------------------------------------------------------------- page images


def _inside(p: Path, base: Path) -> bool:
    rp, rb = os.path.realpath(p), os.path.realpath(base)
    return rp == rb or rp.startswith(rb.rstrip(os.sep) + os.sep)


def page_image(page: Page, image_dir: str | None = None, image: str | None = None) -> Path:
    """The page image's path (see the module doc); one line naming the XML otherwise."""
    xml = page.xml
    attr = "sourceImageInformation/fileName" if page.kind == "ALTO" else "Page/@imageFilename"
    if image:
        return Path(image)
    name = page.image.strip()
    if not name:
        raise UserError(f"{xml}: the XML names no page image ({attr}); give --image FILE")
    if name.startswith("file://"):
        name = name[len("file://"):]
    if "://" in name:
        raise UserError(f"{xml}: {attr} {name!r} is a URL; download the image and give "
                        "--image-dir")
    p = Path(name)
    if image_dir:
        base = Path(image_dir)
        cands = ([base / p] if not p.is_absolute() else []) + [base / p.name]
        for c in cands:
            if c.is_file() and _inside(c, base):
                return c
        raise UserError(f"{xml}: page image {name!r} not found under --image-dir {base}")
    if p.is_absolute():
        raise UserError(f"{xml}: {attr} {name!r} is an absolute path; give --image-dir "
                        "(the image is then looked up there by its file name)")
    looked = []
    for base in (xml.parent, xml.parent.parent):
        c = base / p
        if not _inside(c, base):
            raise UserError(f"{xml}: {attr} {name!r} leads outside {base}; give --image-dir")
        if c.is_file():
            return c
        looked.append(str(base))
    raise UserError(f"{xml}: page image {name!r} not found (looked in {' and '.join(looked)});"
                    " give --image-dir")


class PageCache:
    """The last page image read, as (H, W) float32 grey in [0, 1] (paper light)."""

    def __init__(self):
        self.path: Path | None = None
        self.grey: np.ndarray | None = None
        self.paper = 1.0

    def get(self, path: Path, where: str) -> np.ndarray:
        if self.path != path:
            self.grey = None
            with open_image(path, where) as im:
                self.grey = pixels(im, ImageSettings(0, "no", -1), where)
            self.path, self.paper = path, float(np.median(self.grey))
        return self.grey


def crop_line(grey: np.ndarray, paper: float, line: PageLine, padding: int,
              polygon: bool, where: str):
    """The line cut from the page: (left, top, right, bottom) and a Pillow "F" image of
    the crop (paper light), blanked outside the polygon and rotated to the baseline."""
    from PIL import Image, ImageDraw, ImageFilter
    h, w = grey.shape
    x0, y0, x1, y1 = line.box(padding, (w, h))
    if x1 - x0 < 1 or y1 - y0 < 1:
        raise UserError(f"{where}: the polygon lies outside the page image ({w} x {h})")
    a = grey[y0:y1, x0:x1].copy()
    if polygon:
        mask = Image.new("L", (x1 - x0, y1 - y0), 0)
        ImageDraw.Draw(mask).polygon([(float(x) - x0, float(y) - y0) for x, y in line.polygon],
                                     fill=255, outline=255)
        if padding:
            mask = mask.filter(ImageFilter.MaxFilter(2 * padding + 1))
        a[np.asarray(mask) == 0] = paper
    im = Image.fromarray(a, "F")
    angle = line.angle()
    if abs(angle) > 0.05:
        im = im.rotate(angle, resample=Image.BILINEAR, expand=True, fillcolor=paper)
    return (x0, y0, x1, y1), im
