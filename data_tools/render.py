"""``rnntrain-data render-lines``: synthetic printed text lines for an OCR recipe.

Fonts: the TrueType files matplotlib ships (``matplotlib/mpl-data/fonts/ttf``: DejaVu
Sans/Serif/Mono in several styles under the DejaVu licence (Bitstream Vera derived, free),
STIX under the SIL Open Font License, the BaKoMa Computer Modern text faces cmr10, cmb10,
cmti10, cmss10, cmtt10 under the BaKoMa Fonts Licence, free). Give them by file stem
(``DejaVuSans``, ``STIXGeneral``, ``cmr10``, ...) or as paths to .ttf/.otf files. The math
and symbol files (cmmi10, cmsy10, cmex10, STIXSiz*, STIXNonUni*) are refused.

Glyph check (a line is never drawn in a font that draws one of its characters wrongly):
a font draws character c right when its Unicode cmap maps c to a glyph whose name, read
by the Adobe Glyph List (``fontTools.agl.toUnicode``), is c itself, and c is not in the
font's entry of ``WRONG_BUT_NAMED``. The BaKoMa files keep TeX's OT1 layout under a
Unicode cmap: in cmr10 ``<`` is the glyph ``exclamdown`` (¡), ``|`` is ``endash``, ``"`` is
``quotedblright``, ``'`` is ``quoteright`` (a curly apostrophe, not the straight one) ...;
the names say so and the rule drops them. cmti10's ``$`` is named ``dollar`` but drawn as
£ (OT1's italic layout): the one known glyph whose name lies, listed in
``WRONG_BUT_NAMED``. Each line's font is drawn among the ``--fonts`` that draw all of its
characters (all of them, as before, when every font does: the same seed gives the same
set); a line no font draws is refused before anything is written.

Text: Faker's ``en_US`` providers (the ``faker`` package from PyPI, MIT licence):
sentences from its English word list, names, street addresses, company names, dates and
numbers (ASCII lines only), cut at word boundaries to at most ``--max-chars`` characters. Or ``--text FILE``:
lines of any UTF-8 text file, in order, cycled.

Each line is drawn black on white at a size drawn from ``--sizes``, then varied: the
paper margin above and below the text (``--margin A-B``, a fraction of the font size on
each side: how tightly a line segmenter crops), the width (``--stretch A-B``, a factor:
narrow and wide typefaces), rotation up to ``--rotate`` degrees, ink grey level, Gaussian
blur up to ``--blur`` pixels and additive Gaussian noise (``--noise``, std in grey levels
/ 255), each drawn from a
generator seeded by (--seed, line number), so a set is reproducible and its lines
independent. Output: ``OUT/img/NNNNNN.png`` and ``OUT/list.tsv`` (``img/NNNNNN.png<TAB>text``,
the input of ``rnntrain-data images --chars``).
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError


def font_dir() -> Path:
    import matplotlib
    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


# matplotlib's math and symbol faces: no text font (their letters and digits are math
# italic or old-style, their punctuation arrows and delimiters)
SYMBOL_FONTS = ("cmmi", "cmsy", "cmex", "STIXSiz", "STIXNonUni", "LastResort")

# glyphs whose name (the glyph check's evidence) is the character's but whose drawing is
# not, by the font's PostScript name (name table ID 6, lower case): found by rendering
# printable ASCII in each of matplotlib's text faces (tests/test_ocr.py shows the £)
WRONG_BUT_NAMED = {"cmti10": "$"}   # OT1 italic layout: the dollar slot holds sterling


def find_font(name: str) -> Path:
    p = Path(name)
    if p.suffix.lower() in (".ttf", ".otf") and p.is_file():
        return p
    if p.stem.startswith(SYMBOL_FONTS) and p.suffix == "":
        raise UserError(f"--fonts {name}: a math/symbol font, not for plain text")
    cand = font_dir() / f"{name}.ttf"
    if cand.is_file():
        return cand
    have = sorted(f.stem for f in font_dir().glob("*.ttf")
                  if not f.stem.startswith(SYMBOL_FONTS))
    raise UserError(f"--fonts {name}: no such font file; matplotlib ships {', '.join(have)}")


def wrong_glyphs(font_path: Path, chars) -> dict[str, str]:
    """The characters of ``chars`` that the font does not draw as themselves, each with
    the reason: not in its cmap, or mapped to a glyph named for another character (the
    Adobe Glyph List reading of the glyph's name), or listed in ``WRONG_BUT_NAMED``.
    A font without glyph names (post table 3.0) gets names from its cmap: it is trusted."""
    from fontTools import agl
    from fontTools.ttLib import TTFont, TTLibError
    try:
        with TTFont(str(font_path), lazy=True) as tt:
            cmap = tt.getBestCmap() or {}
            ps = next((str(r) for r in tt["name"].names if r.nameID == 6), "") \
                if "name" in tt else ""
    except (TTLibError, OSError, KeyError, AssertionError) as e:
        raise UserError(f"--fonts {font_path}: not a readable TrueType/OpenType font "
                        f"({e})") from None
    lying = WRONG_BUT_NAMED.get(ps.lower(), "")
    out = {}
    for c in sorted(set(chars)):
        glyph = cmap.get(ord(c))
        if glyph is None:
            out[c] = "no glyph"
        elif agl.toUnicode(glyph) != c:
            out[c] = f"glyph {glyph!r}"
        elif c in lying:
            out[c] = f"glyph {glyph!r} drawn as another character"
    return out


MAX_SIZE = 1000    # font size in pixels: a text line is not a poster

# Faker draws dates up to "now" unless told otherwise: a fixed end keeps a seed's lines
# the same from one day (or minute) to the next
DATE_END = datetime.date(2025, 12, 31)


def faker_lines(count: int, seed: int, max_chars: int) -> list[str]:
    """``count`` lines of English-like text from Faker's en_US providers (seeded)."""
    try:
        from faker import Faker
    except ImportError:
        raise UserError("render-lines needs the 'faker' package for its text (pip install "
                        "faker, or rnntrain[images]); or give --text FILE") from None
    fk = Faker("en_US")
    fk.seed_instance(seed)
    rng = np.random.default_rng([seed, 0x7E47])
    makers = [lambda: fk.sentence(nb_words=8), lambda: fk.sentence(nb_words=5),
              fk.name, fk.street_address, fk.company, fk.city,
              lambda: f"{fk.date(end_datetime=DATE_END)} {fk.random_int(1, 9999)}",
              lambda: f"{fk.catch_phrase()}.", lambda: f"{fk.random_int(10, 99999):,} {fk.word()}"]
    out = []
    while len(out) < count:
        s = " ".join(makers[int(rng.integers(len(makers)))]().split())
        if s.isascii():  # a fixed printable-ASCII alphabet covers every line (recipe)
            out.append(cut(s, max_chars))
    return out


def cut(s: str, max_chars: int) -> str:
    """``s`` shortened at a word boundary to at most ``max_chars`` (a word longer than
    that is cut inside)."""
    if len(s) <= max_chars:
        return s
    head = s[:max_chars + 1].rsplit(" ", 1)[0]
    return head if 0 < len(head) <= max_chars else s[:max_chars]


def file_lines(path: str, count: int, max_chars: int) -> list[str]:
    from rnntrain.fsutil import read_text
    lines = [" ".join(ln.split()) for ln in read_text(path, "--text file").splitlines()]
    lines = [cut(ln, max_chars) for ln in lines if ln]
    if not lines:
        raise UserError(f"--text {path}: no non-empty lines")
    return [lines[i % len(lines)] for i in range(count)]


def render_line(text: str, font_path: Path, size: int, rng: np.random.Generator,
                rotate: float, blur: float, noise: float,
                margin: tuple[float, float] | None = None,
                stretch: tuple[float, float] = (1.0, 1.0)):
    """One text line → a grayscale Pillow image (dark ink on white paper).

    margin: (lo, hi) fractions of ``size`` drawn for the paper above and below the text
    (each side on its own); None: a quarter of the size. stretch: (lo, hi) width factor.
    """
    from PIL import Image, ImageDraw, ImageFilter, ImageFont
    font = ImageFont.truetype(str(font_path), size)
    left, top, right, bottom = font.getbbox(text)
    ascent, descent = font.getmetrics()
    pad = max(2, size // 4)
    if margin is None:
        above = below = pad
    else:
        above, below = (max(1, round(size * float(rng.uniform(*margin)))) for _ in range(2))
    w = max(right, 1) + 2 * pad
    h = ascent + descent + above + below
    ink = int(rng.integers(0, 90))                       # black to dark grey
    paper = int(rng.integers(215, 256))
    im = Image.new("L", (w, h), paper)
    ImageDraw.Draw(im).text((pad, above), text, font=font, fill=ink)
    if stretch != (1.0, 1.0):
        f = float(rng.uniform(*stretch))
        im = im.resize((max(1, round(w * f)), h), resample=Image.BILINEAR)
    if rotate:
        im = im.rotate(float(rng.uniform(-rotate, rotate)), resample=Image.BILINEAR,
                       expand=True, fillcolor=paper)
    if blur:
        r = float(rng.uniform(0, blur))
        if r > 0.2:
            im = im.filter(ImageFilter.GaussianBlur(r))
    a = np.asarray(im, dtype=np.float32)
    if noise:
        a = a + rng.normal(0, noise * float(rng.uniform(0.2, 1.0)), a.shape)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def render_lines(out: str, count: int, fonts: list[str], sizes: tuple[int, int], seed: int,
                 rotate: float = 1.5, blur: float = 1.0, noise: float = 8.0,
                 max_chars: int = 40, text: str | None = None, progress: bool = True,
                 margin: tuple[float, float] | None = None,
                 stretch: tuple[float, float] = (1.0, 1.0)) -> Path:
    """Write ``count`` rendered lines into ``out``; returns the list file's path."""
    from tqdm import tqdm
    if count < 1:
        raise UserError(f"--count {count} must be >= 1")
    if not fonts:
        raise UserError("--fonts: give at least one font")
    if not 4 <= sizes[0] <= sizes[1] <= MAX_SIZE:
        raise UserError(f"--sizes {sizes[0]}-{sizes[1]}: give A-B with 4 <= A <= B <= "
                        f"{MAX_SIZE} (font sizes in pixels)")
    if margin is not None and not 0 <= margin[0] <= margin[1] <= 4:
        raise UserError(f"--margin {margin[0]}-{margin[1]}: give A-B with 0 <= A <= B <= 4")
    if not 0.2 <= stretch[0] <= stretch[1] <= 5:
        raise UserError(f"--stretch {stretch[0]}-{stretch[1]}: give A-B with "
                        f"0.2 <= A <= B <= 5")
    from PIL import Image
    paths = [find_font(f) for f in fonts]
    lines = file_lines(text, count, max_chars) if text else faker_lines(count, seed, max_chars)
    # per font, the characters of these lines it draws wrongly (module docstring)
    wrong = [wrong_glyphs(p, "".join(lines)) for p in paths]
    able = {}              # line -> indices of the fonts that draw all of its characters
    for i, line in enumerate(lines):
        if line not in able:
            able[line] = [k for k, w in enumerate(wrong) if not w.keys() & set(line)]
        if not able[line]:
            src = f"--text {text} " if text else ""
            why = "; ".join(f"{paths[k].stem}: {c!r} {w[c]}" for k, w in enumerate(wrong)
                            for c in sorted(w.keys() & set(line))[:1])
            raise UserError(f"{src}rendered line {i + 1} ({line[:40]!r}): no font of --fonts draws "
                            f"all its characters ({why})")
    odir = Path(out)
    (odir / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, line in enumerate(tqdm(lines, desc="render", unit="line",
                                  disable=not progress or None, leave=False)):
        rng = np.random.default_rng([seed, i])
        ok = able[line]
        k = ok[int(rng.integers(len(ok)))]
        try:
            im = render_line(line, paths[k], int(rng.integers(sizes[0], sizes[1] + 1)), rng,
                             rotate, blur, noise, margin, stretch)
        except Image.DecompressionBombError as e:  # a huge size times a long line
            raise UserError(f"line {i + 1} ({line[:40]!r}): refused, the rendered image "
                            f"would be too large ({e})") from None
        name = f"img/{i:06d}.png"
        im.save(odir / name)
        rows.append(f"{name}\t{line}\n")
    lst = odir / "list.tsv"
    tmp = odir / f".list.tsv.tmp{os.getpid()}"
    tmp.write_text("".join(rows), encoding="utf-8")
    os.replace(tmp, lst)
    return lst
