"""PAGE-XML pages in ``rnntrain transcribe``: every text line cut from the page scan
(``rnntrain.frontend.pagexml``, as ``rnntrain-data pagexml`` cuts ground truth), and, with
``--page-out DIR``, the page written back with each line's hypothesis.

Written back: a copy of the input PAGE file in which every transcribed ``TextLine`` holds
one ``TextEquiv`` (``@index`` 1, ``@conf`` = the mean of the line's per-label
confidences, ``Unicode`` = the hypothesis' text) and, before it, one ``Word`` per
space-separated word of the hypothesis, each with a ``Glyph`` per character: their
``Coords`` are boxes from the label's start to its end column (the spans of ``transcribe``,
on the page) over the line polygon's vertical extent (axis-aligned: for a rotated line,
an approximation), their ``TextEquiv@conf`` the label's confidence (a word's: the mean of
its glyphs'). The line's former ``TextEquiv``s and ``Word``s are removed; the rest of the
document (regions, coordinates, metadata, unknown elements) is kept as it was.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rnntrain.errors import UserError
from rnntrain.frontend.pagexml import (PageCache, crop_line, kid, kids, local, page_image,
                                       page_points, parse_page, read_xml, text_lines)

PADDING = 0            # pixels around each line's polygon (rnntrain-data pagexml's default)


@dataclass
class Shifted:
    """A line crop's ``LineGeometry`` placed on the page: crop columns → page columns."""
    geometry: object      # frontend.images.LineGeometry of the crop
    x0: int               # the crop's left edge on the page

    def column_to_pixel(self, c: float) -> float:
        return self.x0 + self.geometry.column_to_pixel(c)


def page_items(model, xml: Path) -> Iterator[tuple[str, str, object, int]]:
    """(output name ``XML#LINE``, line id, Pillow crop of the line, its left page column)
    for every text line of a PAGE or ALTO file, in document order."""
    if model.image is None:
        raise UserError(f"{xml}: a page of text lines, but the model was not trained on "
                        "images (rnntrain-data images or pagexml)")
    page = parse_page(xml, with_empty=True)
    img = page_image(page)
    cache = PageCache()
    for ln in page.lines:
        where = f"{xml} TextLine {ln.id}"
        grey = cache.get(img, f"{xml}: page image {img}")
        (x0, _, _, _), crop = crop_line(grey, cache.paper, ln, PADDING, True, where)
        yield f"{xml}#{ln.id}", ln.id, crop, x0


def check_writable(xml: Path):
    """--page-out writes PAGE: refuse an ALTO page before any work."""
    root = read_xml(xml)
    if local(root.tag) != "PcGts":
        raise UserError(f"{xml}: --page-out writes PAGE-XML; this page is <{local(root.tag)}>"
                        " (ALTO): transcribe it without --page-out")


def write_page(xml: Path, results: dict, out: Path):
    """The PAGE file ``xml`` with the Transcripts ``results`` ({line id: Transcript}) as
    its lines' TextEquivs, written atomically to ``out`` → how many TextLines had no
    ``id``. Lines are matched as ``page_items`` named them (frontend.pagexml.text_lines:
    document order, ``#n`` for a line without an id); such a line gets an id (``line_n``,
    one the page does not use yet: the schema requires it, and its Words' ids build on it)."""
    from rnntrain.fsutil import atomic_write
    root = read_xml(xml)
    ns = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""
    if ns:
        ET.register_namespace("", ns)
    q = (lambda name: f"{{{ns}}}{name}") if ns else (lambda name: name)
    used = {e.get("id") for e in root.iter() if e.get("id")}
    added = 0
    for lid, _, line in text_lines(xml, kid(root, "Page"), "id"):
        t = results.get(lid)
        if t is None:
            continue
        if not line.get("id"):
            n, added = int(lid[1:]), added + 1
            new = f"line_{n}"
            while new in used:
                new += "_"
            line.set("id", new)
            used.add(new)
        for old in kids(line, "TextEquiv") + kids(line, "Word"):
            line.remove(old)
        # Words, then TextEquiv, follow Coords and Baseline in the schema's sequence
        before = [i for i, c in enumerate(line) if local(c.tag) in
                  ("AlternativeImage", "Coords", "Baseline")]
        at = before[-1] + 1 if before else 0
        poly = page_points(kid(line, "Coords"), f"{xml} TextLine {line.get('id')}")
        y0, y1 = (float(poly[:, 1].min()), float(poly[:, 1].max())) if poly is not None \
            else (0.0, 0.0)
        for word in words(t, line.get("id"), y0, y1, q):
            line.insert(at, word)
            at += 1
        line.insert(at, text_equiv(t.text, t.confidences, q))
    atomic_write(out, ET.tostring(root, encoding="utf-8", xml_declaration=True))
    return added


def text_equiv(text: str, confs: list[float], q) -> ET.Element:
    """<TextEquiv index="1" conf="mean"><Unicode>text</Unicode></TextEquiv>."""
    eq = ET.Element(q("TextEquiv"), {"index": "1"})
    if confs:
        eq.set("conf", f"{sum(confs) / len(confs):.4f}")
    ET.SubElement(eq, q("Unicode")).text = text
    return eq


def _box(x0: float, x1: float, y0: float, y1: float) -> str:
    x0, x1 = int(round(x0)), max(int(round(x1)), int(round(x0)) + 1)
    y0, y1 = int(round(y0)), int(round(y1))
    return f"{x0},{y0} {x1},{y0} {x1},{y1} {x0},{y1}"


def words(t, line_id: str, y0: float, y1: float, q) -> list[ET.Element]:
    """The hypothesis' Words and Glyphs (see the module docstring). A label is one
    character when the text has as many characters as there are labels (character
    models), else its name stands for itself."""
    chars = list(t.text) if len(t.text) == len(t.labels) else list(t.labels)
    xs, xe = t.span_starts, t.span_ends
    out, cur = [], []

    def close():
        if not cur:
            return
        w = ET.Element(q("Word"), {"id": f"{line_id}_w{len(out)}"})
        ET.SubElement(w, q("Coords"), {"points": _box(min(xs[k] for k in cur),
                                                       max(xe[k] for k in cur), y0, y1)})
        for n, k in enumerate(cur):
            g = ET.SubElement(w, q("Glyph"), {"id": f"{line_id}_w{len(out)}_g{n}"})
            ET.SubElement(g, q("Coords"), {"points": _box(xs[k], xe[k], y0, y1)})
            g.append(text_equiv(chars[k], [t.confidences[k]], q))
        w.append(text_equiv("".join(chars[k] for k in cur),
                            [t.confidences[k] for k in cur], q))
        out.append(w)
        cur.clear()

    for k, c in enumerate(chars):
        if c.isspace():
            close()
        else:
            cur.append(k)
    close()
    return out
