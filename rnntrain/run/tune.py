"""``rnntrain tune-decoder``: LM weight and word/label bonus searched on a validation set.

The network runs once over the data (``evaluate`` keeps every batch's log-probabilities);
then every (LM weight, word bonus, label bonus) of the grid decodes the kept outputs with
the same decoder (beam, lexicon, LM) and is scored: WER with a word separator, LER
otherwise (``--select`` chooses), ties broken by the other rate and then by the smaller
weight and bonuses. Prints the table and the best setting.
"""
from __future__ import annotations

import math

import json

import numpy as np

from rnntrain.decode.score import ErrorCounts
from rnntrain.errors import UserError


def parse_grid(text: str, what: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{what} {text!r}: give comma-separated numbers, e.g. 0,0.5,1") from None
    if not vals:
        raise UserError(f"{what}: no values")
    bad = [v for v in vals if not math.isfinite(v)]
    if bad:  # nan would empty every hypothesis and still "win" the table
        raise UserError(f"{what} {text!r}: {bad[0]} is not a finite number")
    return vals


def tune_decoder(args, cfg, ds, model, device, space: int | None, threads: int) -> int:
    """Score every (LM weight, word bonus, label bonus) of the grids in ``args`` on ``ds``
    (one network pass, then a beam search per point); ``space``: the word separator's
    label index (None: no words), ``threads``: decoding threads (``cli_decode``)."""
    from rnntrain.decode.beam import Decoder
    from rnntrain.run.evaluate import evaluate
    weights = parse_grid(args.lm_weights, "--lm-weights")
    bonuses = parse_grid(args.word_bonuses, "--word-bonuses")
    label_bonuses = (parse_grid(args.label_bonuses, "--label-bonuses")
                     if args.label_bonuses is not None else [args.label_bonus])
    if not args.lm and not args.lexicon:
        raise UserError("tune-decoder needs --lm FILE (and/or --lexicon FILE) to tune")
    base = Decoder(ds.labels, model.blank, beam=args.beam if args.beam else 8,
                   space=args.space, lexicon=args.lexicon, lm=args.lm)
    kept: list[tuple[list[int], np.ndarray, np.ndarray]] = []
    keep = ds.feasible(cfg.model.subsample)
    counts = evaluate(model, ds, keep, args.batch_frames or cfg.batch.batch_frames, device,
                      space=space, workers=threads,
                      on_log_probs=lambda s, lp, n: kept.append((s, lp, n)))
    refs = {s: ds.targets[s].tolist() for seqs, _, _ in kept for s in seqs}
    rows = []
    for w in weights:
        for b in bonuses:
            for g in label_bonuses:
                dec = base.with_weights(w, b, g)
                c = ErrorCounts()
                for seqs, lp, n in kept:
                    c.add_batch([refs[s] for s in seqs], dec.decode_batch(lp, n, threads),
                                space)
                s = c.summary()
                rows.append({"lm_weight": w, "word_bonus": b, "label_bonus": g,
                             "wer": s.get("wer"), "ler": s["ler"]})
    by_wer = space is not None and args.select == "wer"
    if args.select == "wer" and space is None:
        raise UserError("tune-decoder --select wer needs --space LABEL (words are the labels "
                        "between separators)")
    small = (lambda r: (r["lm_weight"], abs(r["word_bonus"]), abs(r["label_bonus"])))
    key = (lambda r: (r["wer"], r["ler"], *small(r))) if by_wer else \
        (lambda r: (r["ler"], r["wer"] if r["wer"] is not None else 0.0, *small(r)))
    best = min(rows, key=key)
    bp = counts["best"].summary()
    if args.json:
        print(json.dumps({"best": best, "best_path": {k: bp.get(k) for k in ("wer", "ler")},
                          "decoder": base.describe(), "table": rows}))
        return 0
    metric = "WER" if by_wer else "LER"
    print(f"{base.describe()} on {args.data}: "
          f"{counts['best'].seqs} sequences; best path {metric} "
          f"{(bp.get('wer') if by_wer else bp['ler']):.4f}")
    print(f"{'lm-weight':>9} {'word-bonus':>10} {'label-bonus':>11} {'WER':>8} {'LER':>8}")
    for r in rows:
        wer = f"{r['wer']:.4f}" if r["wer"] is not None else "-"
        mark = "  <- best" if r is best else ""
        print(f"{r['lm_weight']:>9g} {r['word_bonus']:>10g} {r['label_bonus']:>11g} {wer:>8} "
              f"{r['ler']:>8.4f}{mark}")
    print(f"best: --lm-weight {best['lm_weight']:g} --word-bonus {best['word_bonus']:g} "
          f"--label-bonus {best['label_bonus']:g} "
          f"({metric} {best['wer'] if by_wer else best['ler']:.4f})")
    return 0
