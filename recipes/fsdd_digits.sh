#!/usr/bin/env bash
# FSDD connected digits: recordings → digit strings → log-mel NetCDF → trained BLSTM-CTC →
# test label error rate (best path and beam search).
#
#   recipes/fsdd_digits.sh [DATA_ROOT]      (default: $RNNTRAIN_DATA or ../shared/data)
#
# Train strings use takes 10-49, validation strings takes 5-9 (both FSDD's train split),
# the 500 test strings takes 0-4 (FSDD's test split) with a seed used nowhere else.
# Generated WAVs and .nc files go to data/fsdd/, the run to runs/fsdd_digits/.
# Extra arguments after DATA_ROOT are passed to `rnntrain train` as overrides.
# DATA_ONLY=1 makes the data and stops (python -m bench accuracy uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_ROOT="${1:-${RNNTRAIN_DATA:-../shared/data}}"
shift || true
REC="$DATA_ROOT/fsdd/recordings"
OUT=data/fsdd
[ -d "$REC" ] || { echo "fsdd_digits.sh: no FSDD recordings at $REC (pass the data root)" >&2; exit 2; }
# the project's environment, set up on first use as run_train.sh does ($PYTHON: your own)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
# the data tools' module: data_tools in the repository, rnntrain_data installed (a folder
# that `rnntrain init --recipe` wrote: no scripts/env.sh there, the rnntrain on PATH is used)
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)

if [ ! -f "$OUT/test.nc" ]; then
    rm -rf "$OUT"
    "$PY" -m "$DT" fsdd-strings --recordings "$REC" --split train --takes 10-49 \
        --count 1500 --digits 3-7 --seed 11 --out "$OUT/train"
    "$PY" -m "$DT" fsdd-strings --recordings "$REC" --split train --takes 5-9 \
        --count 300 --digits 3-7 --seed 12 --out "$OUT/val"
    "$PY" -m "$DT" fsdd-strings --recordings "$REC" --split test \
        --count 500 --digits 3-7 --seed 13 --out "$OUT/test"
    # statistics from the training list only; validation and test reuse them
    "$PY" -m "$DT" audio --list "$OUT/train/list.tsv" --out "$OUT/train.nc" \
        --features fbank --save-stats "$OUT/stats.json"
    for s in val test; do
        "$PY" -m "$DT" audio --list "$OUT/$s/list.tsv" --out "$OUT/$s.nc" --stats "$OUT/stats.json"
    done
fi
[ "${DATA_ONLY:-0}" = 1 ] && exit 0   # DATA_ONLY=1: make the data, train nothing

RUN=runs/fsdd_digits
if [ -e "$RUN/checkpoints/last.pt" ]; then
    echo "$(basename "$0"): $RUN already holds a trained model; remove it to train again" >&2
    exit 2
fi
START=$(date +%s)
"$PY" -m rnntrain train configs/fsdd_digits.toml "$@"
echo "training wall time: $(( $(date +%s) - START )) s"
# best path and prefix beam search (width 8) on the test set
"$PY" -m rnntrain eval "$RUN/checkpoints/best.pt" "$OUT/test.nc" --beam 8
