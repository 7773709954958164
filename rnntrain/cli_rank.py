"""``rnntrain rank-lines MODELS LINES...``: untranscribed lines, most informative first
(``rnntrain.infer.rank``): transcribe the top of the list, fine-tune, repeat."""
from __future__ import annotations

import json
import sys

from rnntrain.errors import UserError


def add_parser(sub):
    r = sub.add_parser("rank-lines", help="order untranscribed line images by the models' "
                       "disagreement (or one model's doubt): what to transcribe next",
                       description="Reads every line with each model and prints the lines "
                       "most informative first: score (mean pairwise normalised edit "
                       "distance of the models' readings; one model: 1 - its mean "
                       "confidence), path, and the first model's reading as a start for the "
                       "transcription. Lines with a .gt.txt beside them are left out.")
    r.add_argument("models", help="a crossfold folder, models joined by commas (zoo names, "
                   "run folders, checkpoints), or one model")
    r.add_argument("inputs", nargs="+", metavar="LINES", help="line images, folders of them "
                   "or list files")
    r.add_argument("--top", type=int, default=0, help="print only the N best (0: all)")
    r.add_argument("--all", action="store_true", help="rank lines that have a .gt.txt too")
    r.add_argument("--json", action="store_true", help="JSON lines: path, score, doubt, "
                   "readings")
    r.add_argument("--out", help="write here instead of stdout")
    r.add_argument("--threads", type=int, default=0, help="lines read in parallel (0: the "
                   "usable cores)")
    return r


def run(args) -> int:
    if args.top < 0 or args.threads < 0:
        raise UserError("--top and --threads must be >= 0")
    from rnntrain.compute.pool import usable_cores
    from rnntrain.infer.api import load
    from rnntrain.infer.ensemble import model_paths
    from rnntrain.infer.rank import rank, untranscribed
    from rnntrain.artifact.paths import resolve
    sources = untranscribed(args.inputs, args.all)
    paths = model_paths(args.models)
    if args.out:
        from rnntrain.fsutil import check_output
        check_output(args.out, [*(resolve(p) for p in paths), *args.inputs,
                                *(s.path for s in sources)])
    threads = args.threads or usable_cores()
    import torch
    torch.set_num_threads(max(1, usable_cores() // threads))
    models = [load(p) for p in paths]
    ranked = rank(models, sources, threads)
    if args.top:
        ranked = ranked[:args.top]
    lines = [json.dumps({"path": str(r.path), "score": r.score, "doubt": r.doubt,
                         "readings": r.readings}, ensure_ascii=False) if args.json else
             f"{r.score:.4f}\t{r.path}\t{r.readings[0]}" for r in ranked]
    text = "".join(ln + "\n" for ln in lines)
    if args.out:
        from rnntrain.fsutil import atomic_write
        atomic_write(args.out, text)
        print(f"wrote {len(lines)} lines to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
