"""``rnntrain models``: the zoo of named base models (``rnntrain.artifact.zoo``).

    rnntrain models                   list the models: name, size, scores, title
    rnntrain models NAME [--json]     print NAME's card
    rnntrain models NAME --pack CHECKPOINT --info INFO.json --out DIR [--score SET=DATA]...
                                      make zoo model NAME from a trained checkpoint

Packing keeps what inference and fine-tuning need (the card and the inference weights,
by default as float16: half the bytes) and writes ``DIR/NAME.pt`` and ``DIR/NAME.json``.
Each ``--score`` runs ``rnntrain eval`` on the packed file, so the card's figures are
those of the file that ships. ``INFO.json`` gives what the checkpoint cannot know: title,
summary, data (corpora, lines, licenses), licenses, and the training's command, date, CPU
and CPU seconds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rnntrain.errors import UserError


def add_parser(sub):
    m = sub.add_parser("models", help="list the base models that ship with rnntrain, show "
                       "one's card, or pack a trained model into a zoo folder",
                       description="Without NAME: the zoo's models (the package's own and "
                       "those in $RNNTRAIN_MODELS folders). With NAME: its model card. A zoo "
                       "name works wherever a model path does (transcribe, eval, decode, "
                       "export, finetune, train.init_from, crossfold).")
    m.add_argument("name", nargs="?", help="a zoo model's name")
    m.add_argument("--json", action="store_true", help="the card (or the list) as JSON")
    m.add_argument("--pack", metavar="CHECKPOINT", help="make zoo model NAME from this "
                   "checkpoint or run folder (its best.pt)")
    m.add_argument("--info", metavar="INFO.json", help="with --pack: the card's title, "
                   "summary, data, licenses and training record")
    m.add_argument("--out", metavar="DIR", help="with --pack: the zoo folder to write into")
    m.add_argument("--score", action="append", default=[], metavar="SET=DATA.nc",
                   help="with --pack: score the packed model on DATA.nc and record it on the "
                        "card as SET (repeatable)")
    m.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                   help="with --pack: how the weights are stored (default float16)")
    return m


def run(args) -> int:
    from rnntrain.artifact import zoo
    if args.pack:
        if not (args.name and args.info and args.out):
            raise UserError("--pack needs NAME, --info INFO.json and --out DIR")
        card = pack(args.pack, args.name, Path(args.info), Path(args.out), args.score,
                    args.dtype)
        print(f"wrote {Path(args.out) / card['file']} ({card['file_bytes']:,} bytes) and "
              f"{Path(args.out) / (args.name + '.json')}")
        return 0
    for opt in ("info", "out"):
        if getattr(args, opt):
            raise UserError(f"--{opt} goes with --pack")
    if args.name:
        c = zoo.card(args.name)
        print(json.dumps(c, indent=1, ensure_ascii=False) if args.json else zoo.card_text(c))
        return 0
    cards = [zoo.card(n) for n in zoo.names()]
    if args.json:
        print(json.dumps(cards, indent=1, ensure_ascii=False))
        return 0
    if not cards:
        print("no models (the zoo folders: " + ", ".join(map(str, zoo.folders())) + ")")
        return 0
    print(f"{'name':<16} {'bytes':>10}  {'scores (CER)':<34} title")
    for c in cards:
        scores = ", ".join(f"{k} {100 * s['cer']:.2f} %" for k, s in c["scores"].items())
        print(f"{c['name']:<16} {c['file_bytes']:>10,}  {scores:<34} {c['title']}")
    print("\nrnntrain models NAME shows a card; a name works wherever a model path does")
    return 0


def pack(source: str, name: str, info_path: Path, out: Path, scores: list[str],
         dtype: str = "float16") -> dict:
    """Write zoo model ``name`` (``out/name.pt`` and its card ``out/name.json``) from the
    checkpoint or run folder ``source``; returns the card."""
    import torch
    from rnntrain.artifact import zoo
    from rnntrain.artifact.paths import resolve
    from rnntrain.frontend.images import label_char
    from rnntrain.fsutil import atomic_write, check_output
    from rnntrain.run import checkpoint as ckpt
    if not zoo.NAME.match(name):
        raise UserError(f"{name!r}: a zoo name is lower-case letters, digits, '.', '_' and "
                        f"'-', starting with a letter or digit, 64 characters at most")
    sets = []
    for s in scores:
        label, sep, data = s.partition("=")
        if not (sep and label and data):
            raise UserError(f"--score {s!r}: give SET=DATA.nc")
        sets.append((label, data))
    src = resolve(source)
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"--info {info_path}: not a readable JSON file ({e})") from None
    if not isinstance(info, dict):
        raise UserError(f"--info {info_path}: not a JSON object")
    pt, js = out / f"{name}.pt", out / f"{name}.json"
    inputs = [src, info_path, *(d for _, d in sets)]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out {out}: cannot make the folder ({e.strerror or e})") from None
    check_output(str(pt), inputs, what="--out")
    check_output(str(js), inputs, what="--out")
    ck = ckpt.read(src)
    weights = {k: (v.to(getattr(torch, dtype)) if v.is_floating_point() else v)
               for k, v in ck.inference_weights().items()}
    card = ck.card
    card.weights = "model"
    ckpt.save_atomic({"format": ckpt.FORMAT_VERSION, **card.state_dict(), "model": weights},
                     pt)
    net = card.build(pt)
    n_params = sum(p.numel() for p in net.parameters())
    image = json.loads(card.image_frontend) if card.image_frontend else {}
    model = card.config.get("model", {})
    state = ck.parts.get("state") or {}
    c = {"name": name, "title": info.get("title", ""), "summary": info.get("summary", ""),
         "file": pt.name, "file_bytes": pt.stat().st_size, "sha256": zoo.sha256(pt),
         "weights_dtype": dtype,
         "alphabet": [label_char(n, image.get("space", "<space>")) for n in card.labels],
         "input": {"height": card.image_height, "layout": image.get("layout", ""),
                   "trim": image.get("trim", "none"), "invert": image.get("invert", "auto"),
                   "kind": info.get("input_kind", "")},
         "architecture": {"frontend": model.get("frontend"),
                          "conv_channels": model.get("conv_channels"),
                          "layers": model.get("layers"), "hidden": model.get("hidden"),
                          "bidirectional": model.get("bidirectional"),
                          "dropout": model.get("dropout"), "parameters": n_params},
         "data": info.get("data", []), "licenses": info.get("licenses", []),
         "excluded": info.get("excluded", ""),
         "scores": {},
         "training": {**info.get("training", {}),
                      "epochs": info.get("training", {}).get("epochs", state.get("epoch")),
                      "source_checkpoint": str(source)}}
    for label, data in sets:
        c["scores"][label] = {**score(pt, data), "data": info.get("score_data", {}).get(
            label, str(data))}
    missing = zoo.missing_fields(c)
    if missing:
        pt.unlink()
        raise UserError(f"--info {info_path}: the card would lack {', '.join(missing)}")
    atomic_write(js, json.dumps(c, indent=1, ensure_ascii=False) + "\n")
    return c


def score(model: Path, data: str) -> dict:
    """``rnntrain eval MODEL DATA --json`` (the command a user runs) → the card's figures."""
    env = {**os.environ}
    p = subprocess.run([sys.executable, "-m", "rnntrain", "eval", str(model), str(data),
                        "--json"], capture_output=True, text=True, env=env)
    if p.returncode:
        raise UserError(f"--score {data}: rnntrain eval failed: "
                        f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"cer": r["ler"], "sub": r["sub"], "del": r["del"], "ins": r["ins"],
            "lines": r["seqs"], "characters": r["ref_labels"]}
