"""``rnntrain init``: the example configs shipped inside the package.

The TOML files live in the repository's ``configs/`` (what run_train.sh and the recipes
use); ``rnntrain/configs`` points there, and the wheel carries them as package data, so an
installed rnntrain can write one out wherever the user works.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from rnntrain.errors import UserError
from rnntrain.fsutil import atomic_write

# how to make the data each example reads (paths relative to where the user runs it)
DATA_HINTS = {
    "default": ["rnntrain-data synth data/synth_train.nc --seqs 3000 --seed 1",
                "rnntrain-data synth data/synth_val.nc --seqs 200 --seed 2"],
    "fsdd_digits": ["see recipes/fsdd_digits.sh in the rnntrain repository (FSDD recordings "
                    "→ data/fsdd/*.nc)"],
    "printed_lines": ["see recipes/printed_lines.sh in the rnntrain repository (rendered "
                      "text lines → data/printed_lines/*.nc)"],
    "yesno": ["see recipes/yesno.sh in the rnntrain repository (YesNo recordings → "
              "data/yesno/*.nc)"],
}


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
        for k, text in ex.items():
            first = next((ln.lstrip("# ").strip() for ln in text.splitlines()
                          if ln.startswith("#")), "")
            print(f"{k:<14} {first}")
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
    if hints:
        print("its data:\n  " + "\n  ".join(hints))
    print(f"then: rnntrain train {path}")
    return 0
