#!/usr/bin/env bash
# Real printed lines (archiscribe: 19th-century German, Fraktur and Antiqua; 503 training
# lines, 145 test lines from 4 books no training line comes from): one model against an
# ensemble of 5 models trained on the 5 folds of the training lines, read together by
# Calamari's confidence voting and by posterior averaging. docs/accuracy.md, "archiscribe".
#
#   recipes/archiscribe_ensemble.sh [OVERRIDES...]   (overrides go to every training)
#
# Environment: ARCHISCRIBE (default ../shared/data/archiscribe: line images WORK/ID.png
# beside WORK/ID.gt.txt, and split.tsv), HEIGHT (48), EPOCHS (30), FOLDS (5),
# AUGMENT (lines-light; or none, or another [augment] preset: lines), and MEMBERS: "scratch"
# (default: each fold trains EPOCHS epochs from random weights, as Calamari's folds do) or
# "finetune" (each fold starts from the single model and trains FT_EPOCHS (2) more
# epochs on its 4/5 of the lines: about FT_EPOCHS/EPOCHS of the cost; the fair baseline,
# the single model trained FT_EPOCHS more epochs on all lines, is trained beside them).
# (measured with FT_EPOCHS=2: voting 2.64 %, averaging 2.62 %, the single model 2.61 %;
# a second seed of the single model: 3.08 %.)
# Data go to data/archiscribe-hHEIGHT/, the runs to runs/archiscribe-hHEIGHT/ (single,
# crossfold or single-ft and crossfold-ft). Run it again after an interruption: finished
# runs are kept, interrupted ones resume (with the same environment and overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's environment as run_train.sh sets it up ($PYTHON: your own; a folder that
# `rnntrain init --recipe` wrote has no scripts/env.sh: the rnntrain on PATH is used)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)  # installed: rnntrain_data
SRC=${ARCHISCRIBE:-../shared/data/archiscribe}
HEIGHT=${HEIGHT:-48}
EPOCHS=${EPOCHS:-30}
FOLDS=${FOLDS:-5}
AUGMENT=${AUGMENT:-lines-light}
MEMBERS=${MEMBERS:-scratch}
FT_EPOCHS=${FT_EPOCHS:-2}
OUT=data/archiscribe-h$HEIGHT     # one folder per height: a rerun never mixes two
RUN=runs/archiscribe-h$HEIGHT
[ -f "$SRC/split.tsv" ] || { echo "$(basename "$0"): $SRC/split.tsv not found (set ARCHISCRIBE)" >&2; exit 2; }
case "$MEMBERS" in scratch|finetune) ;; *)
    echo "$(basename "$0"): MEMBERS=$MEMBERS: give scratch or finetune" >&2; exit 2;; esac

if [ ! -f "$OUT/test.nc" ]; then
    mkdir -p "$OUT"
    # LIST.tsv per split (image path, its .gt.txt), and one of every line for the alphabet
    "$PY" - "$SRC" "$OUT" <<'PYEOF'
import sys
from pathlib import Path
src, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
rows = [ln.split("\t") for ln in (src / "split.tsv").read_text(encoding="utf-8").splitlines()[1:]]
lists = {"train": [], "val": [], "test": []}
for image, split in rows:
    text = (src / (image.rsplit(".", 1)[0] + ".gt.txt")).read_text(encoding="utf-8")
    lists[split].append(f"{src / image}\t{text.strip()}")
lists["all"] = [ln for s in ("train", "val", "test") for ln in lists[s]]
for name, lines in lists.items():
    (out / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
PYEOF
    # one alphabet for the three sets: every character of the corpus. Margins kept as the
    # corpus cut the lines (--trim none: docs/accuracy.md, "Line geometry")
    "$PY" -m "$DT" images --list "$OUT/all.tsv" --out "$OUT/all.nc" --chars \
        --height "$HEIGHT" --trim none
    for s in train val test; do
        "$PY" -m "$DT" images --list "$OUT/$s.tsv" --out "$OUT/$s.nc" --chars \
            --height "$HEIGHT" --trim none --labels-from "$OUT/all.nc"
    done
    rm "$OUT/all.nc"
fi

# the printed-lines model (configs/printed_lines.toml: batches of 3000 columns, about 240
# steps an epoch here; 12000-column batches gave a quarter of the steps and learnt slower)
common=(data.train="$OUT/train.nc" data.test="$OUT/test.nc" log.progress=lines)
[ "$AUGMENT" = none ] || common+=("augment.preset=$AUGMENT")
finished() { [ -e "$1/checkpoints/last.pt" ] && grep -q '"finished"' "$1/status.json" 2>/dev/null; }
START=$(date +%s)
finished "$RUN/single" || "$PY" -m rnntrain train configs/printed_lines.toml "${common[@]}" \
    data.val="$OUT/val.nc" train.epochs="$EPOCHS" run.dir="$RUN/single" --resume if-any "$@"
echo "single model: $(( $(date +%s) - START )) s"
if [ "$MEMBERS" = scratch ]; then
    CF=$RUN/crossfold
    "$PY" -m rnntrain crossfold configs/printed_lines.toml --folds "$FOLDS" --out "$CF" \
        "${common[@]}" train.epochs="$EPOCHS" "$@"
    echo "one model (all training lines):"
    "$PY" -m rnntrain eval "$RUN/single" "$OUT/test.nc"
else
    CF=$RUN/crossfold-ft
    ft=(train.init_from="$RUN/single" train.epochs="$FT_EPOCHS")
    finished "$RUN/single-ft" || "$PY" -m rnntrain train configs/printed_lines.toml \
        "${common[@]}" "${ft[@]}" data.val="$OUT/val.nc" run.dir="$RUN/single-ft" --resume if-any "$@"
    "$PY" -m rnntrain crossfold configs/printed_lines.toml --folds "$FOLDS" --out "$CF" \
        "${common[@]}" "${ft[@]}" "$@"
    echo "one model (all training lines), and the same $FT_EPOCHS epochs longer:"
    "$PY" -m rnntrain eval "$RUN/single" "$OUT/test.nc"
    "$PY" -m rnntrain eval "$RUN/single-ft" "$OUT/test.nc"
fi
echo "single model and $FOLDS folds: $(( $(date +%s) - START )) s"
cat "$CF/ensemble.md"   # the folds together both ways, and each alone
