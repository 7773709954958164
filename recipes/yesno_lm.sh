#!/usr/bin/env bash
# YesNo with decoding knowledge: a weak acoustic model (8 epochs, where training leaves the
# CTC blank plateau) decoded by best path, by beam search, and by beam search with a
# 3-gram LM built from the 40 training transcripts (text disjoint from the test lines);
# LM weight and word bonus tuned on the 5 validation recordings, scored on the 15 test ones.
#
#   recipes/yesno_lm.sh [DATA_ROOT]      (default: $RNNTRAIN_DATA or ../shared/data)
#
# Makes the data as recipes/yesno.sh does (data/yesno/), the run in runs/yesno_lm/.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_ROOT="${1:-${RNNTRAIN_DATA:-../shared/data}}"
OUT=data/yesno
# the project's environment, set up on first use as run_train.sh does ($PYTHON: your own)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
# the data tools' module: data_tools in the repository, rnntrain_data installed (a folder
# that `rnntrain init --recipe` wrote: no scripts/env.sh there, the rnntrain on PATH is used)
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)
DATA_ONLY=1 PYTHON="$PY" recipes/yesno.sh "$DATA_ROOT"   # the YesNo recipe's own data
RUN=runs/yesno_lm
if [ ! -e "$RUN/checkpoints/last.pt" ]; then
    "$PY" -m rnntrain train configs/yesno.toml train.epochs=8 "run.dir=\"$RUN\""
fi
# the LM: training transcripts only (the labels are the words "yes"/"no", so a model over
# words is a label-level model); 40 lines are too few for Kneser-Ney discounts: Witten-Bell
cut -f2 "$OUT/train.tsv" > "$RUN/lm_text.txt"
"$PY" -m "$DT" ngram "$RUN/lm_text.txt" --order 3 --smoothing wb --out "$RUN/yesno3.arpa"
"$PY" -m rnntrain tune-decoder "$RUN/checkpoints/last.pt" "$OUT/val.nc" --lm "$RUN/yesno3.arpa" \
    --lm-weights 0,0.5,1,2 --word-bonuses 0,1,2,4 --json > "$RUN/tune.json"
read -r W B < <("$PY" -c "import json,sys; b=json.load(open(sys.argv[1]))['best']; \
print(b['lm_weight'], b['word_bonus'])" "$RUN/tune.json")
echo "tuned on validation: --lm-weight $W --word-bonus $B"
"$PY" -m rnntrain eval "$RUN/checkpoints/last.pt" "$OUT/test.nc" --beam 8
"$PY" -m rnntrain eval "$RUN/checkpoints/last.pt" "$OUT/test.nc" --beam 8 \
    --lm "$RUN/yesno3.arpa" --lm-weight "$W" --word-bonus "$B"
