#!/usr/bin/env bash
# Printed text lines (OCR): rendered line images → RNNLIB 2-D NetCDF → conv + BLSTM-CTC →
# character error rate on held-out lines in a font not seen in training.
#
#   recipes/printed_lines.sh [OVERRIDES...]      (overrides go to `rnntrain train`)
#   recipes/printed_lines.sh --data-only          (make the data, train nothing: the
#                                                  ensemble recipe uses it)
#
# Everything comes from the package registry; nothing is downloaded at run time:
#   fonts  the TrueType files matplotlib ships (DejaVu: Bitstream Vera licence, free;
#          STIX: SIL Open Font License 1.1; Computer Modern: the BaKoMa Fonts Licence,
#          free to copy, distribute and use, Copyright (C) 1994, 1995 Basil K. Malyshev,
#          in matplotlib's LICENSE file, originals at CTAN fonts/cm/ps-type1/bakoma);
#   text   Faker's en_US providers (the `faker` package, MIT licence): English-like
#          sentences from its word list, names, addresses, companies, dates, numbers.
# Training and validation lines use seventeen faces: the twelve DejaVu faces (Sans, Sans
# Mono and Serif, each regular, bold, oblique/italic, bold oblique/italic) and five Computer
# Modern ones (cmr10 roman, cmb10 bold, cmti10 italic, cmss10 sans, cmtt10 typewriter),
# with varied margins and widths. Computer Modern keeps TeX's glyph layout for some ASCII
# code points (cmr10's `<` is ¡, `|` an en dash); render-lines draws a line only in fonts
# whose glyphs for all its characters are the right ones (data_tools/render.py), so such a
# character never goes to those faces. The test lines use STIX General only (a Times-like
# serif; no STIX face is seen in training), drawn without the training lines' margin and
# width variation. FONTS=dejavu makes the twelve-DejaVu data of the earlier figures
# (docs/accuracy.md). Each line is trimmed to its ink (TRIM=2: 2 pixels of paper kept;
# TRIM=none keeps the rendered margins, as the figures before 2026-11-26 08:00 UTC were
# measured) and trains 6 epochs (12 with TRIM=none). Lines are 32 pixels high
# after scaling, up to 32 characters; the alphabet is printable ASCII plus <space> (95 labels),
# so the character error rate is the label error rate `rnntrain eval` prints.
# Sizes (environment): TRAIN_LINES (default 4000), VAL_LINES (200), TEST_LINES (400).
# Data go to data/printed_lines/, the run to runs/printed_lines/.
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's environment, set up on first use as run_train.sh does ($PYTHON: your own;
# the dev extra brings Pillow and Faker)
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
# the data tools' module: data_tools in the repository, rnntrain_data installed (a folder
# that `rnntrain init --recipe` wrote: no scripts/env.sh there, the rnntrain on PATH is used)
DT=$([ -f data_tools/cli.py ] && echo data_tools || echo rnntrain_data)
OUT=data/printed_lines
TRAIN_LINES=${TRAIN_LINES:-4000}
VAL_LINES=${VAL_LINES:-200}
TEST_LINES=${TEST_LINES:-400}
"$PY" -c "import PIL, faker, matplotlib" 2>/dev/null || {
    echo "printed_lines.sh: $PY needs Pillow, Faker and matplotlib: pip install -e '.[images]'" >&2
    exit 2; }

# the twelve DejaVu faces (Sans, Sans Mono, Serif; regular, bold, oblique/italic) and the
# five Computer Modern text faces (FONTS=dejavu: the DejaVu faces alone)
SEEN=$(printf '%s,' DejaVuSans{,-Bold,-Oblique,-BoldOblique} \
    DejaVuSansMono{,-Bold,-Oblique,-BoldOblique} DejaVuSerif{,-Bold,-Italic,-BoldItalic})
case "${FONTS:-cm}" in
    cm) SEEN="${SEEN}cmr10,cmb10,cmti10,cmss10,cmtt10" ;;
    dejavu) SEEN=${SEEN%,} ;;
    *) echo "printed_lines.sh: FONTS=${FONTS}: give cm (default) or dejavu" >&2; exit 2 ;;
esac
# each line trimmed to its ink (2 px of paper kept; TRIM=none: the margins as rendered)
TRIM=${TRIM:-2}
# data made with other faces or trimming (an earlier version of this script) are made again
STAMP="$SEEN trim=$TRIM"
if [ ! -f "$OUT/test.nc" ] || [ "$(cat "$OUT/fonts.txt" 2>/dev/null)" != "$STAMP" ]; then
    rm -rf "$OUT"
    common=(--sizes 18-30 --rotate 1.5 --blur 1.0 --noise 10 --max-chars 32)
    # training lines vary their margins and widths as line crops and typefaces do (STIX is
    # narrower than DejaVu and its line metrics are taller); the test font is drawn as is
    vary=(--margin 0.1-0.6 --stretch 0.75-1.3)
    "$PY" -m "$DT" render-lines --out "$OUT/train" --count "$TRAIN_LINES" --fonts "$SEEN" \
        --seed 21 "${common[@]}" "${vary[@]}"
    "$PY" -m "$DT" render-lines --out "$OUT/val" --count "$VAL_LINES" --fonts "$SEEN" \
        --seed 22 "${common[@]}" "${vary[@]}"
    "$PY" -m "$DT" render-lines --out "$OUT/test" --count "$TEST_LINES" --fonts STIXGeneral \
        --seed 23 "${common[@]}"
    # one fixed alphabet for the three sets: <space> and printable ASCII in code order
    # (--trim 2: every face's text fills the line whatever its line metrics: 2.79 % / 3.07 %
    # CER (seeds 1 / 2) on the unseen font at 6 epochs against 10.48 % / 11.62 % untrimmed
    # at 12, docs/accuracy.md)
    for s in train val test; do
        "$PY" -m "$DT" images --list "$OUT/$s/list.tsv" --out "$OUT/$s.nc" --chars \
            --height 32 --trim "$TRIM" --alphabet ascii
    done
    "$PY" -m "$DT" inspect "$OUT/train.nc" --subsample 4
    echo "$STAMP" > "$OUT/fonts.txt"
fi

[ "${1:-}" = "--data-only" ] && exit 0
RUN=runs/printed_lines
if [ -e "$RUN/checkpoints/last.pt" ]; then
    echo "$(basename "$0"): $RUN already holds a trained model; remove it to train again" >&2
    exit 2
fi
START=$(date +%s)
# trimmed lines are about 1.8 times as wide: 6 epochs cost what 12 untrimmed ones did
# (TRIM=none: the config's 12); your overrides come after and win
EP=(); [ "$TRIM" = none ] || EP=(train.epochs=6)
"$PY" -m rnntrain train configs/printed_lines.toml ${EP[@]+"${EP[@]}"} "$@"
echo "training wall time: $(( $(date +%s) - START )) s"
# character error rate on the unseen font: best path and prefix beam search (width 8)
"$PY" -m rnntrain eval "$RUN/checkpoints/best.pt" "$OUT/test.nc" --beam 8
