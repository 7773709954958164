"""The model card's record of a base model's training (recipes/base_models.sh):

    python recipes/base_info.py NAME DATA RUN EPOCHS [OVERRIDE ...] > DATA/info-NAME.json

Title, summary, data and licenses (from DATA/sources.json, written by base_data.py), and
the training: the command, the date it finished, the CPU (lscpu), the CPU seconds of
every invocation (DATA/cpu_seconds-NAME.log) and the commit; OVERRIDE: the network's
settings the recipe adds to configs/printed_lines.toml; $NOTE, if set, as its note.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TITLES = {
    "de19": ("19th-century German print: Fraktur and Antiqua",
             "Printed German of 1800-1900 in Fraktur and Antiqua, binarised or grayscale line "
             "images, historic characters (long s, combining e above, r rotunda) kept as "
             "transcribed. A base model to fine-tune on a few dozen to a few hundred lines of "
             "a new book (rnntrain finetune), or to read such prints as it is."),
    "latin15": ("Early-modern Latin print: 15th-16th century types (synthetic)",
                "Latin set in incunabula and early 16th-century types (gotico-antiqua, "
                "rotunda-like and Renaissance Antiqua faces), trained on rendered lines only: "
                "no real line of such a print was in its training. A start for fine-tuning "
                "on a real book's lines; expect to need them."),
}
FONT_LICENSES = {
    "fonts-blankenburg": "SIL OFL 1.1", "fonts-ebgaramond": "SIL OFL 1.1",
    "fonts-linuxlibertine": "SIL OFL 1.1 / GPL-2+ with font exception",
    "fonts-oldstandard": "SIL OFL 1.1", "fonts-cardo": "SIL OFL 1.1",
    "fonts-gotico-antiqua": "SIL OFL 1.1", "fonts-junicode": "SIL OFL 1.1",
    "fonts-elstob": "SIL OFL 1.1", "fonts-goudybookletter": "SIL OFL 1.1",
}


def cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown CPU"
    info = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    get = lambda k: info.get(k, "").strip()   # noqa: E731
    flags = get("Flags").split()
    isa = ", ".join(f for f in ("avx512f", "avx512_bf16", "amx_tile") if f in flags)
    return (f"{get('Model name')} (family {get('CPU family')}, model {get('Model')}, "
            f"{get('CPU(s)')} cores; {isa or 'no AVX-512'})")


def main(name: str, data: Path, run: Path, epochs: int, net: list[str]) -> None:
    src = json.loads((data / "sources.json").read_text(encoding="utf-8"))
    kind = src["model"]
    title, summary = TITLES[kind]
    rendered = sum(1 for _ in (data / "render" / "list.tsv").open(encoding="utf-8"))
    lines = [dict(d) for d in src["real"]]
    fonts = src["fonts"]
    if kind == "latin15":
        rendered -= len(range(0, rendered, 20))     # every 20th validates (base_models.sh)
    lines.append({"corpus": "rendered by rnntrain-data render-lines", "lines": rendered,
                  "split": "train", "license": "generated (the faces: " + ", ".join(
                      sorted({FONT_LICENSES[p] for p in fonts})) + ")",
                  "source": f"text: {src['render_text']}; faces: " + ", ".join(
                      f"{p} ({', '.join(Path(f).stem for f in fs)})" for p, fs in fonts.items())})
    if kind == "latin15":
        lines.append({"corpus": "rendered (held out)", "lines": len(range(0, rendered + 1, 20)),
                      "split": "val", "license": "generated", "source": "every 20th rendered line"})
    licenses = sorted({d["license"] for d in src["real"]} | {"SIL OFL 1.1 (fonts)"})
    log = data / f"cpu_seconds-{name}.log"
    cpu_s = sum(float(x) for x in log.read_text().split()) if log.is_file() else 0.0
    status = json.loads((run / "status.json").read_text())
    import datetime
    date = datetime.datetime.fromtimestamp(status["updated"], datetime.timezone.utc)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    info = {
        "title": title, "summary": summary, "input_kind": "line images (grayscale or binary)",
        "data": lines, "licenses": licenses, "excluded": src.get("excluded", ""),
        "score_data": {
            "validation": ("archiscribe val: 64 lines of its 14 training works"
                           if kind == "de19" else "every 20th rendered line, held out"),
            "archiscribe-unseen-books": "archiscribe test: 145 lines of 4 works in no set",
            "ocrd-kant-page": "OCR-D's Kant page (1784): its 24 lines, a work in no set"},
        "training": {
            "command": f"recipes/base_models.sh {name}  (rnntrain train "
                       f"configs/printed_lines.toml {''.join(o + ' ' for o in net)}"
                       f"data.train={data}/train.nc "
                       f"data.val={data}/val.nc train.epochs={epochs} "
                       "optim.warmup_steps=100 augment.preset=lines-light compute.threads=2 "
                       "compute.intra_threads=1)",
            "date": date.strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu(),
            "epochs": status.get("epoch", epochs), "cpu_seconds": round(cpu_s),
            "commit": commit, "status": status.get("status")},
    }
    note = os.environ.get("NOTE", "")   # what the recipe's command does not say
    if note:
        info["training"]["note"] = note
    json.dump(info, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
