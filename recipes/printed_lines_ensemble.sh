#!/usr/bin/env bash
# Printed text lines, the full combination for little data: 5 models, each trained on 4 of
# the 5 folds of the training lines (rnntrain crossfold), read together by Calamari's
# confidence voting and by posterior averaging; character error rate on the unseen font
# (recipes/printed_lines.sh's data and model: docs/recipes.md).
#
#   recipes/printed_lines_ensemble.sh [OVERRIDES...]   (overrides go to every fold)
#
# Environment: FOLDS (default 5), AUGMENT (default "none": no augmentation; or the
# [augment] preset every fold trains with, "lines-light" or "lines": rnntrain.augment;
# measured on the single model at the recipe's 12 epochs with the earlier twelve-DejaVu
# training faces, neither helps the unseen font: 18.1 % CER without, 19.3 % with
# lines-light, 31.5 % with lines; seed 2: 14.8 % without, 15.3 % with lines-light; the
# recipe's seventeen faces (DejaVu + Computer Modern) give 10.5 % / 11.6 % without, and
# 2.79 % / 3.07 % (seeds 1 / 2) with its lines trimmed to their ink; docs/accuracy.md), and recipes/printed_lines.sh's
# FONTS, TRIM, TRAIN_LINES, VAL_LINES, TEST_LINES. Each fold trains what the single model
# does: 6 epochs on the trimmed lines (12 with TRIM=none).
# Data go to data/printed_lines/ (made once, shared with printed_lines.sh), the folds to
# runs/printed_lines_ensemble/fold-0 .. fold-4. Run it again after an interruption: the
# finished folds are kept and the interrupted one resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's environment as run_train.sh sets it up ($PYTHON: your own; a folder that
# `rnntrain init --recipe` wrote has no scripts/env.sh: the rnntrain on PATH is used)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
FOLDS=${FOLDS:-5}
AUGMENT=${AUGMENT:-none}
OUT=runs/printed_lines_ensemble
START=$(date +%s)
recipes/printed_lines.sh --data-only

extra=()
[ "$AUGMENT" = none ] || extra=("augment.preset=$AUGMENT")
# the single model's budget (printed_lines.sh): trimmed lines are about 1.8 times as wide,
# so 6 epochs cost what the config's 12 untrimmed ones do; your overrides come after and win
[ "${TRIM:-2}" = none ] || extra+=(train.epochs=6)
"$PY" -m rnntrain crossfold configs/printed_lines.toml --folds "$FOLDS" --out "$OUT" \
    ${extra[@]+"${extra[@]}"} "$@"

# crossfold scored the unseen font (data.test) at its end: the ensemble both ways and
# each fold alone (the test score its training logged)
cat "$OUT/ensemble.md"
echo "whole script wall time: $(( $(date +%s) - START )) s"
