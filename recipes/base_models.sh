#!/usr/bin/env bash
# Base models for OCR, trained on public ground truth and lines rendered here, packed into
# the model zoo (rnntrain models): docs/ocr.md, "Base models".
#
#   recipes/base_models.sh [MODEL ...]   MODEL: de19-small (default), de19-large,
#                                        latin15-small, all
#
# de19-small: 19th-century German print (Fraktur and Antiqua, binarised and grayscale):
#   fraktur19 (2,205 real lines, 45 works, MIT), archiscribe's training lines (503 real
#   lines, 14 works, CC BY 4.0; its 64 validation lines validate; its 4 test works are in
#   no set), and each training transcript rendered once more in a blackletter and four
#   Antiqua faces from Debian's font packages (OFL/GPL-with-font-exception).
# de19-large: the same data, a wider and deeper network (kraken's default shape: conv
#   32-48-64-96, 3 x BLSTM-200; 2.5 M parameters against 1.0 M) for half the epochs: about
#   the same CPU time as de19-small's 12 (docs/accuracy.md, "Base models", compares them).
# latin15-small: early-modern Latin print (15th-16th century types): rendered lines only
#   (no real ground truth of such prints is at hand here; its card says so), in the
#   gotico-antiqua faces and four Renaissance Antiqua faces.
#
# Environment: SHARED (../shared/data), ZOO (where the packed models go: default the
# package's own zoo, rnntrain/artifact/zoo), RUNS (the run folders: runs/base), THREADS
# (worker threads, default 2). The
# fonts come from Debian: apt-get install fonts-blankenburg fonts-ebgaramond
# fonts-linuxlibertine fonts-oldstandard fonts-cardo fonts-gotico-antiqua fonts-junicode
# fonts-elstob fonts-goudybookletter (the recipe names the ones missing).
#
# Resumable: run it again after a kill; converted data are kept, an interrupted training
# resumes from its newest checkpoint (bit-identically), a finished one is only packed.
# Cost: docs/accuracy.md, "Base models" (de19-small: 12 epochs on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
SHARED=${SHARED:-../shared/data}
ZOO=${ZOO:-rnntrain/artifact/zoo}
THREADS=${THREADS:-2}
RUNS=${RUNS:-runs/base}
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(de19-small)
[ "${models[0]}" != all ] || models=(de19-small de19-large latin15-small)

finished() { grep -q '"finished"' "$1/status.json" 2>/dev/null; }

build() {   # NAME KIND EPOCHS RENDER_COUNT SIZES [OVERRIDE ...]: the network's, if any
    local name=$1 kind=$2 epochs=$3 count=$4 sizes=$5
    shift 5
    local net=("$@")
    local D=data/base/$kind RUN=$RUNS/$name
    local fonts
    "$PY" recipes/base_data.py "$kind" "$SHARED" "$D"
    fonts=$("$PY" -c "import sys; sys.path.insert(0, 'recipes'); import base_data
print(','.join(map(str, base_data.font_paths('$kind'))))")
    # every line of text rendered once, in a face drawn at random among those that draw it
    if [ ! -f "$D/render/list.tsv" ]; then
        "$PY" -m rnntrain_data render-lines --out "$D/render" --count "$count" --fonts "$fonts" \
            --text "$D/render.txt" --max-chars 80 --sizes "$sizes" --margin 0.1-0.5 \
            --stretch 0.85-1.15 --rotate 1 --blur 1.2 --noise 10 --seed 19
    fi
    if [ ! -f "$D/val.nc" ]; then
        "$PY" - "$D" <<'PYEOF'
import sys
from pathlib import Path
d = Path(sys.argv[1]).resolve()
render = [ln.split("\t", 1) for ln in (d / "render/list.tsv").read_text(encoding="utf-8").splitlines()]
rows = [f"{d / 'render' / p}\t{t}\n" for p, t in render]
real = (d / "real-train.tsv").read_text(encoding="utf-8")
val = (d / "real-val.tsv").read_text(encoding="utf-8")
if not val:   # no real lines (latin15): every 20th rendered line validates
    val = "".join(rows[::20])
    rows = [r for i, r in enumerate(rows) if i % 20]
(d / "train.tsv").write_text(real + "".join(rows), encoding="utf-8")
(d / "val.tsv").write_text(val, encoding="utf-8")
PYEOF
        "$PY" -m rnntrain_data images --list "$D/train.tsv" --out "$D/train.nc" --chars \
            --height 48 --trim none
        "$PY" -m rnntrain_data images --list "$D/val.tsv" --out "$D/val.nc" --chars \
            --height 48 --trim none --labels-from "$D/train.nc"
    fi
    # the printed-lines network (configs/printed_lines.toml) with light augmentation
    local start=$SECONDS
    # (the CPU seconds of each invocation are added to $D/cpu_seconds-$name.log for the card)
    finished "$RUN" || "$PY" -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[2:]).returncode
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "a").write(f"{u.ru_utime + u.ru_stime:.1f}\n")
sys.exit(rc)' "$D/cpu_seconds-$name.log" \
        "$PY" -m rnntrain train configs/printed_lines.toml ${net[@]+"${net[@]}"} data.train="$D/train.nc" \
        data.val="$D/val.nc" data.test= train.epochs="$epochs" optim.warmup_steps=100 \
        augment.preset=lines-light compute.threads="$THREADS" compute.intra_threads=1 \
        log.progress=lines log.every_steps=100 run.dir="$RUN" --resume if-any
    echo "$name: trained ($(( SECONDS - start )) s this time)"
    "$PY" recipes/base_info.py "$name" "$D" "$RUN" "$epochs" ${net[@]+"${net[@]}"} > "$D/info-$name.json"
    local scores=(--score "validation=$D/val.nc")
    if [ "$kind" = de19 ]; then   # the unseen-book test: archiscribe's 4 test works
        [ -f "$D/unseen.nc" ] || "$PY" -m rnntrain_data images --list "$D/unseen.tsv" \
            --out "$D/unseen.nc" --chars --height 48 --trim none --labels-from "$D/train.nc"
        scores+=(--score "archiscribe-unseen-books=$D/unseen.nc")
        # a real page of another book (Kant, 1784; OCR-D's ground truth): its lines as test
        [ -f "$D/kant.nc" ] || "$PY" -m rnntrain_data pagexml \
            "$SHARED/ocrd-kant/OCR-D-GT-PAGE/PAGE_0017_PAGE.xml" --out "$D/kant.nc" \
            --height 48 --trim none --labels-from "$D/train.nc"
        scores+=(--score "ocrd-kant-page=$D/kant.nc")
    fi
    "$PY" -m rnntrain models "$name" --pack "$RUN" --info "$D/info-$name.json" --out "$ZOO" "${scores[@]}"
}

for m in "${models[@]}"; do
    case "$m" in
        de19-small) build de19-small de19 12 2707 30-44 ;;
        de19-large) build de19-large de19 6 2707 30-44 "model.conv_channels=[32,48,64,96]" \
                        model.layers=3 model.hidden=200 ;;
        latin15-small) build latin15-small latin15 16 6000 30-44 ;;
        *) echo "$(basename "$0"): $m: give de19-small, de19-large, latin15-small or all" >&2
           exit 2 ;;
    esac
done
"$PY" -m rnntrain models
