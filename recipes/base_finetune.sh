#!/usr/bin/env bash
# How many of a book's lines a base model needs: the fine-tuning learning curve on
# archiscribe (docs/accuracy.md, "Base models"). For each N, `rnntrain finetune BASE` on N
# of archiscribe's 503 training lines (nested draws: the 30 are among the 60 ...), against
# `rnntrain train` from scratch on the same lines for the same number of steps; both keep
# the best checkpoint on archiscribe's 64 validation lines and are scored once on its 145 test lines
# (4 works no training line, and no base model, comes from). N = 0 is the base model as
# it is (its card's score).
#
#   recipes/base_finetune.sh [N ...]            (default: 30 60 150 503)
#
# N = rankK: the K training lines `rnntrain rank-lines BASE` puts first (the base model's
# doubt), fine-tuned alike (HOW=ft): against N = K, K lines drawn at random.
#
# The scratch runs use the whole budget (no early stopping: from random weights the
# validation score stays at 100 % for the first epochs, which patience would stop at).
#
# Environment: BASE (de19-small), STEPS (1000: the budget of every run), THREADS (1 per
# run), JOBS (2: runs side by side), HOW ("ft scratch"; "scratch" alone needs no trained
# base model yet, only its card's geometry), SEED (1), SHARED (../shared/data), OUT
# (runs/finetune-curve). Writes OUT/results.tsv (one row a run: N, how, test CER, best
# validation CER, epochs, wall and CPU seconds) and prints it. Finished runs are kept;
# run it again after a kill and the others resume.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${PYTHON:-}" ] || [ ! -f scripts/env.sh ] || source scripts/env.sh
PY="${PYTHON:-python}"
BASE=${BASE:-de19-small}
STEPS=${STEPS:-1000}
THREADS=${THREADS:-1}
JOBS=${JOBS:-2}
SEED=${SEED:-1}
SHARED=${SHARED:-../shared/data}
OUT=${OUT:-runs/finetune-curve}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(30 60 150 503)
mkdir -p "$OUT"

# the lists: N training lines (a seeded shuffle's first N), the validation and test lines
"$PY" - "$SHARED/archiscribe" "$OUT" "$SEED" "$BASE" "${sizes[@]}" <<'PYEOF'
import json, random, subprocess, sys, unicodedata
from pathlib import Path
src, out, seed, base = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sizes = sys.argv[5:]
rows = [ln.split("\t") for ln in (src / "split.tsv").read_text(encoding="utf-8").splitlines()[1:] if ln]
parts = {"train": [], "val": [], "test": []}
for image, split in rows:
    text = (src / (image.rsplit(".", 1)[0] + ".gt.txt")).read_text(encoding="utf-8")
    parts[split].append(f"{src / image}\t{' '.join(unicodedata.normalize('NFC', text).split())}\n")
train = parts["train"]
random.Random(seed).shuffle(train)
(out / "train-all.tsv").write_text("".join(train), encoding="utf-8")
for n in sizes:
    if n.startswith("rank"):   # the N lines rank-lines puts first (BASE's doubt)
        f = out / f"train-{n}.tsv"
        if not f.is_file():
            r = subprocess.run([sys.executable, "-m", "rnntrain", "rank-lines", base,
                                str(out / "train-all.tsv"), "--all", "--json"],
                               capture_output=True, text=True, check=True)
            top = [json.loads(ln)["path"] for ln in r.stdout.splitlines()][:int(n[4:])]
            text = {ln.split("\t")[0]: ln for ln in train}
            f.write_text("".join(text[p] for p in top), encoding="utf-8")
        continue
    (out / f"train-{n}.tsv").write_text("".join(train[:int(n)]), encoding="utf-8")
(out / "val.tsv").write_text("".join(parts["val"]), encoding="utf-8")
(out / "test.tsv").write_text("".join(parts["test"]), encoding="utf-8")
PYEOF

timed() {   # LOG CMD...: run CMD, append its wall and CPU seconds to LOG
    "$PY" -c 'import resource, subprocess, sys, time
t = time.time(); rc = subprocess.run(sys.argv[2:]).returncode
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "a").write(f"{time.time() - t:.1f} {u.ru_utime + u.ru_stime:.1f}\n")
sys.exit(rc)' "$@"
}
done_run() { grep -q '"finished"' "$1/status.json" 2>/dev/null; }

# each N's lines at the base model's geometry (its card), val and test with their alphabet
geometry=$("$PY" -c 'import json, subprocess, sys
c = json.loads(subprocess.run([sys.executable, "-m", "rnntrain", "models", sys.argv[1], "--json"],
                              capture_output=True, text=True, check=True).stdout)["input"]
print("--height", c["height"], "--trim", c["trim"], "--invert", c["invert"], "--layout", c["layout"])' "$BASE")
for n in "${sizes[@]}"; do
    d=$OUT/data-$n
    [ -f "$d/test.nc" ] && continue
    mkdir -p "$d"
    # shellcheck disable=SC2086
    "$PY" -m rnntrain_data images --list "$OUT/train-$n.tsv" --out "$d/train.nc" --chars $geometry
    for s in val test; do
        # shellcheck disable=SC2086
        "$PY" -m rnntrain_data images --list "$OUT/$s.tsv" --out "$d/$s.nc" --chars $geometry \
            --labels-from "$d/train.nc"
    done
done

one() {   # N HOW: fine-tuned from BASE, or from scratch for the same number of epochs
    local n=$1 how=$2 d=$OUT/data-$1 run=$OUT/$2-$1
    done_run "$run" && return
    if [ "$how" = ft ]; then
        timed "$OUT/ft-$n.time" "$PY" -m rnntrain finetune "$BASE" "$d/train.nc" \
            --val "$d/val.nc" --test "$d/test.nc" --out "$run" --steps "$STEPS" \
            --seed "$SEED" compute.threads="$THREADS" compute.intra_threads=1 \
            log.progress=lines > "$OUT/ft-$n.log" 2>&1
    else   # the from-scratch schedule of configs/printed_lines.toml, the same budget
        local epochs
        epochs=$("$PY" -c 'import sys
from rnntrain.cli_finetune import budget
from rnntrain.config import load_config
from rnntrain.data.dataset import Dataset
ds = Dataset.open(sys.argv[1])
print(budget(int(ds.lengths.sum()), load_config("configs/printed_lines.toml").batch.batch_frames,
             int(sys.argv[2]))[1])' "$d/train.nc" "$STEPS")
        timed "$OUT/scratch-$n.time" "$PY" -m rnntrain train configs/printed_lines.toml \
            data.train="$d/train.nc" data.val="$d/val.nc" data.test="$d/test.nc" \
            train.epochs="$epochs" train.seed="$SEED" train.patience=0 \
            augment.preset=lines-light compute.threads="$THREADS" compute.intra_threads=1 \
            log.progress=lines run.dir="$run" --resume if-any > "$OUT/scratch-$n.log" 2>&1
    fi
}

running=0
for how in ${HOW:-ft scratch}; do
    for n in "${sizes[@]}"; do
        one "$n" "$how" &
        running=$((running + 1))
        if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    done
done
wait

"$PY" - "$OUT" "$BASE" "${sizes[@]}" <<'PYEOF'
import json, subprocess, sys
from pathlib import Path
out, base, sizes = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
card = json.loads(subprocess.run([sys.executable, "-m", "rnntrain", "models", base, "--json"],
                                 capture_output=True, text=True, check=True).stdout)
rows = [("lines", "how", "test CER", "best val CER", "epochs", "wall s", "CPU s")]
zero = card["scores"].get("archiscribe-unseen-books", {}).get("cer")
rows.append(("0", f"{base} as it is", f"{100 * zero:.2f}" if zero is not None else "-", "-", "-", "-", "-"))
for n in sizes:
    for how in ("ft", "scratch"):
        run = out / f"{how}-{n}"
        if not (run / "metrics.jsonl").is_file():
            continue
        recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
        test = [r for r in recs if r["split"] == "test"]
        val = [r["ler"] for r in recs if r["split"] == "val"]
        ep = max((r["epoch"] for r in recs if r["split"] == "train"), default=-1) + 1
        tf = out / f"{how}-{n}.time"   # one row per invocation (a resumed run has several)
        t = [f"{sum(float(r.split()[k]) for r in tf.read_text().splitlines()):.0f}"
             for k in (0, 1)] if tf.is_file() else ["-", "-"]
        rows.append((n, f"fine-tuned from {base}" if how == "ft" else "from scratch",
                     f"{100 * test[-1]['ler']:.2f}" if test else "-",
                     f"{100 * min(val):.2f}" if val else "-", str(ep), t[-2], t[-1]))
text = "".join("\t".join(map(str, r)) + "\n" for r in rows)
(out / "results.tsv").write_text(text, encoding="utf-8")
print(text, end="")
PYEOF
