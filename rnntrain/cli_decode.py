"""Decoding options shared by the commands that decode (``eval``, ``decode``,
``tune-decoder``, ``transcribe``): argparse arguments → a ``decode.beam.Decoder``. CLI
plumbing (beside ``cli_args``), so only the command layer imports it.

Imports nothing heavy, so building the command-line parser stays fast.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from rnntrain.cli_args import finite_float, non_negative_int, positive_int
from rnntrain.errors import UserError

MAX_BEAM = 1024


def beam_width(text: str) -> int:
    """--beam: 0 (best path) to MAX_BEAM. A beam of 100,000 searched for minutes without a
    word; the cost grows with the width, and widths past a few hundred do not change CTC
    hypotheses in practice."""
    v = non_negative_int(text)
    if v > MAX_BEAM:
        raise argparse.ArgumentTypeError(f"{v} is more than {MAX_BEAM} (a wider beam costs "
                                         "time in proportion and changes nothing; 8 to 64 "
                                         "is usual)")
    return v


def nbest_count(text: str) -> int:
    """--nbest: 1 to MAX_BEAM. N best needs a beam at least N wide, so the beam's cap is
    its cap too (--nbest 100000 would otherwise lift the beam past it)."""
    v = positive_int(text)
    if v > MAX_BEAM:
        raise argparse.ArgumentTypeError(f"{v} is more than {MAX_BEAM} (the N best come "
                                         f"from a beam of at least N, at most {MAX_BEAM})")
    return v


def add_decoder_arguments(p, default_threads: int = 0, threads: bool = True) -> None:
    """The decoding options of ``eval``, ``decode``, ``tune-decoder`` (and any command that
    decodes): pass the parsed namespace to ``decoder_from_args``. ``threads`` False: the
    command has its own ``--threads`` (``transcribe``: utterances in parallel)."""
    p.add_argument("--beam", type=beam_width, default=None,
                   help="prefix beam search width (0 = best path; default 0, or 8 with "
                        "--lm/--lexicon)")
    p.add_argument("--lexicon", metavar="FILE", help="word list: hypotheses contain only "
                   "these words (one per line: WORD, or WORD LABEL LABEL ...); needs --space")
    p.add_argument("--space", metavar="LABEL", help="the label that separates words (word "
                   "error rates, lexicon, word-level LM)")
    p.add_argument("--lm", metavar="FILE", help="ARPA n-gram model (label- or word-level; "
                   "see rnntrain-data ngram)")
    p.add_argument("--lm-weight", type=finite_float, default=0.5, help="LM score weight (default 0.5)")
    p.add_argument("--word-bonus", type=finite_float, default=0.0,
                   help="added per word (per label without --space); default 0")
    p.add_argument("--label-bonus", type=finite_float, default=0.0,
                   help="added per label, the separator included, with or without --space "
                        "(the insertion bonus of a character-level LM); default 0")
    if threads:
        p.add_argument("--threads", type=positive_int, default=default_threads,
                       help="threads running the network and decoding in parallel "
                            "(default: the CPU count)")


def add_output_arguments(p) -> None:
    """What ``decode`` and ``transcribe`` give back besides the hypothesis
    (docs/decoding.md, "What comes back")."""
    p.add_argument("--nbest", type=nbest_count, default=1, metavar="N",
                   help="the N best hypotheses of the beam search, with scores, one line "
                        "each (implies --full; without --beam: --beam max(8, N))")
    p.add_argument("--full", action="store_true",
                   help="TSV: add per-label confidences, start and end (seconds, image "
                        "pixel columns or model frames), score and rank columns")


def decoder_from_args(args, labels: Sequence[str], blank: int) -> "Decoder | None":
    """The Decoder the options ask for, or None for plain best path."""
    nbest = getattr(args, "nbest", 1) or 1
    beam = args.beam if args.beam is not None else \
        (max(8, nbest) if (args.lm or args.lexicon or nbest > 1) else 0)
    if nbest > 1 and nbest > beam:
        raise UserError(f"--nbest {nbest} needs a beam search at least as wide: "
                        f"--beam {max(nbest, 8)} or more" + (
                            f" (not --beam {beam})" if args.beam is not None else ""))
    if beam == 0 and not (args.lm or args.lexicon):
        return None
    from rnntrain.decode.beam import Decoder  # numba: only when a beam search is asked for
    return Decoder(labels, blank, beam=beam, space=args.space, lexicon=args.lexicon,
                   lm=args.lm, lm_weight=args.lm_weight, word_bonus=args.word_bonus,
                   label_bonus=args.label_bonus)


def space_index(args, labels: Sequence[str]) -> int | None:
    if args.space is None:
        return None
    if args.space not in labels:
        raise UserError(f"--space '{args.space}' is not a label of the model's alphabet")
    return list(labels).index(args.space)


def decode_threads(args) -> int:
    from rnntrain.compute.pool import usable_cores  # (imports torch: only when decoding)
    return args.threads if args.threads and args.threads > 0 else usable_cores()
