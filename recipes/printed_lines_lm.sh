#!/usr/bin/env bash
# Printed text lines with a language model: the printed-lines OCR model (recipes/
# printed_lines.sh) decoded on its unseen-font test set by beam search without and with a
# character n-gram LM, and with a word n-gram LM + lexicon. CER (= LER: labels are
# characters) and WER (words = the labels between <space>s) for each.
#
#   recipes/printed_lines_lm.sh
#
# Environment (defaults in brackets):
#   PL_DATA   the printed-lines data folder, with val.nc, test.nc, {train,val,test}/list.tsv
#             [data/printed_lines]
#   PL_MODEL  the trained checkpoint [runs/printed_lines/checkpoints/best.pt]; when it is
#             missing (and PL_MODEL is not set) recipes/printed_lines.sh runs first
#   LM_RUN    where the LM files and results go [runs/printed_lines_lm]
#   LM_LINES  lines of LM training text [100000];  LM_SEED  its seed [31]
#   LM_ORDERS character n-gram orders to try [4 5 6 7 8]
#
# LM text: Faker's en_US providers (the `faker` package, MIT licence), the generator the
# rendered lines come from (rnntrain-data render-lines), with another seed (the rendered
# sets use 21, 22, 23), cut at word boundaries to the longest rendered line; every LM line
# equal to a validation or test transcript is dropped (`rnntrain-data faker-text
# --exclude`: it reports how many), so the LM never saw an evaluation line verbatim.
# The character LM's order is the one with the lowest perplexity on the validation
# transcripts; LM weight and label bonus are tuned on val.nc (seen fonts) by
# `rnntrain tune-decoder`, then applied once to test.nc (the unseen font).
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's environment, set up on first use as run_train.sh does ($PYTHON: your own)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
# the data tools' module: data_tools in the repository, rnntrain_data installed (a folder
# that `rnntrain init --recipe` wrote: no scripts/env.sh there, the rnntrain on PATH is used)
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)
DATA=${PL_DATA:-data/printed_lines}
MODEL=${PL_MODEL:-runs/printed_lines/checkpoints/best.pt}
RUN=${LM_RUN:-runs/printed_lines_lm}
LM_LINES=${LM_LINES:-100000}
LM_SEED=${LM_SEED:-31}
LM_ORDERS=${LM_ORDERS:-4 5 6 7 8}
SP="<space>"

if [ ! -e "$MODEL" ]; then
    if [ -n "${PL_MODEL:-}" ]; then
        echo "$(basename "$0"): PL_MODEL=$MODEL: no such checkpoint" >&2
        exit 2
    fi
    PYTHON="$PY" recipes/printed_lines.sh   # data and model, as that recipe makes them
fi
for f in "$DATA/val.nc" "$DATA/test.nc" "$DATA/train/list.tsv" "$DATA/val/list.tsv" \
         "$DATA/test/list.tsv"; do
    [ -e "$f" ] || { echo "$(basename "$0"): $f is missing (PL_DATA=$DATA)" >&2; exit 2; }
done
mkdir -p "$RUN"
now() { date +%s.%N; }
secs() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$@"; }
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# 1. LM text, as long as the longest rendered training line, without evaluation lines
MAXC=$("$PY" -c "import sys; print(max(len(l.rstrip('\n').split('\t', 1)[1]) for l in \
open(sys.argv[1], encoding='utf-8') if '\t' in l))" "$DATA/train/list.tsv")
cut -f2 "$DATA/val/list.tsv" > "$RUN/val_text.txt"
T0=$(now)
"$PY" -m "$DT" faker-text --out "$RUN/lm_text.new" --count "$LM_LINES" --seed "$LM_SEED" \
    --max-chars "$MAXC" --exclude "$DATA/val/list.tsv" --exclude "$DATA/test/list.tsv"
# keep the old file (and the models built from it) when the text is the same
if cmp -s "$RUN/lm_text.new" "$RUN/lm_text.txt"; then rm "$RUN/lm_text.new"
else mv "$RUN/lm_text.new" "$RUN/lm_text.txt"; fi
echo "LM text: $(secs "$T0" "$(now)") s"

# 2. character n-grams (modified Kneser-Ney; the 1-gram discounts of a 70-symbol
# vocabulary cannot be estimated, so those fall back to lmplz's fixed ones); the order
# with the lowest validation perplexity is kept
BEST_ORDER="" BEST_PPL=""
for o in $LM_ORDERS; do
    LM="$RUN/char$o.arpa"
    if [ ! "$LM" -nt "$RUN/lm_text.txt" ]; then
        T0=$(now)
        "$PY" -m "$DT" ngram "$RUN/lm_text.txt" --chars --space-token "$SP" --order "$o" \
            --discount-fallback --out "$LM"
        echo "  built in $(secs "$T0" "$(now)") s"
    fi
    "$PY" -m "$DT" perplexity "$LM" "$RUN/val_text.txt" --chars --space-token "$SP" \
        --json > "$RUN/ppl$o.json"
    PPL=$(json "$RUN/ppl$o.json" "round(d['perplexity'], 3)")
    echo "  order $o: validation perplexity $PPL"
    if [ -z "$BEST_PPL" ] || "$PY" -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" \
            "$PPL" "$BEST_PPL"; then
        BEST_ORDER=$o BEST_PPL=$PPL
    fi
done
CHAR_LM="$RUN/char$BEST_ORDER.arpa"
echo "character LM: order $BEST_ORDER (validation perplexity $BEST_PPL)"

# 3. LM weight and label bonus (per character: a character LM alone prefers short
# hypotheses) tuned on validation, by character error rate
T0=$(now)
"$PY" -m rnntrain tune-decoder "$MODEL" "$DATA/val.nc" --lm "$CHAR_LM" --space "$SP" \
    --lm-weights 0,0.25,0.5,0.75,1,1.5,2 --word-bonuses 0 --label-bonuses 0,0.5,1,2,3,4 \
    --select ler --json > "$RUN/tune_char.json"
read -r W G < <(json "$RUN/tune_char.json" "d['best']['lm_weight'], d['best']['label_bonus']")
echo "tuned on validation ($(secs "$T0" "$(now)") s): --lm-weight $W --label-bonus $G"

# 4. word 3-gram + lexicon (every word of the LM text): tuned the same way, by WER
T0=$(now)
tr ' ' '\n' < "$RUN/lm_text.txt" | grep -v '^$' | grep -v '^#' | LC_ALL=C sort -u \
    > "$RUN/lexicon.txt"
"$PY" -m "$DT" ngram "$RUN/lm_text.txt" --order 3 --out "$RUN/word3.arpa"
"$PY" -m rnntrain tune-decoder "$MODEL" "$DATA/val.nc" --lm "$RUN/word3.arpa" \
    --lexicon "$RUN/lexicon.txt" --space "$SP" --lm-weights 0,0.5,1,1.5 \
    --word-bonuses=-1,0,1,2,4 --json > "$RUN/tune_word.json"
read -r WW WB < <(json "$RUN/tune_word.json" "d['best']['lm_weight'], d['best']['word_bonus']")
echo "word LM + lexicon ($(wc -l < "$RUN/lexicon.txt") words), tuned on validation" \
     "($(secs "$T0" "$(now)") s): --lm-weight $WW --word-bonus $WB"

# 5. the test set (unseen font): beam 8 without and with each LM
T0=$(now)
"$PY" -m rnntrain eval "$MODEL" "$DATA/test.nc" --beam 8 --space "$SP" --json > "$RUN/test_beam.json"
"$PY" -m rnntrain eval "$MODEL" "$DATA/test.nc" --beam 8 --space "$SP" --lm "$CHAR_LM" \
    --lm-weight "$W" --label-bonus "$G" --json > "$RUN/test_char_lm.json"
"$PY" -m rnntrain eval "$MODEL" "$DATA/test.nc" --beam 8 --space "$SP" --lm "$RUN/word3.arpa" \
    --lexicon "$RUN/lexicon.txt" --lm-weight "$WW" --word-bonus "$WB" --json \
    > "$RUN/test_word_lm.json"
echo "test decoding: $(secs "$T0" "$(now)") s"
row() { json "$1" "'| $2 | ' + f\"{100 * d['beam']['ler']:.1f} % | {100 * d['beam']['wer']:.1f} % |\""; }
echo
echo "test set ($DATA/test.nc), model $MODEL"
echo "| decoder | CER | WER |"
echo "|---|---:|---:|"
json "$RUN/test_beam.json" "'| best path | ' + f\"{100 * d['best']['ler']:.1f} % | {100 * d['best']['wer']:.1f} % |\""
row "$RUN/test_beam.json" "beam 8"
row "$RUN/test_char_lm.json" "beam 8 + char $BEST_ORDER-gram, weight $W, label bonus $G"
row "$RUN/test_word_lm.json" "beam 8 + word 3-gram + lexicon, weight $WW, word bonus $WB"
