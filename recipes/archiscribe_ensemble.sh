#!/usr/bin/env bash
# Real printed lines (archiscribe: 19th-century German, Fraktur and Antiqua; 503 training
# lines, 145 test lines from 4 books no training line comes from): one model against an
# ensemble of 5 models trained on the 5 folds of the training lines, read together by
# Calamari's confidence voting and by posterior averaging. docs/accuracy.md, "Ensembles".
#
#   recipes/archiscribe_ensemble.sh [OVERRIDES...]   (overrides go to every training)
#
# Environment: ARCHISCRIBE (default ../shared/data/archiscribe: line images WORK/ID.png
# beside WORK/ID.gt.txt, and split.tsv), HEIGHT (32), EPOCHS (20), FOLDS (5).
# Data go to data/archiscribe/, the runs to runs/archiscribe/ (single, crossfold/fold-i).
# Run it again after an interruption: finished runs are kept, interrupted ones resume.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's environment as run_train.sh sets it up ($PYTHON: your own; a folder that
# `rnntrain init --recipe` wrote has no scripts/env.sh: the rnntrain on PATH is used)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)  # installed: rnntrain_data
SRC=${ARCHISCRIBE:-../shared/data/archiscribe}
HEIGHT=${HEIGHT:-32}
EPOCHS=${EPOCHS:-20}
FOLDS=${FOLDS:-5}
OUT=data/archiscribe
RUN=runs/archiscribe
[ -f "$SRC/split.tsv" ] || { echo "$(basename "$0"): $SRC/split.tsv not found (set ARCHISCRIBE)" >&2; exit 2; }

if [ ! -f "$OUT/test.nc" ]; then
    mkdir -p "$OUT"
    # LIST.tsv per split (image path, its .gt.txt), and one of every line for the alphabet
    "$PY" - "$SRC" "$OUT" <<'EOF'
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
EOF
    # one alphabet for the three sets: every character of the corpus. Margins kept as the
    # corpus cut the lines (--trim none: docs/accuracy.md's figures were measured so)
    "$PY" -m "$DT" images --list "$OUT/all.tsv" --out "$OUT/all.nc" --chars \
        --height "$HEIGHT" --trim none
    for s in train val test; do
        "$PY" -m "$DT" images --list "$OUT/$s.tsv" --out "$OUT/$s.nc" --chars \
            --height "$HEIGHT" --trim none --labels-from "$OUT/all.nc"
    done
    rm "$OUT/all.nc"
fi

# the printed-lines model (configs/printed_lines.toml) with larger batches: the lines are
# 700 columns wide on average
common=(data.train="$OUT/train.nc" data.test="$OUT/test.nc" train.epochs="$EPOCHS"
        batch.batch_frames=12000 log.progress=lines)
START=$(date +%s)
if [ ! -e "$RUN/single/checkpoints/last.pt" ] || \
        ! grep -q '"finished"' "$RUN/single/status.json" 2>/dev/null; then
    "$PY" -m rnntrain train configs/printed_lines.toml "${common[@]}" data.val="$OUT/val.nc" \
        run.dir="$RUN/single" --resume if-any "$@"
fi
echo "single model: $(( $(date +%s) - START )) s"
"$PY" -m rnntrain crossfold configs/printed_lines.toml --folds "$FOLDS" --out "$RUN/crossfold" \
    "${common[@]}" "$@"
echo "single model and $FOLDS folds: $(( $(date +%s) - START )) s"

echo "one model (all training lines):"
"$PY" -m rnntrain eval "$RUN/single" "$OUT/test.nc"
cat "$RUN/crossfold/ensemble.md"   # the folds together both ways, and each alone
