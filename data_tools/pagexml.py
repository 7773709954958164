"""``rnntrain-data pagexml``: PAGE-XML or ALTO pages → text-line images cut from the page
scans, converted as ``rnntrain-data images`` converts line images. Reading the pages and
cutting the lines: ``rnntrain.frontend.pagexml`` (transcribe reads pages the same way);
its module documentation gives the formats, the cropping and the page image's path.
"""
from __future__ import annotations

import sys
from pathlib import Path

from rnntrain.errors import UserError, check_regular_file
from rnntrain.frontend.images import ImageSettings
from rnntrain.frontend.pagexml import (Page, PageCache, PageLine, crop_line,  # noqa: F401
                                       page_image, parse_page, parse_points)
from rnntrain.fsutil import read_text
from .images import Line, convert_lines


class _Opened:
    """A Pillow image as a context manager (Line.open's contract)."""

    def __init__(self, im):
        self.im = im

    def __enter__(self):
        return self.im

    def __exit__(self, *exc):
        self.im.close()


def page_lines(xml_paths: list[Path], image_dir: str | None = None, image: str | None = None,
               padding: int = 0, crop: str = "polygon",
               only: dict[Path, list[str]] | None = None) -> list[Line]:
    """The text lines of every page, as ``images``' Line records (cropped when read)."""
    cache = PageCache()
    out: list[Line] = []
    empty = 0
    if image and len(xml_paths) > 1:
        raise UserError("--image names the image of one page: give one XML file with it")
    for xml in xml_paths:
        page = parse_page(xml)
        empty += page.empty
        img = page_image(page, image_dir, image)
        lines = page.lines
        if only is not None:
            want = only.get(xml, [])
            have = {ln.id: ln for ln in lines}
            for lid in want:
                if lid not in have:
                    raise UserError(f"{xml} TextLine {lid}: listed in the split list but not "
                                    "a text line of the page")
            lines = [have[lid] for lid in want]
        for ln in lines:
            where = f"{xml} TextLine {ln.id}"

            def opener(ln=ln, where=where, img=img):
                grey = cache.get(img, f"{xml}: page image {img}")
                return _Opened(crop_line(grey, cache.paper, ln, padding, crop == "polygon",
                                         where)[1])
            out.append(Line(where, f"{xml.name}#{ln.id}", ln.text, xml, opener, f"#{ln.id}"))
    if empty:
        print(f"rnntrain-data pagexml: note: {empty} text line(s) without text were left out",
              file=sys.stderr)
    if not out:
        raise UserError(f"{', '.join(str(p) for p in xml_paths[:3])}: no text lines with text")
    return out


def expand_inputs(inputs: list[str]) -> tuple[list[Path], dict[Path, list[str]] | None]:
    """XML files, folders of them (sorted, recursive) or a split list (.tsv of
    ``XML#LINE<TAB>text`` rows) → XML paths and, for lists, the lines to take."""
    xmls: list[Path] = []
    only: dict[Path, list[str]] | None = None
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*.xml") if f.is_file())
            if not found:
                raise UserError(f"{p}: a folder without .xml files")
            xmls += found
        elif p.suffix.lower() == ".tsv":
            only = {} if only is None else only
            for n, row in enumerate(read_text(p, "list file").splitlines(), 1):
                if not row.strip() or row.lstrip().startswith("#"):
                    continue
                key = row.split("\t", 1)[0].strip()
                if "#" not in key:
                    raise UserError(f"{p} line {n}: expected 'PAGE.xml#LINE-ID<TAB>text', got "
                                    f"{row[:80]!r}")
                f, lid = key.rsplit("#", 1)
                fp = Path(f) if Path(f).is_absolute() else p.parent / f
                if fp not in only:
                    xmls.append(fp)
                only.setdefault(fp, []).append(lid)
        else:
            check_regular_file(p, "XML file")
            xmls.append(p)
    if only is not None and len(only) != len(set(xmls)):
        raise UserError("give either split lists or XML files, not both")
    return xmls, only


def convert_pages(inputs: list[str], out, settings: ImageSettings, space: str, labels,
                  layout: str, fmt: str, keep_unknown: bool = False, split=None, seed: int = 1,
                  padding: int = 0, image_dir: str | None = None, crop: str = "polygon",
                  image: str | None = None, progress: bool = True) -> dict:
    if image_dir and not Path(image_dir).is_dir():
        raise UserError(f"--image-dir {image_dir}: not a folder")
    xmls, only = expand_inputs(inputs)
    lines = page_lines(xmls, image_dir, image, padding, crop, only)
    return convert_lines(lines, out, settings, True, space, labels, layout, fmt, progress,
                         keep_unknown, split, seed, ", ".join(inputs[:2]))
