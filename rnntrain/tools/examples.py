"""``rnntrain init``: the example configs and recipes shipped inside the package.

The TOML files live in the repository's ``configs/`` (what run_train.sh and the recipes
use), the recipe scripts in ``recipes/``; ``rnntrain/configs`` and ``rnntrain/recipes``
point there, and the wheel carries both as package data, so an installed rnntrain can
write one out wherever the user works. A recipe is written with what it runs (the other
recipes and the configs it names) in the repository's layout (``recipes/NAME.sh``,
``configs/NAME.toml`` under the chosen folder), so the same script runs in both places:
in the repository it uses ``python -m data_tools``, elsewhere ``python -m rnntrain_data``.
"""
from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write

# how to make the data each example reads (paths relative to where the user runs it)
DATA_HINTS = {
    "default": ["mkdir -p data",
                "rnntrain-data synth data/synth_train.nc --seqs 3000 --seed 1",
                "rnntrain-data synth data/synth_val.nc --seqs 200 --seed 2"],
    "fsdd_digits": ["see recipes/fsdd_digits.sh in the rnntrain repository (FSDD recordings "
                    "→ data/fsdd/*.nc)"],
    "printed_lines": ["see recipes/printed_lines.sh in the rnntrain repository (rendered "
                      "text lines → data/printed_lines/*.nc)"],
    "yesno": ["see recipes/yesno.sh in the rnntrain repository (YesNo recordings → "
              "data/yesno/*.nc)"],
}
RECIPE_OF = {"fsdd_digits": "fsdd_digits", "printed_lines": "printed_lines", "yesno": "yesno"}
"""Example config → the recipe that makes its data (``rnntrain init --recipe NAME``)."""

# what a recipe script runs or reads from the shipped files, by the paths it names
_NAMED = re.compile(r"\b(recipes/[\w.-]+\.(?:sh|py)|configs/[\w.-]+\.toml)\b")


def examples() -> dict[str, str]:
    """{name: TOML text} of every shipped example config."""
    folder = resources.files("rnntrain") / "configs"
    found = {}
    if folder.is_dir():
        for f in folder.iterdir():
            if f.name.endswith(".toml"):
                found[f.name[:-5]] = f.read_text(encoding="utf-8")
    assert found, "rnntrain/configs is missing from this installation"
    return dict(sorted(found.items()))


def write_example(name: str, out: str | None, force: bool, list_only: bool) -> int:
    ex = examples()
    if list_only:
        import textwrap

        def item(k, what):
            print(textwrap.fill(what, 88, initial_indent=f"  {k:<16} ",
                                subsequent_indent=" " * 19))
        print("example configs (rnntrain init NAME):")
        for k, text in ex.items():
            item(k, summary(text))
        print("recipes (rnntrain init --recipe NAME: the script, what it runs, its configs):")
        for k, first in recipes().items():
            item(k, first)
        return 0
    if name.endswith(".toml"):
        name = name[:-5]
    if name not in ex:
        raise UserError(f"no example config {name!r}; examples: {', '.join(ex)}")
    path = Path(out or f"{name}.toml")
    if path.exists() and not force:
        raise UserError(f"{path} exists; pass --force to overwrite it or --out to choose "
                        f"another file")
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: its folder does not exist")
    try:
        atomic_write(path, ex[name])
    except OSError as e:
        raise UserError(f"cannot write {path} ({e.strerror})") from None
    print(f"wrote {path} (example {name!r})")
    hints = DATA_HINTS.get(name)
    if name in RECIPE_OF:
        hints = [f"rnntrain init --recipe {RECIPE_OF[name]} writes the script that makes it "
                 f"(recipes/{RECIPE_OF[name]}.sh, in the rnntrain repository too)"]
    if hints:
        print("its data:\n  " + "\n  ".join(hints))
    print(f"then: rnntrain train {path}")
    return 0


def summary(text: str) -> str:
    """The first sentence of a file's leading comment block (a shebang skipped)."""
    words = []
    for ln in text.splitlines():
        if ln.startswith("#!"):
            continue
        if not ln.startswith("#") or not ln.strip("# "):
            break
        words += ln.lstrip("#").split()
    text = " ".join(words).replace("/ ", "/")  # a path broken across two lines
    end = next((i for i in range(len(text)) if text[i] == "." and
                (i + 1 == len(text) or text[i + 1] == " ")), len(text))
    return text[:end]


def _shipped(folder: str, suffixes: tuple[str, ...]) -> dict[str, str]:
    d = resources.files("rnntrain") / folder
    return {f.name: f.read_text(encoding="utf-8") for f in (d.iterdir() if d.is_dir() else [])
            if f.name.endswith(suffixes)}


def recipes() -> dict[str, str]:
    """{name: first line of its description} of every shipped recipe script."""
    out = {fname[:-3]: summary(text)
           for fname, text in sorted(_shipped("recipes", (".sh",)).items())}
    assert out, "rnntrain/recipes is missing from this installation"
    return out


def recipe_files(name: str) -> dict[str, str]:
    """{path relative to the folder written: text} of recipe ``name`` and everything it
    names (the recipes it calls, their helper scripts, the configs they train with)."""
    shipped = {f"recipes/{k}": v for k, v in _shipped("recipes", (".sh", ".py")).items()}
    shipped.update({f"configs/{k}": v for k, v in _shipped("configs", (".toml",)).items()})
    todo, out = [f"recipes/{name}.sh"], {}
    while todo:
        rel = todo.pop()
        if rel in out or rel not in shipped:
            continue
        out[rel] = shipped[rel]
        todo += _NAMED.findall(shipped[rel])
    return dict(sorted(out.items()))


def write_recipe(name: str, out: str | None, force: bool) -> int:
    """Write recipe ``name`` and what it runs under ``out`` (default: here)."""
    known = recipes()
    if name.endswith(".sh"):
        name = name[:-3]
    if name not in known:
        raise UserError(f"no recipe {name!r}; recipes: {', '.join(known)}")
    top = Path(out or ".")
    if not top.is_dir():
        raise UserError(f"--out {top}: not a folder (a recipe is written as recipes/ and "
                        f"configs/ inside it)")
    files = recipe_files(name)
    there = [rel for rel in files if os.path.lexists(top / rel)]
    if there and not force:
        raise UserError(f"{top / there[0]} exists; pass --force to overwrite "
                        f"{', '.join(there)} or --out to choose another folder")
    for rel, text in files.items():
        p = top / rel
        try:
            p.parent.mkdir(exist_ok=True)
            atomic_write(p, text)
            if rel.endswith(".sh"):
                p.chmod(0o755)  # recipes call each other as programs
        except OSError as e:
            raise UserError(f"cannot write {p} ({e.strerror})") from None
    print(f"wrote {', '.join(str(top / rel) for rel in files)} (recipe {name!r})")
    script = files[f"recipes/{name}.sh"]
    header = []  # the script's own comment block: what it does, its arguments, its data
    for ln in script.splitlines()[1:]:
        if not ln.startswith("#"):
            break
        header.append(ln[1:].rstrip())
    print("\n".join(header))
    print(f"run it from {top}: recipes/{name}.sh ... (with the python that has rnntrain "
          f"first on PATH, or PYTHON=/path/to/python)")
    return 0
