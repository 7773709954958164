#!/usr/bin/env bash
# YesNo: recordings → seeded 40/5/15 train/val/test lists → log-mel NetCDF → trained
# BLSTM-CTC → word errors on the 15 held-out recordings (best path and beam search).
#
#   recipes/yesno.sh [DATA_ROOT]      (default: $RNNTRAIN_DATA or ../shared/data)
#
# Generated files go to data/yesno/, the run to runs/yesno/. Extra arguments after
# DATA_ROOT are passed to `rnntrain train` as overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_ROOT="${1:-${RNNTRAIN_DATA:-../shared/data}}"
shift || true
REC="$DATA_ROOT/yesno/waves_yesno"
OUT=data/yesno
[ -d "$REC" ] || { echo "yesno.sh: no YesNo recordings at $REC (pass the data root)" >&2; exit 2; }
# the project's environment, set up on first use as run_train.sh does ($PYTHON: your own)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
# the data tools' module: data_tools in the repository, rnntrain_data installed (a folder
# that `rnntrain init --recipe` wrote: no scripts/env.sh there, the rnntrain on PATH is used)
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)

if [ ! -f "$OUT/test.nc" ]; then
    "$PY" -m "$DT" yesno-lists --recordings "$REC" --out "$OUT" --seed 1 --test 15 --val 5
    "$PY" -m "$DT" audio --list "$OUT/train.tsv" --out "$OUT/train.nc" \
        --features fbank --save-stats "$OUT/stats.json"
    for s in val test; do
        "$PY" -m "$DT" audio --list "$OUT/$s.tsv" --out "$OUT/$s.nc" --stats "$OUT/stats.json"
    done
fi
[ "${DATA_ONLY:-0}" = 1 ] && exit 0   # DATA_ONLY=1: make the data, train nothing (yesno_lm.sh)

RUN=runs/yesno
if [ -e "$RUN/checkpoints/last.pt" ]; then
    echo "$(basename "$0"): $RUN already holds a trained model; remove it to train again" >&2
    exit 2
fi
START=$(date +%s)
"$PY" -m rnntrain train configs/yesno.toml "$@"
echo "training wall time: $(( $(date +%s) - START )) s"
# best path and prefix beam search (width 8) on the held-out recordings
"$PY" -m rnntrain eval "$RUN/checkpoints/best.pt" "$OUT/test.nc" --beam 8
"$PY" -m rnntrain decode "$RUN/checkpoints/best.pt" "$OUT/test.nc" --beam 8
