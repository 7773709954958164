"""PAGE-XML pages in ``rnntrain transcribe``: every text line cut from the page scan
(``rnntrain.frontend.pagexml``, as ``rnntrain-data pagexml`` cuts ground truth), and, with
``--page-out DIR``, the page written back with each line's hypothesis.

Written back: a copy of the input PAGE file in which every transcribed ``TextLine`` holds
one ``TextEquiv`` (``@index`` 1, ``@conf`` = the mean of the line's per-label
confidences, ``Unicode`` = the hypothesis' text); the line's former ``TextEquiv``s and its
``Word`` children (whose text would contradict the new line text) are removed; the rest of
the document (regions, coordinates, metadata, unknown elements) is kept as it was.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rnntrain.errors import UserError
from rnntrain.frontend.pagexml import (PageCache, crop_line, kids, local, page_image,
                                       parse_page, read_xml)

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
    its lines' TextEquivs, written atomically to ``out``."""
    from rnntrain.fsutil import atomic_write
    root = read_xml(xml)
    ns = root.tag[1:].split("}", 1)[0] if root.tag.startswith("{") else ""
    if ns:
        ET.register_namespace("", ns)
    q = (lambda name: f"{{{ns}}}{name}") if ns else (lambda name: name)
    for line in root.iter(q("TextLine")):
        t = results.get(line.get("id"))
        if t is None:
            continue
        for old in kids(line, "TextEquiv") + kids(line, "Word"):
            line.remove(old)
        # TextEquiv follows Coords, Baseline and Words in the schema's sequence
        before = [i for i, c in enumerate(line) if local(c.tag) in
                  ("AlternativeImage", "Coords", "Baseline")]
        eq = ET.Element(q("TextEquiv"), {"index": "1"})
        if t.confidences:
            eq.set("conf", f"{sum(t.confidences) / len(t.confidences):.4f}")
        ET.SubElement(eq, q("Unicode")).text = t.text
        line.insert(before[-1] + 1 if before else 0, eq)
    atomic_write(out, ET.tostring(root, encoding="utf-8", xml_declaration=True))
