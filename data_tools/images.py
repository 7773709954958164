"""``rnntrain-data images``: text-line images with their transcripts → RNNLIB NetCDF.

Inputs, in any mix (each line named in errors by its list line or file):
- a LIST.tsv (``--list`` or an INPUT ending in .tsv): one image per line,
  ``path<TAB>transcript``; relative paths are relative to the list's folder; blank lines
  and lines starting with ``#`` are skipped;
- line images with their ground truth beside them, as OCR-D, Calamari, kraken and ocropus
  keep them: ``0001.png`` + ``0001.gt.txt`` (the variants ``0001.bin.png`` and
  ``0001.nrm.png`` read the same ``0001.gt.txt``), given as a folder (searched
  recursively; images without a ``.gt.txt`` are left out with a note, a ``.gt.txt``
  without an image is an error, and several variants of one line are refused: pick one
  with a glob), a glob (``'gt/*.bin.png'``, quoted or expanded by the shell) or image
  files. The ``.gt.txt`` text is plain text: ``--chars`` is implied.

The transcript is a space-separated list of label names, or with ``--chars`` plain text:
normalised to Unicode NFC, runs of whitespace made one space, then split into characters.
Character label names are the character itself for printable ASCII, ``--space`` (default
``<space>``) for the space and ``U+XXXX`` for everything else, so that every name is
ASCII without whitespace: RNNLIB reads targets as space-separated names from fixed-width
char arrays. Lists and ``.gt.txt`` files must be UTF-8 (else one line naming the file
and line).

Alphabet: ``--labels`` (names separated by commas or whitespace, or a file holding one
label per line, so an alphabet can contain ``,``), ``--labels-from`` (an .nc file's
alphabet or such a file: validation and test sets take the training set's), ``--alphabet
ascii``, or the sorted set of the transcripts' labels. A line holding a label the alphabet
lacks is refused, except with ``--labels-from`` (and the val/test parts of ``--split``):
there it is kept, its target holds the labels the alphabet has, and its full transcript
goes into the variable ``fullTargetStrings`` (with the global attribute
``outOfAlphabetLines``), which ``rnntrain eval`` scores against (an out-of-alphabet
character is an error the model could not avoid) and training refuses.

Pixels (PNG, JPEG, TIFF, anything Pillow opens): grayscale in [0, 1] with ink high and
background 0 (``--invert auto`` inverts images whose median is light, i.e. dark text on a
light background), so that zero padding is background. Line geometry: every line is
scaled to ``--height`` pixels (default 48, as kraken and Calamari) keeping the aspect
ratio; ``--height 0`` keeps the original sizes. ``--trim PAD`` (e.g. 4) trims the white
margin to the ink and keeps PAD pixels of background around it, so that loosely and
tightly cropped lines read alike; off by default (on archiscribe's tight crops it slowed
learning: docs/accuracy.md, "Line geometry"). The
preparation is ``rnntrain.frontend.images``, the one ``rnntrain transcribe`` applies to
new images, so a model reads any new line whatever its size.

Layouts: ``2d`` (default) writes RNNLIB's 2-D layout (numDims = 2, seqDims = height,
width, pixels column-major, readable by RNNLIB; see ``rnntrain.data.ncdata``);
``columns`` writes 1-D frames, one per image column of H pixels (needs one height for all
images), with the attribute ``imageHeight = H``. Either trains the same model. The
converter's settings are stored as the JSON attribute ``rnntrain_images`` (inference
prepares new images with them).

Splits: ``--split 0.8,0.1,0.1 --seed 1`` draws a seeded permutation of the lines and
writes ``OUT-train.nc``, ``OUT-val.nc`` and ``OUT-test.nc`` (OUT: ``--out`` without
``.nc``) with ``OUT-train.tsv`` ... beside them: each split's lines as a LIST.tsv, the
input that converts that split again. The alphabet comes from the training part.

Each image is decoded once: its prepared pixels are spooled to an unlinked temporary file
beside the output (one image in memory at a time), then written into the NetCDF file(s).
"""
from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .audio import list_lines
from rnntrain.data import ncdata
from rnntrain.errors import UserError, check_regular_file
from rnntrain.fsutil import read_text
# the image preparation lives in the front end, shared with transcribe; prepare and
# pixels stay importable from here (bench/ocr.py and users' scripts)
from rnntrain.frontend.images import SPACE, DEFAULT_HEIGHT, DEFAULT_TRIM, IMAGE_SUFFIXES, \
    ImageSettings, char_label, label_char, open_image, pixels, prepare, target_size  # noqa: F401

VARIANTS = (".bin", ".nrm")   # ocropus/kraken: binarised and normalised line images


@dataclass
class Line:
    """One text line to convert."""
    where: str                 # names the line in errors: "LIST line N: path", "x.gt.txt"
    tag: str                   # seqTags entry
    text: str                  # the transcript as written
    key: Path                  # the file a split list names (its image, its XML)
    open: Callable = field(repr=False)   # () -> a Pillow image (closed by the caller)
    frag: str = ""             # after the key in a split list ("#LINE-ID" of a page)

    def list_key(self, folder: Path) -> str:
        """How a list file in ``folder`` names this line (relative to the folder)."""
        return os.path.relpath(os.path.abspath(self.key), os.path.abspath(folder)) + self.frag


def _file_opener(path: Path, where: str):
    return lambda: open_image(path, where)


def read_list(list_path) -> list[Line]:
    lp = Path(list_path)
    out = [Line(f"{lp} line {n}: {path}", path.name, text, path, _file_opener(
        path, f"{lp} line {n}: {path}")) for n, path, text in
        list_lines(lp, read_text(lp, "list file"))]
    if not out:
        raise UserError(f"{lp}: no images listed")
    return out


def gt_path(image: Path) -> Path:
    """``0001.png``, ``0001.bin.png``, ``0001.nrm.png`` → ``0001.gt.txt`` beside them."""
    stem = image.name[:-len(image.suffix)]
    for v in VARIANTS:
        if stem.endswith(v):
            stem = stem[:-len(v)]
            break
    return image.with_name(stem + ".gt.txt")


def gt_line(image: Path, root: Path | None = None) -> Line:
    gt = gt_path(image)
    if not gt.is_file():
        raise UserError(f"{image}: no ground truth beside it ({gt.name} not found)")
    text = read_text(gt, "ground-truth file")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tag = str(image.relative_to(root)) if root is not None else image.name
    return Line(str(gt), tag, " ".join(lines), image, _file_opener(image, str(image)))


def _is_image(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_SUFFIXES


def folder_lines(folder: Path) -> list[Line]:
    """Every line image under ``folder`` (recursively) with its ``.gt.txt``."""
    try:
        files = sorted(p for p in folder.rglob("*") if p.is_file())
    except OSError as e:
        raise UserError(f"{folder}: cannot list the folder ({e.strerror})") from None
    by_gt: dict[Path, list[Path]] = {}
    orphans = []
    for p in files:
        if _is_image(p):
            g = gt_path(p)
            (by_gt.setdefault(g, []) if g.is_file() else orphans).append(p)
    for g in sorted(p for p in files if p.name.endswith(".gt.txt")):
        if g not in by_gt:
            raise UserError(f"{g}: ground truth without a line image beside it "
                            f"({g.name[:-7]}.png or another image type)")
    out = []
    for g, images in sorted(by_gt.items()):
        if len(images) > 1:
            names = ", ".join(p.name for p in images)
            raise UserError(f"{g}: several images of one line ({names}); choose one kind "
                            f"with a glob, e.g. '{folder}/**/*{images[-1].name[len(g.name) - 7:]}'")
        out.append(gt_line(images[0], folder))
    if orphans:
        print(f"rnntrain-data images: note: {len(orphans)} image(s) under {folder} have no "
              f".gt.txt beside them and were left out (first: {orphans[0]})", file=sys.stderr)
    if not out:
        raise UserError(f"{folder}: no line images with a .gt.txt beside them")
    return out


def input_lines(inputs: list[str], lists: list[str] | None = None) -> list[Line]:
    """Command-line inputs (folders, globs, image files, .tsv lists) → lines, in order."""
    out: list[Line] = []
    for lp in lists or []:
        out += read_list(lp)
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            out += folder_lines(p)
        elif p.suffix.lower() == ".tsv" and not any(c in arg for c in "*?["):
            out += read_list(p)
        elif p.exists() or os.path.lexists(p):
            if not _is_image(p):
                raise UserError(f"{p}: not a line image ({', '.join(sorted(IMAGE_SUFFIXES))}),"
                                " folder or .tsv list")
            check_regular_file(p, "image file")
            out.append(gt_line(p))
        elif any(c in arg for c in "*?["):
            found = sorted(Path(f) for f in glob.glob(arg, recursive=True))
            found = [f for f in found if f.is_file() and _is_image(f)]
            if not found:
                raise UserError(f"{arg}: the pattern matches no image files")
            out += [gt_line(f) for f in found]
        else:
            raise UserError(f"{p}: not found")
    if not out:
        raise UserError("give line images: a folder, a glob, image files or --list LIST.tsv")
    return out


# ---------------------------------------------------------------- alphabets


def ascii_alphabet(space: str = SPACE) -> list[str]:
    """``--alphabet ascii``: the space, then the printable ASCII characters in code order."""
    return [space] + [chr(c) for c in range(33, 127)]


def check_text(text: str, where: str) -> str:
    """A transcript as written → its text: a leading byte-order mark (U+FEFF, as Windows
    editors save UTF-8) dropped; a control character other than whitespace (NUL, ESC ...)
    refused with one line naming the file: it is no character of a print, and as a label
    it would be trained silently."""
    text = text.lstrip("\ufeff")
    for k, c in enumerate(text):
        if unicodedata.category(c) == "Cc" and not c.isspace():
            raise UserError(f"{where}: holds the control character U+{ord(c):04X} at "
                            f"character {k + 1}: not text (a damaged or binary file?)")
    return text


def drop_empty(lines: list["Line"], what: str = "rnntrain-data images") -> list["Line"]:
    """``lines`` less those whose transcript is empty or blank, with a note naming how many
    and the first (an empty target would train the model to read nothing there)."""
    empty = [ln for ln in lines if not ln.text.strip()]
    if empty:
        print(f"{what}: note: {len(empty)} line(s) with an empty transcript were left out "
              f"(first: {empty[0].where})", file=sys.stderr)
    return [ln for ln in lines if ln.text.strip()]


def text_labels(text: str, space: str = SPACE) -> list[str]:
    """Plain text → label names: NFC, whitespace runs → one space, stripped."""
    text = " ".join(unicodedata.normalize("NFC", text).split())
    return [char_label(c, space) for c in text]


def labels_file(path) -> list[str]:
    """An alphabet file: one label name per line (blank lines skipped; a line holding a
    single space is the space, for --chars alphabets written as characters)."""
    names = []
    for n, raw in enumerate(read_text(path, "labels file").splitlines(), 1):
        name = raw.strip("\r\n")
        if not name.strip() and name:
            name = " "
        elif not name:
            continue
        else:
            name = name.strip()
        if name in names:
            raise UserError(f"{path} line {n}: label {name!r} is given twice")
        names.append(name)
    if not names:
        raise UserError(f"{path}: no labels in the file")
    return names


def labels_from(path) -> list[str]:
    """The alphabet of an existing RNNLIB file, or of a labels file (``--labels-from``)."""
    p = Path(path)
    if p.suffix == ".nc" or p.is_dir():
        return list(ncdata.read_header(path).labels)
    return labels_file(p)


def as_label_names(names: list[str], chars: bool, space: str) -> list[str]:
    """Labels given as characters (a labels file of a --chars alphabet: ``ſ``, ``,``, a
    lone space) → their label names; names already in that form stay."""
    if not chars:
        return names
    return [char_label(n, space) if len(n) == 1 else n for n in names]


# ---------------------------------------------------------------- conversion


@dataclass
class Spool:
    """Prepared lines kept on disk between decoding and writing: (H, W) float32 each."""
    file: object
    shapes: list[tuple[int, int]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def add(self, a: np.ndarray):
        self.offsets.append(self.file.tell())
        self.shapes.append(a.shape)
        self.file.write(np.ascontiguousarray(a, np.float32).tobytes())

    def get(self, i: int) -> np.ndarray:
        h, w = self.shapes[i]
        self.file.seek(self.offsets[i])
        return np.frombuffer(self.file.read(4 * h * w), np.float32).reshape(h, w)


def spool_lines(lines: list[Line], settings: ImageSettings, folder: Path,
                progress: bool = True) -> Spool:
    from tqdm import tqdm
    sp = Spool(tempfile.TemporaryFile(dir=folder, prefix=".rnntrain-images-"))
    for ln in tqdm(lines, desc="images", unit="image", disable=not progress or None,
                   leave=False):
        with ln.open() as im:
            sp.add(pixels(im, settings, ln.where))
    return sp


@dataclass
class Targets:
    """The lines' targets against one alphabet."""
    names: list[list[str]]            # in-alphabet label names per line
    full: list[list[str]] | None      # every label per line, when some lie outside
    unknown: int                      # lines holding labels outside the alphabet


def make_targets(lines: list[Line], texts: list[list[str]], labels: list[str], chars: bool,
                 space: str, keep_unknown: bool, where: str) -> Targets:
    index = set(labels)
    names, unknown = [], 0
    for ln, tg in zip(lines, texts):
        bad = [t for t in tg if t not in index]
        if bad and not keep_unknown:
            shown = f"{label_char(bad[0], space)!r} (label {bad[0]})" if chars else repr(bad[0])
            raise UserError(f"{ln.where}: {shown} is not in the alphabet ({len(labels)} labels"
                            f"{', ' + where if where else ''}); give an alphabet that has it "
                            "(--labels FILE), or convert a validation/test set with "
                            "--labels-from to keep such lines")
        unknown += bool(bad)
        names.append([t for t in tg if t in index] if bad else tg)
    return Targets(names, texts if unknown else None, unknown)


def write_lines(out, idx: list[int], lines: list[Line], spool: Spool, tg: Targets,
                labels: list[str], attrs: dict, layout: str, fmt: str, list_path=None):
    """One NetCDF file of the lines ``idx`` (already spooled), their targets ``tg``."""
    heights = [spool.shapes[i][0] for i in idx]
    widths = [spool.shapes[i][1] for i in idx]
    attrs = dict(attrs)
    if layout == "columns":
        if len(set(heights)) != 1:
            k = next(k for k, h in enumerate(heights) if h != heights[0])
            raise UserError(f"{lines[idx[k]].where}: height {heights[k]} differs from the "
                            f"first image's {heights[0]}; --layout columns needs one height "
                            "(give --height)")
        attrs["imageHeight"] = heights[0]
    strings = None
    full = [tg.full[i] for i in idx] if tg.full is not None else None
    if full is not None and any(f != tg.names[i] for f, i in zip(full, idx)):
        strings = {"fullTargetStrings": [" ".join(f) for f in full]}
        attrs["outOfAlphabetLines"] = sum(f != tg.names[i] for f, i in zip(full, idx))
    with ncdata.NcWriter(out, labels, heights[0] if layout == "columns" else 1, widths,
                         [" ".join(tg.names[i]) for i in idx], [lines[i].tag for i in idx],
                         fmt, heights=heights if layout == "2d" else None, attrs=attrs,
                         strings=strings) as w:
        for i in idx:
            a = spool.get(i)
            w.append(ncdata.image_rows(a) if layout == "2d" else a.T)
    if list_path is not None:
        from rnntrain.fsutil import atomic_write
        folder = Path(list_path).parent
        atomic_write(list_path, "".join(f"{lines[i].list_key(folder)}\t"
                                        f"{' '.join(lines[i].text.split())}\n"
                                        for i in idx).encode("utf-8"))
    return {"images": len(idx), "columns": int(sum(widths)),
            "heights": (min(heights), max(heights)),
            "out_of_alphabet": int(attrs.get("outOfAlphabetLines", 0))}


def parse_split(text: str) -> list[float]:
    """``--split 0.8,0.1,0.1`` → [0.8, 0.1, 0.1] (train, val[, test]); sums to 1."""
    try:
        parts = [float(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"--split {text!r}: give fractions TRAIN,VAL[,TEST], e.g. "
                        "0.8,0.1,0.1") from None
    if not 2 <= len(parts) <= 3 or any(not 0 <= v <= 1 for v in parts) or \
            abs(sum(parts) - 1) > 1e-6 or parts[0] <= 0:
        raise UserError(f"--split {text!r}: give 2 or 3 fractions in [0, 1] summing to 1 "
                        "(train first, > 0)")
    return parts


def split_indices(n: int, fractions: list[float], seed: int) -> list[list[int]]:
    """A seeded permutation of range(n) cut by ``fractions`` (rounded; train gets the
    rest); each part in the lines' order."""
    perm = np.random.default_rng([seed, 0x5B117]).permutation(n)
    sizes = [int(round(f * n)) for f in fractions[1:]]
    first = n - sum(sizes)
    cuts = np.cumsum([first] + sizes)[:-1]
    return [sorted(int(i) for i in part) for part in np.split(perm, cuts)]


SPLIT_NAMES = ("train", "val", "test")


def split_outputs(out) -> tuple[str, str]:
    """``data/lines.nc`` → ("data/lines", ".nc")."""
    s = str(out)
    return (s[:-3], ".nc") if s.endswith(".nc") else (s, ".nc")


def convert_lines(lines: list[Line], out, settings: ImageSettings, chars: bool = False,
                  space: str = SPACE, labels: list[str] | None = None, layout: str = "2d",
                  fmt: str = "NETCDF3_64BIT_OFFSET", progress: bool = True,
                  keep_unknown: bool = False, split: list[float] | None = None,
                  seed: int = 1, source: str = "", extra_attrs: dict | None = None) -> dict:
    """Convert ``lines`` into ``out`` (or its splits); returns a summary dict."""
    if layout not in ("2d", "columns"):
        raise UserError(f"--layout {layout!r}: choose 2d or columns")
    settings.check("--height/--trim/--invert")
    if chars and (not space or space.split() != [space]):
        raise UserError(f"--space {space!r}: give a label name without whitespace")
    for ln in lines:
        ln.text = check_text(ln.text, ln.where)
    lines = drop_empty(lines)
    if not lines:
        raise UserError(f"{source or out}: every transcript is empty")
    texts = [text_labels(ln.text, space) if chars else ln.text.split() for ln in lines]
    parts = split_indices(len(lines), split, seed) if split else [list(range(len(lines)))]
    if labels is None:
        labels = sorted({t for i in parts[0] for t in texts[i]})
        if not labels:
            raise UserError(f"{source or out}: every transcript is empty; give --labels")
    elif len(set(labels)) != len(labels):
        raise UserError("--labels: a label is given twice")
    # the training part must fit its alphabet; val/test keep what it lacks (--labels-from)
    tgs = [make_targets([lines[i] for i in part], [texts[i] for i in part], labels, chars,
                        space, keep_unknown or k > 0, source) for k, part in enumerate(parts)]
    attrs = {"rnntrain_images": json.dumps({**settings.describe(), "layout": layout,
                                            "chars": chars, "space": space})}
    attrs.update(extra_attrs or {})
    folder = Path(out).absolute().parent
    folder.mkdir(parents=True, exist_ok=True)
    spool = spool_lines(lines, settings, folder, progress)
    try:
        if not split:
            info = write_lines(out, parts[0], lines, spool, _full(tgs[0], parts[0], len(lines)),
                               labels, attrs, layout, fmt)
            return {**info, "labels": len(labels), "files": [str(out)]}
        base, ext = split_outputs(out)
        files, infos = [], {}
        for name, part, tg in zip(SPLIT_NAMES, parts, tgs):
            if not part:
                continue
            path = f"{base}-{name}{ext}"
            infos[name] = write_lines(path, part, lines, spool, _full(tg, part, len(lines)),
                                      labels, attrs, layout, fmt, list_path=f"{base}-{name}.tsv")
            files.append(path)
        total = {"images": len(lines), "labels": len(labels), "files": files,
                 "columns": sum(v["columns"] for v in infos.values()),
                 "heights": (min(v["heights"][0] for v in infos.values()),
                             max(v["heights"][1] for v in infos.values())),
                 "out_of_alphabet": sum(v["out_of_alphabet"] for v in infos.values()),
                 "splits": {k: v["images"] for k, v in infos.items()}}
        return total
    finally:
        spool.file.close()


def _full(tg: Targets, part: list[int], n: int) -> Targets:
    """``tg`` (indexed by position in ``part``) re-indexed by line number."""
    names: list = [None] * n
    full: list | None = [None] * n if tg.full is not None else None
    for k, i in enumerate(part):
        names[i] = tg.names[k]
        if full is not None:
            full[i] = tg.full[k]
    return Targets(names, full, tg.unknown)


def convert_images(list_path, out, settings: ImageSettings, chars: bool = False,
                   space: str = SPACE, labels: list[str] | None = None, layout: str = "2d",
                   fmt: str = "NETCDF3_64BIT_OFFSET", progress: bool = True,
                   inputs: list[str] | None = None, keep_unknown: bool = False,
                   split: list[float] | None = None, seed: int = 1) -> dict:
    """Convert the listed images (a LIST.tsv and/or ``inputs``) into ``out``."""
    lines = input_lines(inputs or [], [list_path] if list_path else [])
    if inputs and any(not str(a).endswith(".tsv") for a in inputs):
        chars = True          # .gt.txt files hold plain text
    return convert_lines(lines, out, settings, chars, space, labels, layout, fmt, progress,
                         keep_unknown, split, seed, str(list_path or ""))


def settings_of(path) -> ImageSettings | None:
    """The converter settings stored in a file written by ``convert_images`` (or None)."""
    with ncdata.NC_LOCK, ncdata._open(str(path)) as ds:
        if "rnntrain_images" not in ds.ncattrs():
            return None
        d = json.loads(ds.getncattr("rnntrain_images"))
    return ImageSettings.from_dict(d)
