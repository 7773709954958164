"""``rnntrain finetune BASE INPUT... --out RUN``: a base model fitted to a user's book.

    rnntrain finetune de19-small lines/ --out runs/mybook           # .png + .gt.txt folder
    rnntrain finetune de19-small pages/*.xml --out runs/mybook      # PAGE-XML pages
    rnntrain finetune de19-small lines/ --val held-out/ --test unseen/ --out runs/mybook

What it does, each step the command a user could run by hand:

1. **Data with the base model's geometry.** INPUT (line images with ``.gt.txt`` beside
   them, folders of them, LIST.tsv files, or PAGE-XML/ALTO pages) goes through
   ``rnntrain-data images`` (``pagexml`` for pages) with the height, trim, invert and
   layout on the base model's card, into ``RUN/data/train.nc``. A held-out part for early
   stopping: ``--val`` lines, else ``--val-fraction`` of INPUT drawn at random (at least
   ``MIN_VAL`` lines). ``--test``: lines scored once at the end (the unseen-line score).
   A ``.nc`` input is used as it is, and must have the base model's input side.
2. **Training from the base weights** (``train.init_from``) with the base model's own
   ``[model]`` section and LSTM kernel, the alphabet merged (``train.init_alphabet =
   "merge"``: every label the base knows is kept, the book's new ones are added), and a
   fine-tuning schedule (``SCHEDULE``): a lower learning rate than training from scratch,
   a short warm-up, a cosine decay, light augmentation, and early stopping after
   ``--patience`` validations without a gain. The budget is ``--steps`` optimizer steps
   (about; whole epochs), so 60 lines and 500 lines get the same number of updates.
3. The run folder is an ordinary one: ``rnntrain transcribe RUN page.png``, ``eval``,
   ``export``; a killed fine-tuning resumes when the same command runs again.

Any ``section.key=value`` override goes to the training last (``optim.lr=0.001``).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from rnntrain.errors import UserError

MIN_VAL = 4            # held-out lines drawn from INPUT at least
# the fine-tuning schedule's settings (docs/ocr.md, "Fine-tuning a base model": measured)
SCHEDULE = {"optim.lr": 0.0005, "optim.schedule": "cosine", "optim.warmup_steps": 20,
            "optim.min_lr": 0.00001, "augment.preset": "lines-light",
            "train.init_alphabet": "merge", "train.val_every_epochs": 1,
            "train.val_at_start": True}
STEPS = 1500           # default budget in optimizer steps
MAX_EPOCHS = 200


def add_parser(sub):
    f = sub.add_parser("finetune", help="fine-tune a base model (a zoo name or any model) "
                       "on a folder of line images with .gt.txt, or PAGE-XML pages",
                       description="Converts INPUT with the base model's line geometry, "
                       "trains from its weights with the alphabet merged, a fine-tuning "
                       "schedule and early stopping on held-out lines, and scores the result "
                       "(docs/ocr.md). section.key=value overrides go to the training.")
    f.add_argument("base", help="base model: a zoo name (rnntrain models), checkpoint or "
                   "run folder")
    f.add_argument("inputs", nargs="+", metavar="INPUT", help="line images with .gt.txt, "
                   "folders of them, LIST.tsv files, PAGE-XML/ALTO pages, or one .nc file")
    f.add_argument("--out", required=True, help="the run folder to write (RUN/data: the "
                   "converted lines)")
    f.add_argument("--val", nargs="+", metavar="VAL", help="held-out lines for early "
                   "stopping (default: --val-fraction of INPUT)")
    f.add_argument("--val-fraction", type=float, default=0.1, help="share of INPUT held out "
                   f"when no --val is given (default 0.1, at least {MIN_VAL} lines)")
    f.add_argument("--test", nargs="+", metavar="TEST", help="lines scored once at the end "
                   "with the best checkpoint (never trained on, never used to stop)")
    f.add_argument("--steps", type=int, default=STEPS, help="budget in optimizer steps "
                   f"(rounded to whole epochs; default {STEPS})")
    f.add_argument("--patience", type=int, default=5, help="stop after this many epochs "
                   "without a better held-out score (0: never; default 5)")
    f.add_argument("--seed", type=int, default=1, help="seed of the held-out draw and the "
                   "training")
    f.set_defaults(overrides=[])
    return f


def data_tool() -> list[str]:
    """The data tools' command (rnntrain-data) as this interpreter runs it."""
    return [sys.executable, "-m", "rnntrain_data"]


def image_args(card) -> list[str]:
    """The converter's options that give lines the base model's geometry."""
    if not card.image_height or not card.image_frontend:
        raise UserError("the base model was not trained on line images (its card has no "
                        "image geometry): fine-tune it with rnntrain train and "
                        "train.init_from on data converted like its own")
    im = json.loads(card.image_frontend)
    if not im.get("chars"):
        raise UserError("the base model's labels are not characters (--chars): fine-tune "
                        "it with rnntrain train and train.init_from")
    trim = im.get("trim", -1)
    return ["--chars", "--height", str(im.get("height", card.image_height)),
            "--trim", "none" if trim < 0 else str(trim), "--invert", im.get("invert", "auto"),
            "--layout", im.get("layout", "2d"), "--space", im.get("space", "<space>")]


def convert(inputs: list[str], out: Path, geometry: list[str], extra: list[str]) -> None:
    """``rnntrain-data images`` (or ``pagexml`` when every input is an .xml page) →
    ``out`` (a .nc, or with ``--split`` in ``extra`` the stem of OUT-train.nc ...)."""
    xml = [i for i in inputs if i.lower().endswith(".xml")]
    if xml and len(xml) != len(inputs):
        raise UserError(f"{xml[0]}: give PAGE-XML pages or line images, not both in one "
                        "set")
    tool = "pagexml" if xml else "images"
    cmd = [*data_tool(), tool, *inputs, "--out", str(out), *geometry, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        last = (p.stderr.strip().splitlines() or ["failed"])[-1]
        raise UserError(last.split(": error: ", 1)[-1] if ": error: " in last else last)
    print(p.stdout.strip().splitlines()[-1] if p.stdout.strip() else f"wrote {out}")


def prepare(args, card, data: Path) -> tuple[str, str, str]:
    """RUN/data's sets → (train, val, test) .nc paths ("" for none)."""
    from rnntrain.fsutil import check_output
    data.mkdir(parents=True, exist_ok=True)
    geometry = image_args(card)
    train, val = data / "train.nc", data / "val.nc"
    test = data / "test.nc" if args.test else None
    named = [Path(p) for p in [*args.inputs, *(args.val or []), *(args.test or [])]]
    for f in (train, val, test):
        if f is not None:
            check_output(str(f), named, what="--out")
    if args.val:
        convert(args.inputs, train, geometry, [])
        convert(args.val, val, geometry, ["--labels-from", str(train)])
    else:
        n = count_lines(args.inputs)
        frac = min(0.5, max(args.val_fraction, MIN_VAL / max(n, 1)))
        if n < 2 * MIN_VAL:
            raise UserError(f"{' '.join(args.inputs)}: {n} lines; fine-tuning needs at least "
                            f"{2 * MIN_VAL} (or --val with held-out lines)")
        stem = data / "lines"
        convert(args.inputs, stem, geometry, ["--split", f"{1 - frac:.6f},{frac:.6f}",
                                              "--seed", str(args.seed)])
        Path(f"{stem}-train.nc").replace(train)
        Path(f"{stem}-val.nc").replace(val)
    if test is not None:
        convert(args.test, test, geometry, ["--labels-from", str(train)])
    return str(train), str(val), str(test or "")


def count_lines(inputs: list[str]) -> int:
    """How many lines INPUT holds (images with a .gt.txt, LIST.tsv rows, PAGE TextLines)
    without converting them: enough to size the held-out part."""
    n = 0
    for i in inputs:
        p = Path(i)
        if p.is_dir():
            n += sum(1 for _ in p.rglob("*.gt.txt"))
        elif p.suffix.lower() == ".tsv" and p.is_file():
            n += sum(1 for ln in p.read_text(encoding="utf-8", errors="replace").splitlines()
                     if ln.strip() and not ln.startswith("#"))
        elif p.suffix.lower() == ".xml" and p.is_file():
            n += p.read_text(encoding="utf-8", errors="replace").count("<TextLine") or \
                p.read_text(encoding="utf-8", errors="replace").count("<pc:TextLine")
        else:
            n += 1
    return n


def budget(frames: int, batch_frames: int, steps: int) -> tuple[int, int]:
    """(about how many steps an epoch of ``frames`` takes, whole epochs for ``steps``): the
    plan packs about ``batch_frames`` padded frames a step (padding: about 10 %)."""
    per_epoch = max(1, math.ceil(frames * 1.1 / batch_frames))
    return per_epoch, max(1, min(MAX_EPOCHS, round(steps / per_epoch)))


def run(args) -> int:
    from rnntrain.artifact.paths import resolve
    from rnntrain.artifact.runfolder import RunFolder
    from rnntrain.config import config_from_dict, load_config, to_toml
    from rnntrain.data.dataset import Dataset
    from rnntrain.fsutil import atomic_write
    from rnntrain.run import checkpoint as ckpt
    if args.steps < 1:
        raise UserError(f"--steps {args.steps}: give a positive number")
    if not 0 < args.val_fraction < 1:
        raise UserError(f"--val-fraction {args.val_fraction}: give a share between 0 and 1")
    base = resolve(args.base, "base model")
    card = ckpt.read(base).card
    out = Path(args.out)
    run_folder = RunFolder(out)
    resuming = run_folder.training_checkpoints() != []
    data = run_folder.data
    if len(args.inputs) == 1 and args.inputs[0].endswith(".nc") and not args.val:
        raise UserError(f"{args.inputs[0]}: a .nc input needs --val (a .nc of held-out "
                        "lines)")
    if resuming and (data / "train.nc").is_file():
        train = str(data / "train.nc")
        val = str(data / "val.nc")
        test = str(data / "test.nc") if (data / "test.nc").is_file() else ""
        print(f"{out}: resuming the fine-tuning (its data as converted then)")
    elif args.inputs[0].endswith(".nc"):
        train, val = args.inputs[0], args.val[0]
        test = args.test[0] if args.test else ""
    else:
        train, val, test = prepare(args, card, data)
    ds = Dataset.open(train, need_targets=True)
    if ds.is_2d:
        ds.set_pad_height(card.image_height or 1, f"base model {args.base}")
    card.check_input(ds, f"base model {args.base}",
                     {"frontend": card.config.get("model", {}).get("frontend", "none")})
    # the budget in whole epochs: the plan packs about batch_frames padded frames a step
    cfg0 = card.train_config(base)
    steps_per_epoch = max(1, math.ceil(int(ds.lengths.sum()) * 1.1 / cfg0.batch.batch_frames))
    epochs = max(1, min(MAX_EPOCHS, round(args.steps / steps_per_epoch)))
    overrides = [f"{k}={json.dumps(v)}" for k, v in SCHEDULE.items()] + [
        f"data.train={json.dumps(train)}", f"data.val={json.dumps(val)}",
        f"data.test={json.dumps(test)}", "data.folds=0",
        f"train.init_from={json.dumps(str(base))}", f"train.epochs={epochs}",
        f"train.patience={args.patience}", f"train.seed={args.seed}",
        f"run.dir={json.dumps(str(out))}", *args.overrides]
    # the base model's own config (its [model] section and LSTM kernel): written as the
    # run's starting config, so that the run folder's config.toml says what it trained
    data.mkdir(parents=True, exist_ok=True)
    base_toml = data / "base.toml"
    base_cfg = config_from_dict(card.config)
    atomic_write(base_toml, to_toml(base_cfg))
    cfg = load_config(str(base_toml), overrides)
    print(f"fine-tuning {args.base} on {ds.num_seqs} lines: {epochs} epochs of about "
          f"{steps_per_epoch} steps, early stopping after {args.patience} epochs without a "
          f"gain on {val}")
    from rnntrain.compute import allocator
    allocator.configure(cfg.compute.allocator)
    from rnntrain.run.train import train as run_training
    run_training(cfg, str(base_toml), overrides, resume="auto" if resuming else None)
    return 0
