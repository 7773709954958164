#!/usr/bin/env bash
# A base model fine-tuned to one book, as a user would (docs/accuracy.md, "Base models"):
# for each of archiscribe's unseen test works with at least 20 lines (3 of its 4), the
# first half of its lines (in file order) are the user's transcribed lines, the second
# half the book's unseen lines. `rnntrain finetune BASE` on the first half (4 of them
# held out for early stopping), against the base model as it is, both scored on the
# second half. The base models never saw these works (recipes/base_data.py).
#
#   recipes/base_books.sh
#
# Environment: BASE (de19-small; several joined by commas: each is fine-tuned, and the
# fine-tuned models also vote), BASE_DATA (the base model's training file, whose alphabet
# the lines are converted with: data/base/de19/train.nc), STEPS (1000), THREADS (1), JOBS
# (2), SEED (1), SHARED (../shared/data), OUT (runs/base-books). Writes OUT/results.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
BASE=${BASE:-de19-small}
BASE_DATA=${BASE_DATA:-data/base/de19/train.nc}
STEPS=${STEPS:-1000}
THREADS=${THREADS:-1}
JOBS=${JOBS:-2}
SEED=${SEED:-1}
SHARED=${SHARED:-../shared/data}
OUT=${OUT:-runs/base-books}
mkdir -p "$OUT"
IFS=, read -r -a bases <<< "$BASE"

# the lists: per work, the first half (train, its last 4 lines val) and the second (test)
works=$("$PY" - "$SHARED/archiscribe" "$OUT" <<'PYEOF'
import sys, unicodedata
from pathlib import Path
src, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
rows = [ln.split("\t") for ln in (src / "split.tsv").read_text(encoding="utf-8").splitlines()[1:] if ln]
by_work = {}
for image, split in rows:
    if split == "test":
        by_work.setdefault(image.split("/")[0], []).append(image)
for work, images in sorted(by_work.items()):
    if len(images) < 20:
        continue
    images.sort()
    def row(image):
        text = (src / image).with_suffix("").with_suffix(".gt.txt").read_text(encoding="utf-8")
        return f"{src / image}\t{' '.join(unicodedata.normalize('NFC', text).split())}\n"
    half = len(images) // 2
    parts = {"train": images[:half - 4], "val": images[half - 4:half], "test": images[half:]}
    for name, part in parts.items():
        (out / f"{work}-{name}.tsv").write_text("".join(map(row, part)), encoding="utf-8")
    print(work)
PYEOF
)

geometry=$("$PY" -c 'import json, subprocess, sys
c = json.loads(subprocess.run([sys.executable, "-m", "rnntrain", "models", sys.argv[1], "--json"],
                              capture_output=True, text=True, check=True).stdout)["input"]
print("--height", c["height"], "--trim", c["trim"], "--invert", c["invert"], "--layout", c["layout"])' "${bases[0]}")
for w in $works; do
    for s in train val test; do
        [ -f "$OUT/$w-$s.nc" ] && continue
        # shellcheck disable=SC2086
        "$PY" -m rnntrain_data images --list "$OUT/$w-$s.tsv" --out "$OUT/$w-$s.nc" --chars \
            $geometry --labels-from "$BASE_DATA"
    done
done

done_run() { grep -q '"finished"' "$1/status.json" 2>/dev/null; }
one() {   # WORK BASE
    local run=$OUT/$2-$1
    done_run "$run" && return
    "$PY" -m rnntrain finetune "$2" "$OUT/$1-train.nc" --val "$OUT/$1-val.nc" \
        --test "$OUT/$1-test.nc" --out "$run" --steps "$STEPS" --seed "$SEED" \
        compute.threads="$THREADS" compute.intra_threads=1 log.progress=lines \
        > "$run.log" 2>&1
}
running=0
for b in "${bases[@]}"; do
    for w in $works; do
        one "$w" "$b" &
        running=$((running + 1))
        if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    done
done
wait

# every score by `rnntrain eval` on the same test file (the alphabet is the base's)
"$PY" - "$OUT" "$BASE" $works <<'PYEOF'
import json, subprocess, sys
from pathlib import Path
out, bases, works = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]

def cer(model, data, *more):
    r = subprocess.run([sys.executable, "-m", "rnntrain", "eval", model, str(data), "--json",
                        *more], capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    return 100 * json.loads(r.stdout)["ler"]

head = ["work", "train lines", "test lines"]
for b in bases:
    head += [f"{b} as it is", f"{b} fine-tuned"]
if len(bases) > 1:
    head += ["fine-tuned, voting"]
rows = [head]
for w in works:
    test = out / f"{w}-test.nc"
    n = [sum(1 for _ in open(out / f"{w}-{s}.tsv", encoding="utf-8")) for s in ("train", "test")]
    row = [w, str(n[0]), str(n[1])]
    for b in bases:
        row += [f"{cer(b, test):.2f}", f"{cer(str(out / f'{b}-{w}'), test):.2f}"]
    if len(bases) > 1:
        row.append(f"{cer(','.join(str(out / f'{b}-{w}') for b in bases), test, '--combine', 'vote'):.2f}")
    rows.append(row)
text = "".join("\t".join(r) + "\n" for r in rows)
(out / "results.tsv").write_text(text, encoding="utf-8")
print(text, end="")
PYEOF
