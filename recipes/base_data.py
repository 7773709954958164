"""The training lists of a base model (recipes/base_models.sh): real lines from
../shared/data and the text that render-lines draws in period typefaces.

    python recipes/base_data.py MODEL SHARED OUT

MODEL: de19 (19th-century German print, Fraktur and Antiqua) or latin15 (early-modern
Latin print, 15th-16th century types). SHARED: the shared data folder (fraktur19/,
archiscribe/). OUT: the model's data folder. Writes

- ``OUT/real-train.tsv``, ``OUT/real-val.tsv``: real lines (image path<TAB>transcript);
- ``OUT/render.txt``: one line of text per line to render, only characters that at least
  one of the model's fonts draws (render-lines refuses others);
- ``OUT/unseen.tsv`` (de19): archiscribe's 4 test works, scored on the card, in no set;
- ``OUT/sources.json``: what went in, for the model card (works, lines, licenses).

archiscribe's test works (split.tsv: test) are in no list: its unseen-book test stays
unseen. Deterministic: the same inputs give the same files.
"""
from __future__ import annotations

import json
import random
import sys
import unicodedata
from pathlib import Path

# the Debian font packages and the faces of each model (paths as Debian installs them)
FONTS = {
    "de19": {
        "fonts-blankenburg": ["truetype/blankenburg/Blankenburg_UNZ1A.ttf"],
        "fonts-ebgaramond": ["opentype/ebgaramond/EBGaramond12-Regular.otf",
                             "opentype/ebgaramond/EBGaramond12-Italic.otf"],
        "fonts-linuxlibertine": ["opentype/linux-libertine/LinLibertine_R.otf",
                                 "opentype/linux-libertine/LinLibertine_RB.otf"],
        "fonts-oldstandard": ["truetype/fonts-oldstandard/OldStandard-Regular.ttf"],
        "fonts-cardo": ["truetype/cardo/Cardo104s.ttf"],
    },
    "latin15": {
        "fonts-gotico-antiqua": [
            "opentype/gotico-antiqua/Fust&Schoeffer-Durandus-GoticoAntiqua118G.otf",
            "opentype/gotico-antiqua/Rusch-GoticoAntiqua100G.otf",
            "opentype/gotico-antiqua/Zainer-GoticoAntiqua96G.otf",
            "opentype/gotico-antiqua/Parix-Hybrid111R.otf",
            "opentype/gotico-antiqua/SouffletVert-Hybrid106R.otf",
            "opentype/gotico-antiqua/Spira-ProtoRoman110R.otf",
            "opentype/gotico-antiqua/Sweynheim&Pannartz-ProtoRoman115R.otf",
            "opentype/gotico-antiqua/Rot-ProtoRoman102R.otf",
            "opentype/gotico-antiqua/Jessen-Cicero12.otf",
            "opentype/gotico-antiqua/Hamlet-Cicero12.otf"],
        "fonts-junicode": ["opentype/junicode/JunicodeTwoBeta-Regular.otf",
                           "opentype/junicode/JunicodeTwoBeta-Italic.otf"],
        "fonts-cardo": ["truetype/cardo/Cardo104s.ttf"],
        "fonts-ebgaramond": ["opentype/ebgaramond/EBGaramond12-Regular.otf"],
        "fonts-elstob": ["opentype/elstob/ElstobD-Regular.otf"],
        "fonts-goudybookletter": ["opentype/sortsmill/GoudyBookletter1911.otf"],
    },
}
FONT_ROOT = Path("/usr/share/fonts")


def font_paths(model: str) -> list[Path]:
    return [FONT_ROOT / f for files in FONTS[model].values() for f in files]


def gt_lines(folder: Path) -> list[tuple[Path, str]]:
    out = []
    for gt in sorted(folder.rglob("*.gt.txt")):
        img = gt.with_name(gt.name[:-len(".gt.txt")] + ".png")
        text = " ".join(unicodedata.normalize("NFC", gt.read_text(encoding="utf-8")).split())
        if img.is_file() and text:
            out.append((img.resolve(), text))
    return out


def archiscribe(root: Path) -> dict[str, list[tuple[Path, str]]]:
    rows = [ln.split("\t") for ln in
            (root / "split.tsv").read_text(encoding="utf-8").splitlines()[1:] if ln]
    parts: dict[str, list] = {"train": [], "val": [], "test": []}
    for image, split in rows:
        text = (root / (image.rsplit(".", 1)[0] + ".gt.txt")).read_text(encoding="utf-8")
        parts[split].append(((root / image).resolve(),
                             " ".join(unicodedata.normalize("NFC", text).split())))
    return parts


def drawable(lines: list[str], fonts: list[Path]) -> list[str]:
    """The lines some font draws whole (the glyph check render-lines applies)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from data_tools.render import wrong_glyphs
    except ImportError:  # installed: the data tools are rnntrain_data
        from rnntrain_data.render import wrong_glyphs
    chars = "".join(lines)
    bad = [set(wrong_glyphs(p, chars)) for p in fonts]
    return [ln for ln in lines if any(not (b & set(ln)) for b in bad)]


def latin_text(n: int, seed: int) -> list[str]:
    """Latin prose lines: Faker's Latin word list (its ``la`` lorem provider), with the
    abbreviation marks and long s of 15th-16th century prints drawn into words."""
    from faker.providers.lorem.la import Provider
    vocab = list(Provider.word_list)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        words = [rng.choice(vocab) for _ in range(rng.randint(4, 9))]
        line = []
        for w in words:
            if rng.random() < 0.3:   # long s inside words, as the prints set it
                w = "".join("ſ" if c == "s" and i < len(w) - 1 else c for i, c in enumerate(w))
            if w.endswith("que") and rng.random() < 0.5:
                w = w[:-3] + "q;"
            if w.endswith(("um", "am")) and rng.random() < 0.3:
                w = w[:-2] + {"u": "ū", "a": "ā"}[w[-2]]   # the nasal stroke for m
            line.append(w)
        s = " ".join(line)
        s = s[0].upper() + s[1:]
        s += rng.choice([".", ",", ":", ";", ""])
        out.append(unicodedata.normalize("NFC", s))
    return out


def main(model: str, shared: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fonts = font_paths(model)
    missing = [str(p) for p in fonts if not p.is_file()]
    if missing:
        pkgs = " ".join(FONTS[model])
        sys.exit(f"base_data.py: {missing[0]} not found: apt-get install {pkgs}")
    sources = {"model": model, "real": [], "fonts": {k: v for k, v in FONTS[model].items()}}
    train: list[tuple[Path, str]] = []
    val: list[tuple[Path, str]] = []
    if model == "de19":
        f19 = gt_lines(shared / "fraktur19")
        arch = archiscribe(shared / "archiscribe")
        train = f19 + arch["train"]
        val = arch["val"]
        sources["real"] = [
            {"corpus": "fraktur19", "lines": len(f19), "split": "train",
             "license": "MIT", "source": "chreul/19th-century-fraktur-OCR (Reul et al. 2018)"},
            {"corpus": "archiscribe", "lines": len(arch["train"]), "split": "train",
             "license": "CC BY 4.0", "source": "jbaiter/archiscribe-corpus (Baiter)"},
            {"corpus": "archiscribe", "lines": len(arch["val"]), "split": "val",
             "license": "CC BY 4.0", "source": "jbaiter/archiscribe-corpus (Baiter)"}]
        sources["excluded"] = ("archiscribe's test works (split.tsv: test, "
                               f"{len(arch['test'])} lines): the unseen-book test")
        # text to render: the training transcripts (never val or test), shuffled
        text = [t for _, t in train]
        random.Random(19).shuffle(text)
        text = drawable(text, fonts)
        (out / "render.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
        sources["render_text"] = (f"{len(text)} training transcripts of fraktur19 and "
                                  "archiscribe (train split) that a font draws whole")
    else:
        text = drawable(latin_text(6000, 15), fonts)
        (out / "render.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
        sources["render_text"] = ("Latin word lines from Faker's `la` lorem word list "
                                  "(MIT), with long s, q; and macron abbreviations drawn in")
    if model == "de19":  # scored only, never trained on or validated with
        (out / "unseen.tsv").write_text("".join(f"{p}\t{t}\n" for p, t in arch["test"]),
                                        encoding="utf-8")
    for name, rows in (("real-train", train), ("real-val", val)):
        (out / f"{name}.tsv").write_text("".join(f"{p}\t{t}\n" for p, t in rows),
                                         encoding="utf-8")
    (out / "sources.json").write_text(json.dumps(sources, indent=1, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    print(f"{model}: {len(train)} real training lines, {len(val)} real validation lines, "
          f"{len(text)} lines of text to render")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in FONTS:
        sys.exit(f"usage: base_data.py {{{','.join(FONTS)}}} SHARED OUT")
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
