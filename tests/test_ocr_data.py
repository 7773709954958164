"""OCR ground truth as users have it: line images with .gt.txt beside them, PAGE-XML and
ALTO pages, splits, alphabets (label files, out-of-alphabet lines kept for eval), the
line geometry (height, trimmed margins) and hostile images (decompression bombs,
multi-page TIFFs, non-UTF-8 text). Every file is built here (the OCR-D page of
shared/data is read when present)."""
from __future__ import annotations

import json
import math
import os
import struct
import unicodedata
import zlib
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from rnntrain.data.dataset import Dataset
from tests.conftest import run_cli, run_cli_batch

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from data_tools.images import convert_images  # noqa: E402
from rnntrain.frontend.images import ImageSettings, LineGeometry, prepare, \
    prepare_geometry  # noqa: E402

_ROOT = Path(__file__).resolve().parents[1]
KANT = next((p / "ocrd-kant" for p in
             [Path(os.environ.get("RNNTRAIN_DATA", _ROOT / "missing")),
              _ROOT.parent / "shared" / "data", _ROOT.parents[1] / "shared" / "data"]
             if (p / "ocrd-kant" / "OCR-D-GT-PAGE").is_dir()), _ROOT / "missing")


def clean_error(r, *fragments):
    """One clean error line (exit 2, no traceback) holding every fragment."""
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert ": error: " in last, last
    for f in fragments:
        assert f in last, f"{f!r} not in {last!r}"
    return last


def text_image(text: str, size: int = 20, margin=(4, 4, 4, 4)) -> np.ndarray:
    """Dark text on white paper, ``margin`` (left, top, right, bottom) of paper around the
    ink box exactly, uint8 (H, W)."""
    font = ImageFont.truetype("DejaVuSans.ttf", size) if _has_dejavu() else \
        ImageFont.load_default()
    probe = Image.new("L", (size * len(text) + 40, size * 3), 255)
    ImageDraw.Draw(probe).text((20, size), text, font=font, fill=0)
    a = np.asarray(probe)
    rows, cols = np.flatnonzero((a < 128).any(1)), np.flatnonzero((a < 128).any(0))
    ink = a[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    l, t, r, b = margin
    return np.pad(ink, ((t, b), (l, r)), constant_values=255)


def _has_dejavu() -> bool:
    try:
        ImageFont.truetype("DejaVuSans.ttf", 10)
        return True
    except OSError:
        return False


def read_nc(path):
    ds = Dataset.open(str(path))
    px = {}
    for k in range(len(ds.chunks)):
        px.update(ds.load_chunk(k))
    with netCDF4.Dataset(path) as nc:
        tags = ["".join(c.decode() for c in row if c) for row in nc["seqTags"][:].data]
        full = (["".join(c.decode() for c in row if c) for row in
                 nc["fullTargetStrings"][:].data] if "fullTargetStrings" in nc.variables
                else None)
        attrs = {k: nc.getncattr(k) for k in nc.ncattrs()}
    texts = [spell([ds.labels[i] for i in t]) for t in ds.targets]
    if full is not None:
        full = [spell(f.split()) for f in full]
    return ds, [px[i] for i in range(ds.num_seqs)], tags, texts, full, attrs


def spell(names) -> str:
    from rnntrain.frontend.images import label_char
    return "".join(label_char(n) for n in names)


# ---------------------------------------------------------------- geometry


def test_loose_crop_reads_like_a_tight_one(tmp_path):
    """A rendered line with a wide white margin is prepared (trim + height 48) to the
    same pixels as the same line cropped tightly."""
    tight = text_image("Loose or tight", margin=(1, 1, 1, 1))
    loose = np.pad(tight, ((30, 45), (80, 120)), constant_values=255)
    Image.fromarray(tight).save(tmp_path / "t.png")
    Image.fromarray(loose).save(tmp_path / "l.png")
    s = ImageSettings(48, "auto", 4)
    a, b = prepare(tmp_path / "t.png", s), prepare(tmp_path / "l.png", s)
    assert a.shape == b.shape and a.shape[0] == 48
    np.testing.assert_array_equal(a, b)
    # the padding is background on every side, the ink reaches the inner box
    assert not a[:4].any() and not a[-4:].any() and not a[:, :4].any() and not a[:, -4:].any()
    assert a[4].max() > 0.5 and a[-5].max() > 0.5 and a[:, 4].max() > 0.5
    # without trimming the margins stay (and the loose line scales differently)
    c = prepare(tmp_path / "l.png", ImageSettings(48, "auto", -1))
    assert c.shape != a.shape


def test_geometry_maps_columns_back_to_the_original(tmp_path):
    """A vertical bar at a known column of the original image: the prepared column where
    its ink lands maps back (LineGeometry) to that column, within one scaled pixel."""
    a = np.full((60, 300), 255, np.uint8)
    a[20:40, 50:60] = 0           # left block (ink box starts at x=50)
    a[20:40, 200:203] = 0         # a bar at x = 200..202
    Image.fromarray(a).save(tmp_path / "g.png")
    px, geo = prepare_geometry(tmp_path / "g.png", ImageSettings(48, "auto", 4))
    assert isinstance(geo, LineGeometry) and geo.x0 == 50 and geo.width == px.shape[1]
    scale = 40 / 20                                  # ink 20 px high → 48 - 2 * 4
    assert geo.scale == pytest.approx(scale, rel=0.02)
    cols = np.flatnonzero(px.max(0) > 0.5)
    bar = cols[cols > geo.pad + 30 * scale]          # the bar's prepared columns
    x = geo.column_to_pixel(float(bar.mean()) + 0.5)
    assert abs(x - 201.5) <= 1.0
    # frames of a model pooling 4 columns: frame f covers [4f, 4f + 4) prepared columns
    s0, e0 = geo.frame_to_pixels(0, 4)
    assert s0 == pytest.approx(max(50 - 4 / scale, 0)) and e0 == pytest.approx(50)
    f = int(bar.mean()) // 4
    s, e = geo.frame_to_pixels(f, 4)
    assert s <= 201.5 + 2 and e >= 201.5 - 2 and e - s == pytest.approx(4 / scale)


# ---------------------------------------------------------------- gt.txt folders


def write_gt_folder(d: Path, n: int = 5, variant: str = "") -> list[str]:
    d.mkdir(parents=True, exist_ok=True)
    texts = ["Gr\u00fc\u00dfe", "cafe\u0301 au lait", "\u017fo, \u017fie!", "x = 1,2", "Zw\u006f\u0364lf"]
    for i, t in enumerate(texts[:n]):
        Image.fromarray(text_image(t.replace("\u017f", "s"), 16, (6, 9, 20, 3))).save(
            d / f"{i:04d}{variant}.png")
        (d / f"{i:04d}.gt.txt").write_text(t + "\n", encoding="utf-8")
    return texts[:n]


def test_gt_txt_folder_glob_and_variants(tmp_path):
    texts = write_gt_folder(tmp_path / "a")
    write_gt_folder(tmp_path / "b" / "sub", 2, ".bin")
    Image.fromarray(text_image("stray")).save(tmp_path / "b" / "stray.png")   # no .gt.txt
    out = run_cli("data_tools", "images", tmp_path / "a", tmp_path / "b", "--out",
                  tmp_path / "o.nc", "--trim", "4")
    assert out.returncode == 0, out.stderr
    assert "1 image(s)" in out.stderr and "stray.png" in out.stderr  # left out, with a note
    ds, px, tags, got, full, attrs = read_nc(tmp_path / "o.nc")
    want = [" ".join(unicodedata.normalize("NFC", t).split()) for t in texts + texts[:2]]
    assert got == want and full is None                    # NFC, in folder order
    assert tags == [f"{i:04d}.png" for i in range(5)] + [f"sub/{i:04d}.bin.png" for i in (0, 1)]
    assert all(p.shape[1] == 48 for p in px)                # (W, H) columns, 48 high
    meta = json.loads(attrs["rnntrain_images"])
    assert meta["height"] == 48 and meta["trim"] == 4 and meta["chars"] is True
    # a glob picks one kind; the same pixels as the folder gave
    Image.fromarray(text_image("other kind")).save(tmp_path / "b" / "sub" / "0000.nrm.png")
    r = run_cli_batch([
        ("data_tools", "images", tmp_path / "b", "--out", tmp_path / "x.nc"),
        ("data_tools", "images", str(tmp_path / "b" / "**" / "*.bin.png"), "--out",
         tmp_path / "g.nc", "--trim", "4"),
    ])
    clean_error(r[0], "0000.gt.txt", "several images of one line", "0000.bin.png",
                "0000.nrm.png", "glob")
    assert r[1].returncode == 0, r[1].stderr
    _, gpx, gtags, gtexts, _, _ = read_nc(tmp_path / "g.nc")
    assert gtexts == want[5:] and [t.split("/")[-1] for t in gtags] == ["0000.bin.png",
                                                                           "0001.bin.png"]
    for a, b in zip(gpx, px[5:]):
        np.testing.assert_array_equal(a, b)


def test_bom_nul_and_empty_transcripts(tmp_path):
    """A .gt.txt saved with a UTF-8 byte-order mark reads as its text (no U+FEFF label); a
    list file with one too; empty and blank transcripts are left out with a note; a NUL
    (or another control character) is one line naming the file."""
    texts = write_gt_folder(tmp_path / "a", 4)
    (tmp_path / "a" / "0000.gt.txt").write_bytes("\ufeff".encode() + texts[0].encode() + b"\n")
    (tmp_path / "a" / "0003.gt.txt").write_text("  \n", encoding="utf-8")
    r = run_cli("data_tools", "images", tmp_path / "a", "--out", tmp_path / "o.nc")
    assert r.returncode == 0, r.stderr
    assert "1 line(s) with an empty transcript were left out" in r.stderr
    assert "0003.gt.txt" in r.stderr
    ds, _, tags, got, _, _ = read_nc(tmp_path / "o.nc")
    assert tags == ["0000.png", "0001.png", "0002.png"]
    assert got == [" ".join(unicodedata.normalize("NFC", t).split()) for t in texts[:3]]
    assert "U+FEFF" not in ds.labels
    lst = tmp_path / "a" / "list.tsv"
    lst.write_bytes("\ufeff0001.png\tabc\n".encode())
    r = run_cli("data_tools", "images", "--list", lst, "--out", tmp_path / "l.nc", "--chars")
    assert r.returncode == 0, r.stderr
    assert read_nc(tmp_path / "l.nc")[3] == ["abc"]
    (tmp_path / "a" / "0001.gt.txt").write_bytes(b"ab\x00c\n")
    r = run_cli("data_tools", "images", tmp_path / "a", "--out", tmp_path / "n.nc")
    clean_error(r, "0001.gt.txt", "control character U+0000")
    assert not (tmp_path / "n.nc").exists()
    for f in ("0000", "0001", "0002"):
        (tmp_path / "a" / f"{f}.gt.txt").write_text("\n")
    r = run_cli("data_tools", "images", tmp_path / "a", "--out", tmp_path / "e.nc")
    clean_error(r, "every transcript is empty")


def test_labels_file_with_a_comma_and_out_of_alphabet_lines(tmp_path):
    """A labels file (one per line) can hold ','; --labels-from keeps lines with characters
    the alphabet lacks, target = the known ones, full text in fullTargetStrings;
    the training set (--labels) refuses them naming the file."""
    texts = write_gt_folder(tmp_path / "g")
    alpha = sorted({c for t in texts[:3] for c in unicodedata.normalize("NFC", t)})
    (tmp_path / "alpha.txt").write_text("\n".join(alpha) + "\n", encoding="utf-8")
    assert "," in alpha and " " in alpha
    r = run_cli_batch([
        ("data_tools", "images", tmp_path / "g", "--out", tmp_path / "v.nc", "--labels-from",
         tmp_path / "alpha.txt"),
        ("data_tools", "images", tmp_path / "g", "--out", tmp_path / "t.nc", "--labels",
         tmp_path / "alpha.txt"),
    ])
    assert r[0].returncode == 0, r[0].stderr
    assert "2 line(s) hold characters outside the alphabet" in r[0].stdout
    ds, _, _, got, full, attrs = read_nc(tmp_path / "v.nc")
    assert attrs["outOfAlphabetLines"] == 2 and len(ds.labels) == len(alpha)
    assert "," in ds.labels and "<space>" in ds.labels
    nfc = [" ".join(unicodedata.normalize("NFC", t).split()) for t in texts]
    assert got[:3] == nfc[:3]
    assert got[3] == "".join(c for c in nfc[3] if c in alpha)     # "=", "1", "2" missing
    assert full == nfc
    clean_error(r[1], "0003.gt.txt", "is not in the alphabet", "--labels-from")
    assert not (tmp_path / "t.nc").exists()


def test_split_is_seeded_and_its_lists_convert_again(tmp_path):
    write_gt_folder(tmp_path / "g")
    write_gt_folder(tmp_path / "h", 5, ".nrm")
    (tmp_path / "out").mkdir()
    r = run_cli("data_tools", "images", tmp_path / "g", tmp_path / "h", "--out",
                tmp_path / "out" / "set.nc", "--split", "0.6,0.2,0.2", "--seed", "3",
                "--trim", "4")
    assert r.returncode == 0, r.stderr
    parts = {s: read_nc(tmp_path / "out" / f"set-{s}.nc") for s in ("train", "val", "test")}
    sizes = {s: p[0].num_seqs for s, p in parts.items()}
    assert sizes == {"train": 6, "val": 2, "test": 2}
    tags = [t for s in parts for t in parts[s][2]]
    assert len(set(zip(tags, [x for s in parts for x in parts[s][3]]))) == 10
    # the lists are LIST.tsv files: converting one again gives the same file content
    for s in ("train", "test"):
        lst = tmp_path / "out" / f"set-{s}.tsv"
        rows = lst.read_text(encoding="utf-8").splitlines()
        assert len(rows) == sizes[s] and all(not Path(x.split("\t")[0]).is_absolute()
                                             for x in rows)
        again = tmp_path / f"again-{s}.nc"
        r2 = run_cli("data_tools", "images", "--list", lst, "--chars", "--out", again,
                     "--labels-from", tmp_path / "out" / "set-train.nc", "--trim", "4")
        assert r2.returncode == 0, r2.stderr
        a, b = parts[s], read_nc(again)
        assert a[3] == b[3] and a[0].labels == b[0].labels
        for x, y in zip(a[1], b[1]):
            np.testing.assert_array_equal(x, y)
    # another seed, another split; the same seed, the same
    from data_tools.images import split_indices
    assert split_indices(10, [0.6, 0.2, 0.2], 3) == split_indices(10, [0.6, 0.2, 0.2], 3)
    assert split_indices(10, [0.6, 0.2, 0.2], 3) != split_indices(10, [0.6, 0.2, 0.2], 4)


# ---------------------------------------------------------------- hostile files


def bomb_png(path: Path, w: int, h: int):
    """A PNG whose header declares w x h pixels (8-bit grey) and whose data is one row:
    a decompression bomb's header, a few hundred bytes on disk."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = zlib.compress(b"\0" + b"\xff" * min(w, 1000))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0,
                                                                      0, 0, 0))
                     + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    bomb_png(d / "bomb.png", 60000, 60000)        # > 2x Pillow's limit: its error
    bomb_png(d / "big.png", 10000, 10000)         # 100 M pixels: Pillow only warns
    for name in ("bomb", "big"):
        (d / f"{name}.gt.txt").write_text("x\n")
    pages = [Image.fromarray(text_image(t)) for t in ("one", "two")]
    pages[0].save(d / "multi.tif", save_all=True, append_images=pages[1:])
    (d / "multi.gt.txt").write_text("one two\n")
    Image.fromarray(text_image("ok")).save(d / "ok.png")
    (d / "latin1.tsv").write_bytes("ok.png\tok\nok.png\tcaf\u00e9\n".encode("latin-1"))
    (d / "latin1.gt.txt").write_bytes("caf\u00e9".encode("latin-1"))
    Image.fromarray(text_image("ok")).save(d / "latin1.png")
    (d / "latin1.txt").write_bytes("a line\ncaf\u00e9\n".encode("latin-1"))
    return d


def test_hostile_images_and_text_are_one_line(hostile):
    d = hostile
    cases = [
        (("data_tools", "images", d / "bomb.png", "--out", d / "o.nc"),
         ["bomb.png", "refused", "decompression bomb"]),
        (("data_tools", "images", d / "big.png", "--out", d / "o.nc"),
         ["big.png", "refused", "10000 x 10000"]),
        (("data_tools", "images", d / "multi.tif", "--out", d / "o.nc"),
         ["multi.tif", "multi-page image (2 pages"]),
        (("data_tools", "images", "--list", d / "latin1.tsv", "--out", d / "o.nc"),
         ["latin1.tsv line 2", "not UTF-8"]),
        (("data_tools", "images", d / "latin1.png", "--out", d / "o.nc"),
         ["latin1.gt.txt line 1", "not UTF-8"]),
        (("data_tools", "render-lines", "--out", d / "r", "--text", d / "latin1.txt"),
         ["latin1.txt line 2", "not UTF-8"]),
        (("data_tools", "render-lines", "--out", d / "r", "--count", "1", "--sizes",
          "5000-5000"), ["--sizes 5000-5000"]),
    ]
    for (args, frags), r in zip(cases, run_cli_batch([c for c, _ in cases])):
        clean_error(r, *frags)
    assert not (d / "o.nc").exists()


# ---------------------------------------------------------------- PAGE-XML and ALTO

PAGE_NS = {"2013": "http://schema.primaresearch.org/PAGE/gts/pagecontent/2013-07-15",
           "2019": "http://schema.primaresearch.org/PAGE/gts/pagecontent/2019-07-15"}


def rotated_page(tmp_path: Path, ns: str):
    """A page with three lines of text drawn rotated by known angles; PAGE-XML with each
    line's polygon (the rotated rectangle) and baseline → (xml path, lines)."""
    page = Image.new("L", (900, 500), 240)
    lines = [("Gr\u00fc\u00dfe aus Ko\u0308ln", 0.0, (60, 60)), ("tilted up", -6.0, (80, 200)),
             ("tilted down", 8.0, (420, 330))]
    xml_lines = []
    for k, (text, angle, (x, y)) in enumerate(lines):
        ink = text_image(unicodedata.normalize("NFC", text), 28, (6, 6, 6, 6))
        h, w = ink.shape
        tile = Image.fromarray(255 - ink).rotate(-angle, resample=Image.BILINEAR, expand=True)
        mask = Image.fromarray(np.asarray(tile))
        page.paste(Image.new("L", tile.size, 0), (x, y), mask)
        # the rotated rectangle's corners in page coordinates
        cx, cy = x + tile.size[0] / 2, y + tile.size[1] / 2
        t = math.radians(angle)
        corners = []
        for dx, dy in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2)):
            corners.append((cx + dx * math.cos(t) - dy * math.sin(t),
                            cy + dx * math.sin(t) + dy * math.cos(t)))
        base = [corners[3], corners[2]]
        pts = " ".join(f"{px:.0f},{py:.0f}" for px, py in corners)
        bl = " ".join(f"{px:.0f},{py:.0f}" for px, py in base)
        xml_lines.append(f'<TextLine id="l{k}"><Coords points="{pts}"/><Baseline points="{bl}"/>'
                         f'<Word id="w{k}"><TextEquiv><Unicode>wrong</Unicode></TextEquiv></Word>'
                         f'<TextEquiv index="2"><Unicode>other</Unicode></TextEquiv>'
                         f'<TextEquiv index="1"><Unicode>{text}</Unicode></TextEquiv>'
                         "</TextLine>")
    (tmp_path / "img").mkdir()
    page.save(tmp_path / "img" / "page.png")
    (tmp_path / "xml").mkdir()
    xml = tmp_path / "xml" / "page.xml"
    xml.write_text(f'<?xml version="1.0" encoding="UTF-8"?><PcGts xmlns="{PAGE_NS[ns]}">'
                   f'<Page imageFilename="img/page.png" imageWidth="900" imageHeight="500">'
                   f'<TextRegion id="r1"><Coords points="0,0 900,0 900,500 0,500"/>'
                   f'{"".join(xml_lines)}<TextLine id="empty"><Coords points="1,1 5,1 5,5"/>'
                   f'</TextLine></TextRegion></Page></PcGts>', encoding="utf-8")
    return xml, lines


@pytest.mark.parametrize("ns", ["2013", "2019"])
def test_pagexml_rotated_polygons(tmp_path, ns):
    from data_tools.pagexml import PageCache, crop_line, page_image, parse_page
    xml, lines = rotated_page(tmp_path, ns)
    page = parse_page(xml)
    assert [ln.id for ln in page.lines] == ["l0", "l1", "l2"] and page.empty == 1
    img = page_image(page)                  # named relative to the workspace above xml/
    assert img == xml.parent.parent / "img" / "page.png"
    cache = PageCache()
    grey = cache.get(img, "page")
    for ln, (text, angle, _) in zip(page.lines, lines):
        assert ln.text == text and ln.angle() == pytest.approx(angle, abs=0.5)
        box, im = crop_line(grey, cache.paper, ln, 0, True, "x")
        lo, hi = ln.polygon.min(0), ln.polygon.max(0)
        assert box == (math.floor(lo[0]), math.floor(lo[1]), math.ceil(hi[0]), math.ceil(hi[1]))
        # rotated to its baseline: the straightened line is as high as the upright ink
        a = 1 - np.asarray(im) / 255.0 if np.asarray(im).max() > 1.5 else 1 - np.asarray(im)
        rows = np.flatnonzero((a > 0.5).any(1))
        assert rows[-1] - rows[0] + 1 <= 28 * 1.6
    r = run_cli("data_tools", "pagexml", xml, "--out", tmp_path / "p.nc")
    assert r.returncode == 0, r.stderr
    assert "1 text line(s) without text" in r.stderr
    ds, px, tags, texts, _, _ = read_nc(tmp_path / "p.nc")
    assert texts == [unicodedata.normalize("NFC", t) for t, _, _ in lines]
    assert tags == ["page.xml#l0", "page.xml#l1", "page.xml#l2"]
    assert all(p.shape[1] == 48 for p in px)


def test_pagexml_errors_name_the_file_and_line(tmp_path):
    xml, _ = rotated_page(tmp_path, "2019")
    src = xml.read_text(encoding="utf-8")
    bad = {
        "points.xml": src.replace('<Coords points="', '<Coords points="x', 2)
                         .replace('<Coords points="x0,0', '<Coords points="0,0'),
        "escape.xml": src.replace('imageFilename="img/page.png"',
                                  'imageFilename="../../etc/passwd"'),
        "absolute.xml": src.replace('imageFilename="img/page.png"',
                                    'imageFilename="/img/page.png"'),
        "missing.xml": src.replace('imageFilename="img/page.png"', 'imageFilename="no.png"'),
        "broken.xml": src[:200],
        "outside.xml": src.replace('id="l0"><Coords points="', 'id="l0"><Coords points="'
                                   '5000,5000 5100,5000 5100,5100 ', 1),
    }
    for name, text in bad.items():
        (xml.parent / name).write_text(text, encoding="utf-8")
    d = xml.parent
    cases = [
        (("points.xml",), ["points.xml TextLine l0 Coords", "not 'x,y"]),
        (("escape.xml",), ["escape.xml", "leads outside", "--image-dir"]),
        (("absolute.xml",), ["absolute.xml", "absolute path", "--image-dir"]),
        (("missing.xml",), ["missing.xml", "'no.png' not found", "--image-dir"]),
        (("broken.xml",), ["broken.xml: not well-formed XML"]),
    ]
    rs = run_cli_batch([("data_tools", "pagexml", d / c[0], "--out", tmp_path / "o.nc")
                        for c, _ in cases])
    for (_, frags), r in zip(cases, rs):
        clean_error(r, *frags)
    # --image-dir finds an absolute path's image by its file name there
    r = run_cli("data_tools", "pagexml", d / "absolute.xml", "--image-dir", tmp_path / "img",
                "--out", tmp_path / "a.nc")
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not KANT.is_dir(), reason="no ocrd-kant in shared/data")
def test_real_ocrd_page_in_page_xml_and_alto(tmp_path):
    """OCR-D's Kant page: 24 lines from PAGE and from ALTO, the same texts (NFC), the
    split lists convert the same lines again."""
    page = KANT / "OCR-D-GT-PAGE" / "PAGE_0017_PAGE.xml"
    alto = KANT / "OCR-D-GT-ALTO" / "PAGE_0017_ALTO.xml"
    r = run_cli_batch([
        ("data_tools", "pagexml", page, "--out", tmp_path / "page.nc", "--split", "0.8,0.2"),
        ("data_tools", "pagexml", alto, "--out", tmp_path / "alto.nc",
         "--image", KANT / "OCR-D-IMG" / "INPUT_0017.tif"),
        ("data_tools", "pagexml", alto, "--out", tmp_path / "x.nc"),
    ])
    assert r[0].returncode == 0 and r[1].returncode == 0, r[0].stderr + r[1].stderr
    clean_error(r[2], "PAGE_0017_ALTO.xml", "names no page image", "--image")
    tr, va = read_nc(tmp_path / "page-train.nc"), read_nc(tmp_path / "page-val.nc")
    al = read_nc(tmp_path / "alto.nc")
    assert tr[0].num_seqs + va[0].num_seqs == 24 == al[0].num_seqs
    from xml.etree import ElementTree as ET
    want = {}
    for el in ET.parse(page).getroot().iter():
        if el.tag.endswith("}TextLine"):
            eq = [c for c in el if c.tag.endswith("}TextEquiv")][0]
            want[el.get("id")] = unicodedata.normalize("NFC", " ".join(
                [c for c in eq if c.tag.endswith("}Unicode")][0].text.split()))
    got = dict(zip([t.split("#")[1] for t in tr[2] + va[2]], tr[3] + (va[4] or va[3])))
    assert got == want
    # ALTO has no SP elements here: words are split at the gaps the page shows, which
    # is the PAGE text except where PAGE puts a space before punctuation ("1784 .")
    nospace = sorted(t.replace(" ", "") for t in want.values())
    assert sorted(t.replace(" ", "") for t in al[3]) == nospace
    assert len(set(al[3]) & set(want.values())) >= 18
    assert "Berlini\u017fche Monats\u017fchrift." in al[3]
    # the val list names the XML lines; converted again it gives the same pixels
    r = run_cli("data_tools", "pagexml", tmp_path / "page-val.tsv", "--out", tmp_path / "v2.nc",
                "--labels-from", tmp_path / "page-train.nc")
    assert r.returncode == 0, r.stderr
    v2 = read_nc(tmp_path / "v2.nc")
    assert v2[2] == va[2]
    for a, b in zip(v2[1], va[1]):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- eval: out-of-alphabet


def edit_distance(a, b) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[-1]


def test_eval_scores_out_of_alphabet_lines_against_their_full_text(tmp_path):
    """A val file converted with the training alphabet keeps lines with unknown labels;
    eval's LER equals the edit distance of decode's hypotheses to the FULL transcripts
    (computed here), and it counts the lines; training on such a file is refused."""
    from data_tools.images import convert_images, labels_from
    from tests.test_infer_images import image_run
    run, ds, _, names = image_run(tmp_path / "d", "2d", 12)
    d = tmp_path / "d"
    rows = (d / "list.tsv").read_text().splitlines()
    extra = {1: " Q", 3: " Q R"}                       # labels the alphabet lacks
    (d / "val.tsv").write_text("".join(r + extra.get(i, "") + "\n" for i, r in enumerate(rows)))
    info = convert_images(d / "val.tsv", d / "val.nc", ImageSettings(12, "auto"),
                          labels=labels_from(d / "img.nc"), keep_unknown=True, progress=False)
    assert info["out_of_alphabet"] == 2
    r = run_cli_batch([("rnntrain", "eval", run, d / "val.nc", "--json"),
                       ("rnntrain", "decode", run, d / "val.nc"),
                       ("rnntrain", "train", "data.train=" + str(d / "val.nc"),
                        "run.dir=" + str(tmp_path / "r"))])
    assert r[0].returncode == 0 and r[1].returncode == 0, r[0].stderr + r[1].stderr
    ev = json.loads(r[0].stdout)
    assert ev["out_of_alphabet"] == {"lines": 2, "labels": 3}
    hyps = [ln.split("\t")[1].split() if "\t" in ln else [] for ln in r[1].stdout.splitlines()]
    refs = [(row.split("\t")[1] + extra.get(i, "")).split() for i, row in enumerate(rows)]
    refs_all = refs
    assert len(hyps) == len(refs)
    # the sequences eval scores: those long enough for their (in-alphabet) target
    from rnntrain.compute.model import total_subsample
    from rnntrain.config import load_config
    from tests.test_infer_images import CONV
    keep = Dataset.open(str(d / "val.nc")).feasible(total_subsample(
        load_config(None, ["data.train=x.nc", *CONV]).model))
    assert keep[1] and keep[3] and ev["skipped"] == int((~keep).sum())
    hyps, refs = [h for h, k in zip(hyps, keep) if k], [t for t, k in zip(refs, keep) if k]
    want = sum(edit_distance(h, t) for h, t in zip(hyps, refs)) / sum(map(len, refs))
    assert ev["ref_labels"] == sum(map(len, refs)) and ev["ler"] == pytest.approx(want)
    clean_error(r[2], "val.nc", "2 line(s) hold characters outside its alphabet")
    # a model that knows Q (a fine-tuned model's merged alphabet): line 1's stored target
    # lacks its Q, so it is scored against its whole text too, Q as the model's own label
    from rnntrain.data.ncdata import full_targets
    labels = Dataset.open(str(d / "val.nc")).labels
    merged = labels + ["Q"]
    full, lines, count = full_targets(d / "val.nc", merged)
    index = {lb: k for k, lb in enumerate(merged)}
    assert sorted(full) == [1, 3] and (lines, count) == (1, 1)   # R alone is unknown
    assert full[1].tolist() == [index[n] for n in refs_all[1]]
    assert full[3].tolist()[:-1] == [index[n] for n in refs_all[3][:-1]]
    assert full[3][-1] == len(merged) + 1                        # R: never a model output


def test_transcribe_prepares_any_image_as_the_converter_did(tmp_path):
    """A model trained on trimmed lines (48 high, --trim 4) reads a new image of
    any size and margin: a 3x larger scan of a line with a wide margin becomes frames of
    the model's height, close to the converted line's (no 'height exceeds' refusal)."""
    import torch
    import rnntrain
    from rnntrain.compute.model import build_model
    from rnntrain.config import load_config
    from rnntrain.config import to_dict
    from rnntrain.run.checkpoint import ModelCard, save
    from rnntrain.run.state import TrainState
    from tests.test_infer_images import CONV
    texts = write_gt_folder(tmp_path / "g", 3)
    convert_images(None, tmp_path / "t.nc", ImageSettings(48, "auto", 4),
                   inputs=[str(tmp_path / "g")], progress=False)
    ds = Dataset.open(str(tmp_path / "t.nc"))
    cfg = load_config(None, [f"data.train={tmp_path / 't.nc'}", *CONV])
    torch.manual_seed(0)
    net = build_model(cfg.model, ds.frame_size, ds.num_labels, ds.frame_height).eval()
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    save(tmp_path / "run" / "checkpoints" / "best.pt", ModelCard.of_data(ds, to_dict(cfg)),
         {"model": net, "optim": torch.optim.SGD(net.parameters(), lr=0.1),
          "state": TrainState(epoch=1, step=1)})
    m = rnntrain.load(tmp_path / "run")
    assert m.image.settings == ImageSettings(48, "auto", 4) and m.image.height == 48
    small = np.asarray(Image.open(tmp_path / "g" / "0000.png"))
    big = Image.fromarray(small).resize((small.shape[1] * 3, small.shape[0] * 3), Image.BICUBIC)
    big = np.pad(np.asarray(big), ((100, 150), (300, 200)), constant_values=255)
    Image.fromarray(big).save(tmp_path / "big.png")
    want = ds.load_chunk(0)[0]                              # (W, 48) as converted
    got = m.frames(tmp_path / "big.png")
    assert got.shape[1] == 48 and abs(got.shape[0] - want.shape[0]) <= 2
    w = min(len(got), len(want))
    assert np.abs(got[:w] - want[:w]).mean() < 0.08
    assert texts[0] == "Gr\u00fc\u00dfe"
