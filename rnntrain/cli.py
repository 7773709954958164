"""``rnntrain`` command line: train, eval, decode, calibrate, tune-decoder, transcribe, export, runs,
sweep, crossfold, report, init.

User mistakes (UserError, a ValueError) print one line and exit 2, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rnntrain.cli_args import (RESUME_WORDS, Parser, non_negative_int, positive_int,
                               run_main, split_overrides, take_resume, version)
from rnntrain.errors import UserError
from rnntrain.artifact.runfolder import RunFolder


def resolve_resume(value: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """A run folder (or its checkpoints/ folder) given to --resume means ``auto`` in that
    folder: it becomes ``run.dir`` (an explicit, different run.dir is an error)."""
    if value is None or value in RESUME_WORDS or not Path(value).is_dir():
        return value, overrides
    folder = RunFolder.of(value).root  # a run folder, or its checkpoints folder
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("run.dir=")]
    if given and Path(given[-1].strip('"')).resolve() != folder.resolve():
        raise UserError(f"--resume {value} is a run folder, but run.dir={given[-1]} names "
                        f"another")
    if not given:
        overrides = [*overrides, f"run.dir={folder}"]
    return "auto", overrides


def _cmd_train(args) -> int:
    try:
        _train(args)
    except BaseException as e:
        from rnntrain.parallel import launch as dist
        # N ranks: name this rank and end the whole job (no hang); a mistake every rank
        # finds alike is printed once
        dist.fail(e)
        raise
    return 0


def _train(args):
    from rnntrain.config import load_config
    args.resume, args.overrides = resolve_resume(args.resume, args.overrides)
    cfg = load_config(args.config, args.overrides)
    if args.trace:
        from rnntrain import trace
        trace.configure(args.trace, trace.parse_window(args.trace_steps))
    from rnntrain.compute import allocator
    allocator.configure(cfg.compute.allocator)  # before torch starts any thread
    from rnntrain.run.train import train  # torch: imported once the arguments are known to be good
    train(cfg, args.config, args.overrides, resume=args.resume)


def _load_for_eval(checkpoint: str, data: str, device: str, need_targets: bool = True,
                   same_labels: bool = True):
    """The checkpoint's network (the one builder, ``checkpoint.load_model``) on ``device``
    and the data to run it on, checked against its card → (config, Dataset, model, device).
    ``same_labels=False``: the checkpoint's alphabet may be the data's in another order (an
    ensemble's further members, matched by name)."""
    from rnntrain.compute.device import pick_device
    from rnntrain.data.dataset import Dataset
    from rnntrain.errors import DataError
    from rnntrain.infer.model import resolve
    from rnntrain.run import checkpoint as ckpt
    model, ck = ckpt.load_model(resolve(checkpoint))  # a run folder: its best
    card = ck.card
    cfg = card.train_config(checkpoint)
    from rnntrain.compute import allocator
    # the run's memory policy for the forward passes too (before any worker thread starts):
    # the reference model's eval ran 20 % faster with "cache" (docs/threads.md)
    allocator.configure(cfg.compute.allocator)
    ds = Dataset.open(data, cfg.data.chunk_frames, need_targets=False)
    if need_targets and not ds.has_targets:
        raise DataError(data, "missing variable: no targets to score against (rnntrain "
                              "decode or transcribe need none)", var="targetStrings")
    if ds.has_targets and same_labels:
        card.check_labels(ds, checkpoint, "the checkpoint's")
    elif ds.input_size != card.input_size:  # a file to decode without targets: no alphabet
        raise DataError(data, f"inputPattSize {ds.input_size} differs from the checkpoint's "
                              f"({card.input_size})")
    height = card.image_height
    if ds.is_2d:
        ds.set_pad_height(height or 1, f"checkpoint {checkpoint}")
    if (ds.column_height or ds.is_2d) and ds.frame_height != height:
        raise DataError(data, f"image height {ds.frame_height} differs from the "
                              f"checkpoint's ({height})")
    if ds.frame_size != card.frame_size:
        raise DataError(data, f"{ds.frame_size} values per frame, the checkpoint's model "
                              f"takes {card.frame_size}")
    dev = pick_device(device)
    model.labels = list(card.labels)  # the checkpoint's names (a file to decode may have none)
    model.to(dev)
    return cfg, ds, model, dev


def _load_models(args, need_targets: bool = True):
    """``args.checkpoint``: one model or several (``infer.ensemble.model_paths``) →
    (cfg, ds, model, device, vote): the first model's config and dataset; several models
    as one ``EnsembleNet``; ``vote`` its voting for ``evaluate`` under --combine vote."""
    from rnntrain.compute.model import total_subsample
    from rnntrain.infer.ensemble import EnsembleNet, check_combine, model_paths
    check_combine(args.combine)
    paths = model_paths(args.checkpoint)
    cfg, ds, model, dev = _load_for_eval(str(paths[0]), args.data, args.device, need_targets)
    if len(paths) == 1:
        return cfg, ds, model, dev, None
    combine, note = _resolve_combine(args, len(paths))
    if combine == "vote" and (args.beam or args.lexicon or args.lm):
        raise UserError("--combine vote votes on each model's best path: it takes no "
                        "--beam, --lexicon or --lm (use --combine posteriors)")
    # the others: labels matched by name, so only the first must be in the data's order
    rest = [_load_for_eval(str(p), args.data, args.device, need_targets, same_labels=False)
            for p in paths[1:]]
    members = [(cfg, model)] + [(c, m) for c, _, m, _ in rest]
    net = EnsembleNet([m for _, m in members], [m.labels for _, m in members],
                      [str(p) for p in paths], [total_subsample(c.model) for c, _ in members],
                      combine)
    if note:
        print(note, file=sys.stderr)
    return cfg, ds, net.to(dev), dev, net.vote_batch if combine == "vote" else None


def _decoding(args, ds, model):
    """The decoder the options ask for (or None), the separator's index, thread count."""
    from rnntrain.cli_decode import decode_threads, decoder_from_args, space_index
    # the checkpoint's alphabet: a file to decode may have none of its own
    return (decoder_from_args(args, model.labels, model.blank),
            space_index(args, model.labels), decode_threads(args))


def _cmd_eval(args) -> int:
    from rnntrain.compute.model import total_subsample
    from rnntrain.run.evaluate import evaluate
    cfg, ds, model, dev, vote = _load_models(args)
    decoder, space, threads = _decoding(args, ds, model)
    keep = ds.feasible(total_subsample(cfg.model))
    if not keep.any():  # a score over nothing would read as LER 0
        raise UserError(f"{args.data}: none of its {ds.num_seqs} sequences is long enough "
                        f"for its target (subsampling {total_subsample(cfg.model)}): nothing "
                        "to score")
    if args.details:  # before scoring: a folder, a missing folder, an input given as FILE
        from rnntrain.fsutil import check_output
        from rnntrain.infer.ensemble import model_paths
        from rnntrain.infer.model import resolve
        check_output(args.details, [*(resolve(p) for p in model_paths(args.checkpoint)),
                                    args.data], what="--details")
    hyps: dict[int, list[int]] = {}
    # lines with characters the alphabet lacks (a val/test set converted with the training
    # set's alphabet) are scored against their full text
    from rnntrain.data.ncdata import full_targets
    full = full_targets(args.data, model.labels)
    counts = evaluate(model, ds, keep, args.batch_frames or cfg.batch.batch_frames, dev,
                      decoder=decoder, space=space, threads=threads, workers=threads,
                      vote=vote, on_hyp=hyps.__setitem__ if args.details else None,
                      full_targets=full[0] if full else None)
    out = {k: c.summary() for k, c in counts.items()}
    ooa = {"lines": full[1], "labels": full[2]} if full else {"lines": 0, "labels": 0}
    if args.details:
        from rnntrain.decode.details import details_text
        from rnntrain.fsutil import atomic_write
        text = details_text(((ds.tag(i), ds.targets[i].tolist(), hyps[i]) for i in
                             sorted(hyps)), model.labels,
                            f"{args.checkpoint} on {args.data}, "
                            f"{decoder.describe() if decoder is not None else 'best path'}",
                            space)
        try:
            atomic_write(args.details, text)
        except OSError as e:
            raise UserError(f"--details {args.details}: cannot write it "
                            f"({e.strerror or e})") from None
    if decoder is not None:
        out["beam"]["decoder"] = decoder.describe()
    if args.json:  # one schema whether or not a beam search ran
        # "best" and "beam" (null without a beam search) always; the best-path figures
        # also at the top level, where scripts written before the beam search read them
        print(json.dumps({**out["best"], "best": out["best"], "beam": out.get("beam"),
                          "beam_width": decoder.beam if decoder is not None else 0,
                          "out_of_alphabet": ooa}))
    else:
        if ooa["lines"]:
            print(f"out-of-alphabet: {ooa['lines']} line(s) hold {ooa['labels']} label(s) the "
                  "model's alphabet lacks (scored against the full text: errors it could "
                  "not avoid)")
        for k, s in out.items():
            name = "best path" if k == "best" else decoder.describe()
            wer = f"WER {s['wer']:.4f}, " if "wer" in s else ""
            print(f"{name:>10}: {wer}LER {s['ler']:.4f} (sub {s['sub']:.4f}, del {s['del']:.4f}, "
                  f"ins {s['ins']:.4f}), sequence error {s['seq_error']:.4f}, CTC loss "
                  f"{s['loss']:.4f}, {s['seqs']} sequences, {s['skipped']} skipped")
    return 0


def _transcript_settings(checkpoint: str, model) -> dict:
    """What turns a sequence's log-probs into a Transcript besides the decoder: the
    checkpoint's temperature, seconds per output frame, columns per frame, speller.
    Several models (averaged posteriors): the first one's front end, no temperature (a
    calibration belongs to one model)."""
    from rnntrain.infer.api import load
    from rnntrain.infer.ensemble import model_paths
    paths = model_paths(checkpoint)
    m = load(paths[0])  # the checkpoint's card: front end, image settings, calibration
    return {"labels": model.labels, "blank": model.blank,
            "temperature": m.temperature if len(paths) == 1 else 1.0,
            "frame_seconds": m.frame_seconds, "pixel_map": m.pixel_map(),
            "speller": m.image.text if m.image is not None else None}


def _cmd_decode(args) -> int:
    if args.out:  # before decoding: a folder, a missing folder, an input given as --out
        from rnntrain.fsutil import check_output
        from rnntrain.infer.ensemble import model_paths
        from rnntrain.infer.model import resolve  # a run folder: its best.pt is an input
        check_output(args.out, [*(resolve(p) for p in model_paths(args.checkpoint)),
                                args.data])
    import numpy as np
    from rnntrain.run.evaluate import evaluate
    cfg, ds, model, dev, vote = _load_models(args, need_targets=False)
    decoder, space, threads = _decoding(args, ds, model)
    labels = model.labels
    # every sequence is decoded: a target (absent, or a placeholder) is not needed for that
    keep = np.ones(ds.num_seqs, dtype=bool)
    batch = args.batch_frames or cfg.batch.batch_frames
    full = args.full or args.nbest > 1
    if (args.json or full) and vote is not None:
        raise UserError("--combine vote gives the voted labels only: --json, --full and "
                        "--nbest need --combine posteriors")
    if args.json or full:  # transcripts (alignment, confidences, n-best) in the workers
        import functools
        from rnntrain.infer.api import decode_transcript
        from rnntrain.infer.transcribe import format_line
        settings = _transcript_settings(args.checkpoint, model)
        if not args.json:  # TSV column 2 as without --full: the label names
            settings["speller"] = None
        fn = functools.partial(decode_transcript, beam=decoder if decoder is not None else 0,
                               nbest=args.nbest, **settings)
        got: dict[int, object] = {}
        evaluate(model, ds, keep, batch, dev, space=space, threads=threads, workers=threads,
                 score=False, per_seq=fn, on_seq=got.__setitem__)
        lines = [format_line(ds.tag(i), got[i], args.json, True, key="tag")
                 for i in range(ds.num_seqs)]
    else:
        hyps: dict[int, list[int]] = {}
        evaluate(model, ds, keep, batch, dev,
                 decoder=decoder, space=space, threads=threads, workers=threads,
                 on_hyp=lambda s, h: hyps.__setitem__(s, h), score=False, vote=vote)
        lines = [f"{ds.tag(i)}\t{' '.join(labels[k] for k in hyps[i])}\n"
                 for i in range(ds.num_seqs)]
    if not args.out:
        sys.stdout.writelines(lines)
        return 0
    from rnntrain.fsutil import atomic_write
    try:  # an interrupted decode never leaves a partial file under the name
        atomic_write(args.out, "".join(lines))
    except OSError as e:
        raise UserError(f"--out {args.out}: cannot write it ({e.strerror or e})") from None
    return 0


def _cmd_transcribe(args) -> int:
    if args.threads < 0:
        raise UserError("--threads must be >= 0")
    from rnntrain.cli_decode import decoder_from_args
    from rnntrain.infer.ensemble import check_combine, load_ensemble, model_paths
    from rnntrain.infer.transcribe import check_page_out, expand, transcribe
    check_combine(args.combine)
    sources = expand(args.inputs)  # each exists and is of a known kind, before the model loads
    check_page_out(sources, args.page_out)
    paths = model_paths(args.model)
    if args.out:  # a folder, a missing folder, an input (or the model) given as --out
        from rnntrain.fsutil import check_output
        from rnntrain.infer.model import resolve  # a run folder: its best.pt is an input
        check_output(args.out, [*(resolve(p) for p in paths), *args.inputs,
                                *(s.path for s in sources)])
    from rnntrain.compute.pool import usable_cores
    threads = args.threads or usable_cores()
    combine, note = _resolve_combine(args, len(paths)) if len(paths) > 1 else ("auto", None)
    # ONNX Runtime: one intra-op thread per worker thread, as for torch
    model = load_ensemble(args.model, combine, device=args.device,
                          threads=1 if threads > 1 else 0)  # one model or several
    if note:
        print(note, file=sys.stderr)
    # the compiled decoder that decode and eval use: the same hypotheses for the same input
    decoder = decoder_from_args(args, model.labels, model.blank)
    if not args.out:
        transcribe(model, args.inputs, decoder, threads, args.json, sys.stdout,
                   nbest=args.nbest, full=args.full, page_out=args.page_out)
        return 0
    import io
    from rnntrain.fsutil import open_output
    # a file: no partial file under the name if interrupted; a pipe: lines as they come
    try:
        with open_output(args.out) as raw, io.TextIOWrapper(raw, encoding="utf-8") as fh:
            n = transcribe(model, args.inputs, decoder, threads, args.json, fh,
                           nbest=args.nbest, full=args.full, page_out=args.page_out)
    except OSError as e:  # a full disk, /dev/full: name the output
        if isinstance(e, BrokenPipeError):
            raise
        raise UserError(f"--out {args.out}: cannot write it ({e.strerror or e})") from None
    print(f"wrote {n} lines to {args.out}", file=sys.stderr)
    return 0


def _cmd_average(args) -> int:
    from rnntrain.fsutil import check_output
    from rnntrain.infer.model import resolve  # a run folder: its best.pt
    paths = [resolve(p) for p in args.models]
    check_output(args.out, paths)  # before any work; never over one of the inputs
    from rnntrain.run.average import average_checkpoints
    ck = average_checkpoints(paths, args.out)
    print(f"wrote {args.out}: the mean of {len(paths)} checkpoints' weights "
          f"({len(ck.card.labels)} labels)")
    return 0


def _cmd_export(args) -> int:
    from rnntrain.infer.export import FORMATS, TOLERANCE, training_frames
    if args.format not in FORMATS:
        raise UserError(f"--format {args.format!r}: choose one of {', '.join(FORMATS)}")
    from rnntrain.infer.api import load
    from rnntrain.infer.export import check_out
    from rnntrain.infer.transcribe import expand
    from rnntrain.infer.model import resolve  # a run folder: its best.pt is the input
    check_out(args.out, [resolve(args.model)])  # before the model loads and the export runs
    model = load(args.model)
    if args.check:  # real utterances to check the export on
        frames = [model.frames(s.path) for s in expand(args.check)[:8] if s.kind == "file"]
        where = f"{len(frames)} of the --check inputs"
    else:  # else the model's own data, else random frames
        frames, where = training_frames(model)
        where = where or "random frames (the training data is not here; give --check)"
    path = model.export(args.out, args.format, frames)
    fe = model.frontend.describe() if model.frontend is not None else \
        model.image.describe() if model.image is not None else "no front end"
    print(f"wrote {path}: {args.format}, {len(model.labels)} labels, {model.input_size} "
          f"inputs, stacking {model.subsample}; {fe}; log-probs checked against the model "
          f"on {where} (max difference <= {TOLERANCE:g})")
    return 0


def _cmd_calibrate(args) -> int:
    from rnntrain.compute.model import total_subsample
    from rnntrain.infer.model import resolve
    from rnntrain.run.calibrate import calibrate, store
    path = resolve(args.checkpoint)
    if args.out:
        from rnntrain.fsutil import check_output
        check_output(args.out, [args.data])
    cfg, ds, model, dev = _load_for_eval(str(path), args.data, args.device)
    decoder, _, threads = _decoding(args, ds, model)
    keep = ds.feasible(total_subsample(cfg.model))
    batch = args.batch_frames or cfg.batch.batch_frames
    if args.check:  # the stored temperature on held-out data: nothing is fitted or stored
        from rnntrain.infer.model import check_calibration
        from rnntrain.run import checkpoint as ckpt
        from rnntrain.run.calibrate import check, collect
        stored = check_calibration(ckpt.read(path).card.calibration, path)
        if stored is None:
            raise UserError(f"{path}: not calibrated (run rnntrain calibrate MODEL VAL first)")
        res = check(collect(model, ds, keep, batch, dev, decoder, threads),
                    float(stored["temperature"]))
        if args.json:
            print(json.dumps(res))
        else:
            print(f"{args.data}: expected calibration error {res['ece_before']:.4f} at T = 1, "
                  f"{res['ece_after']:.4f} at the stored T = {res['temperature']:.3f}; NLL "
                  f"{res['nll_before']:.4f} -> {res['nll_after']:.4f} ({res['labels']} "
                  f"labels, {res['accuracy']:.1%} correct)")
        return 0
    cal = calibrate(model, ds, keep, batch, dev, decoder, threads, data=str(args.data))
    stored = not args.dry_run and cal.labels > 0
    if stored:
        store(path, cal, args.out)
    if args.json:
        print(json.dumps({**cal.to_dict(), "stored": str(args.out or path) if stored else None}))
    elif cal.labels == 0:
        print(f"the model emits no label on {args.data}: nothing to calibrate, nothing stored")
    else:
        print(f"{cal.describe()}; " + (f"stored in {args.out or path}" if stored else
                                        "not stored (--dry-run)"))
    return 0


def _cmd_tune_decoder(args) -> int:
    from rnntrain.cli_decode import decode_threads, space_index
    from rnntrain.run.tune import tune_decoder
    cfg, ds, model, dev = _load_for_eval(args.checkpoint, args.data, args.device)
    return tune_decoder(args, cfg, ds, model, dev, space_index(args, ds.labels),
                        decode_threads(args))


def _cmd_runs(args) -> int:
    from rnntrain.tools.runs import list_runs
    print(list_runs(args.dir, as_json=args.json))
    return 0


def _cmd_sweep(args) -> int:
    from rnntrain.tools.sweep import sweep
    return sweep(args.config, args.grid, out=args.out, print_only=args.print,
                 launcher=args.launcher, show_output=args.show_output)


def _cmd_crossfold(args) -> int:
    from rnntrain.tools.crossfold import crossfold
    return crossfold(args.config, args.folds, args.overrides, out=args.out,
                     print_only=args.print, launcher=args.launcher,
                     show_output=args.show_output)


def _cmd_report(args) -> int:
    from rnntrain.tools.report import report
    md = report(args.runs, out=args.out, tensorboard=args.tensorboard)
    print(f"wrote {md} and its figures in {md.parent}")
    return 0


def _cmd_init(args) -> int:
    from rnntrain.tools.examples import write_example, write_recipe
    if args.recipe:
        if args.name is not None:
            raise UserError(f"give an example config NAME ({args.name!r}) or --recipe "
                            f"{args.recipe}, not both")
        return write_recipe(args.recipe, args.out, args.force)
    return write_example(args.name or "default", args.out, args.force, args.list)


class _HelpConfig(argparse.Action):
    """``train --help-config``: like --help, prints and exits at once."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        from rnntrain.config import explain
        print(explain())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    from rnntrain.cli_decode import add_decoder_arguments, add_output_arguments
    p = Parser(prog="rnntrain", description="Train LSTM-CTC sequence models (speech, "
               "handwriting, OCR) on RNNLIB NetCDF data, and use them. Start with `rnntrain "
               "init` (an example config) and `rnntrain train CONFIG`; `rnntrain COMMAND -h` "
               "describes each command.")
    p.add_argument("--version", action="version", version=f"rnntrain {version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    t = sub.add_parser(
        "train", help="train from a TOML config (or the built-in defaults)",
        description="Train from a TOML config; without one, from the built-in defaults "
                    "(see README, Configuration). Overrides section.key=value (also "
                    "--section.key=value or --section.key value) may stand anywhere, "
                    "before or after the options.")
    t.add_argument("config", nargs="?", help="TOML config file (default: none, the built-in "
                   "defaults; `rnntrain init` writes an example to start from)")
    t.add_argument("--resume", metavar="auto|if-any|PATH", help=(
        "continue a run: 'auto' (also --resume alone: the newest usable checkpoint in "
        "run.dir), 'if-any' (auto when run.dir holds a checkpoint, else a fresh run: for "
        "requeued batch jobs), a checkpoint file or a run folder. --resume takes the next "
        "word only when it is one of these (an existing file or folder); --resume=PATH "
        "always does"))
    t.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace (JSON) of "
                   "every thread and rank for a window of steps")
    t.add_argument("--trace-steps", metavar="A:B", default="1:11",
                   help="global steps A <= step < B to trace (default 1:11)")
    t.add_argument("--help-config", action=_HelpConfig,
                   help="print every config key (type, default, limits, description) and exit")
    t.set_defaults(overrides=[])
    for name, hlp in (("eval", "score a checkpoint on a dataset"),
                      ("decode", "print tag and hypothesis per sequence")):
        e = sub.add_parser(name, help=hlp, description=hlp[0].upper() + hlp[1:] + ".")
        e.add_argument("checkpoint", help="a .pt checkpoint written by rnntrain train, or "
                                          "its run folder (its best.pt); several models: "
                                          "a crossfold folder or paths joined by commas")
        e.add_argument("data", help=".nc file or dataset manifest" +
                       (" (targets optional)" if name == "decode" else ""))
        e.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
        e.add_argument("--batch-frames", type=non_negative_int, default=0,
                       help="padded frames per batch (0 = the checkpoint's batch.batch_frames)")
        add_decoder_arguments(e)
        _add_combine(e)
        if name == "eval":
            e.add_argument("--json", action="store_true", help="print one JSON object: "
                           "\"best\" (best path; its figures also at the top level), "
                           "\"beam\" (the beam search's, else null) and \"beam_width\"")
            e.add_argument("--details", metavar="FILE", help="write per-sequence reference/"
                           "hypothesis alignments and the most frequent substitutions, "
                           "deletions and insertions (the beam search's, if any)")
        else:
            e.add_argument("--out", help="write here instead of stdout")
            add_output_arguments(e)
            e.add_argument("--json", action="store_true", help="JSON lines (tag, text, "
                           "labels, confidences, starts/ends, scores; docs/decoding.md)")
    c = sub.add_parser("calibrate", help="fit the confidence temperature on labelled "
                       "data and store it in the checkpoint",
                       description="Runs the model over DATA (validation data with targets), "
                       "fits the temperature T that makes the per-label confidences of "
                       "transcribe/decode calibrated (minimum NLL of per-label correctness), "
                       "prints the expected calibration error before and after, and stores "
                       "T in the checkpoint (atomically; --out: in a copy).")
    c.add_argument("checkpoint", help="a .pt checkpoint or its run folder (its best.pt)")
    c.add_argument("data", help="labelled .nc file or dataset manifest (not the training data)")
    c.add_argument("--out", help="write the calibrated checkpoint here instead")
    c.add_argument("--dry-run", action="store_true", help="print the fit, store nothing")
    c.add_argument("--check", action="store_true", help="fit nothing: the ECE of DATA at T "
                   "= 1 and at the checkpoint's stored temperature (held-out test data)")
    c.add_argument("--json", action="store_true", help="print the fit as JSON")
    c.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    c.add_argument("--batch-frames", type=non_negative_int, default=0,
                   help="padded frames per batch (0 = the checkpoint's batch.batch_frames)")
    add_decoder_arguments(c)
    u = sub.add_parser("tune-decoder", help="search LM weight and word bonus on a "
                       "validation set", description="Runs the network once over DATA, then "
                       "decodes it for every LM weight x word bonus in the grid; prints the "
                       "table (WER with --space, else LER) and the best pair.")
    u.add_argument("checkpoint", help="a .pt checkpoint written by rnntrain train")
    u.add_argument("data", help="validation .nc file or dataset manifest")
    u.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    u.add_argument("--batch-frames", type=non_negative_int, default=0,
                   help="padded frames per batch (0 = the checkpoint's batch.batch_frames)")
    add_decoder_arguments(u)
    u.add_argument("--lm-weights", default="0,0.25,0.5,0.75,1,1.5,2",
                   help="comma-separated LM weights to try")
    u.add_argument("--word-bonuses", default="-1,0,1,2",
                   help="comma-separated word bonuses to try")
    u.add_argument("--label-bonuses", default=None, help="comma-separated label bonuses to "
                   "try (default: --label-bonus alone)")
    u.add_argument("--select", choices=("wer", "ler"), default="wer", help="the rate the best "
                   "setting minimises: wer (default; LER without --space) or ler")
    u.add_argument("--json", action="store_true", help="print the table as JSON")
    tr = sub.add_parser("transcribe", help="transcribe audio, images, feature arrays or NetCDF "
                                           "files",
                        description="One line per utterance: input, hypothesis, and the time "
                                    "(s) of each label's CTC peak (TSV), or JSON lines.")
    tr.add_argument("model", help="checkpoint, run folder (its best.pt) or exported model; "
                    "several models: a crossfold folder or paths joined by commas")
    tr.add_argument("inputs", nargs="+", metavar="INPUT",
                    help="audio files (WAV, FLAC, ...), images (PNG, JPEG, TIFF; models "
                         "trained on images), .npy arrays, .nc files, folders, or list files "
                         "(one path per line)")
    add_decoder_arguments(tr, threads=False)  # --beam, --lm, --lexicon as decode takes them
    _add_combine(tr)
    tr.add_argument("--json", action="store_true", help="JSON lines instead of TSV")
    add_output_arguments(tr)
    tr.add_argument("--page-out", metavar="DIR", help="PAGE-XML inputs: write each page "
                    "into DIR (same file name) with its lines' text and confidence "
                    "(TextEquiv, @conf)")
    tr.add_argument("--out", help="write here instead of stdout")
    tr.add_argument("--threads", type=int, default=0,
                    help="utterances in parallel (default: the cores)")
    tr.add_argument("--device", default="cpu", help="checkpoints: cpu, cuda, cuda:N")
    x = sub.add_parser("export", help="export a model as TorchScript or ONNX",
                       description="Write the model (fp32, variable batch and length, labels "
                                   "and front end as metadata), checked against the model.")
    x.add_argument("model", help="checkpoint or run folder")
    x.add_argument("--format", required=True, help="torchscript or onnx")
    x.add_argument("--out", required=True, help="output file (.pt/.ts or .onnx)")
    x.add_argument("--check", nargs="*", metavar="INPUT", default=None,
                   help="audio, image or .npy files to check the export on (default: the "
                        "checkpoint's own .nc data when it is there, else random frames)")
    a = sub.add_parser("average", help="average the weights of several checkpoints",
                       description="Write the arithmetic mean of the weights of checkpoints "
                                   "of one architecture and alphabet (icefall's checkpoint "
                                   "averaging); a model to evaluate, use or fine-tune from.")
    a.add_argument("models", nargs="+", metavar="CKPT",
                   help="checkpoints or run folders (their best.pt)")
    a.add_argument("--out", required=True, help="the averaged checkpoint to write")
    r = sub.add_parser("runs", help="list run folders: status, epochs, best LER, speed",
                       description="List the run folders under DIR, one line each: status "
                                   "(running, finished, stopped, failed, or died), epochs and "
                                   "steps done, best validation LER, frames/s and wall time. "
                                   "Safe beside a live training (it only reads).")
    r.add_argument("dir", nargs="?", default="runs", help="folder to search")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w = sub.add_parser("sweep", help="train a grid of configurations and tabulate them",
                       description="Train every combination of key=v1,v2,... one after "
                                   "another and write results.md/results.csv.")
    w.add_argument("config", help="TOML config every run starts from")
    w.add_argument("grid", nargs="+", help="section.key=v1,v2,... (one value: all runs)")
    w.add_argument("--out", help="sweep folder (default sweeps/<config>-<date-time>)")
    w.add_argument("--print", action="store_true", help="print the commands, run nothing")
    w.add_argument("--launcher", default="", help="prefix for each run, e.g. 'mpiexec -n 4' "
                   "(default: none)")
    w.add_argument("--show-output", action="store_true",
                   help="show each run's output instead of saving it in console.log")
    c = sub.add_parser("crossfold", help="train K models on the K folds of the training data",
                       description="Fold i trains on every fold of data.train but i and "
                                   "validates on fold i (data.folds, data.fold), one fold after "
                                   "another, each a run folder OUT/fold-i; the same command "
                                   "again continues unfinished folds. OUT is then a model for "
                                   "eval, decode and transcribe: the ensemble of the folds. "
                                   "Overrides section.key=value may stand anywhere.")
    c.add_argument("config", help="TOML config every fold starts from (data.val is unused)")
    c.add_argument("--folds", type=positive_int, required=True, help="K, the number of folds "
                   "and models (2 or more; Calamari uses 5)")
    c.add_argument("--out", help="crossfold folder (default runs/<config>-crossfoldK)")
    c.add_argument("--print", action="store_true", help="write OUT/crossfold.json and print "
                   "the K training commands (for a cluster), train nothing")
    c.add_argument("--launcher", default="", help="prefix for each fold, e.g. 'mpiexec -n 4'")
    c.add_argument("--show-output", action="store_true",
                   help="show each fold's output instead of saving it in console.log")
    c.set_defaults(overrides=[])
    g = sub.add_parser("report", help="plots and a markdown summary of one or more runs",
                       description="Plot loss, LER (log axis, the best checkpoint marked) "
                                   "and learning rate against the epoch for one or more runs "
                                   "(several overlay), and write report.md beside the PNGs.")
    g.add_argument("runs", nargs="+", help="run folders (several overlay)")
    g.add_argument("--out", help="output folder (default RUN/report, or ./report)")
    g.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard event files (needs tensorboard)")
    n = sub.add_parser("init", help="write an example config or recipe to start from",
                       description="Write one of the example configs shipped with rnntrain "
                                   "into the current folder (or --out) and say how to get "
                                   "its data; or, with --recipe, a recipe script (with the "
                                   "scripts and configs it uses) that makes its data and "
                                   "trains.")
    n.add_argument("name", nargs="?", default=None,
                   help="which example (default: default; --list shows them)")
    n.add_argument("--recipe", metavar="NAME", help="write recipes/NAME.sh, what it runs and "
                   "its configs under the current folder (or --out)")
    n.add_argument("--out", help="file to write (default NAME.toml here); with --recipe: the "
                   "folder (default here)")
    n.add_argument("--force", action="store_true", help="overwrite an existing file")
    n.add_argument("--list", action="store_true", help="list the examples and exit")
    from rnntrain import cli_finetune, cli_models, cli_rank
    cli_models.add_parser(sub)
    cli_finetune.add_parser(sub)
    cli_rank.add_parser(sub)
    return p


def _add_combine(p):
    p.add_argument("--combine", default="auto", metavar="auto|vote|posteriors",
                   help="several models: vote on their best paths by confidence as "
                        "Calamari does, or average their frame posteriors (one frame "
                        "rate); auto (default): vote, unless --beam, --lexicon, --lm, "
                        "--nbest, --full or --json (decode, transcribe) need the "
                        "posteriors (README, Ensembles)")


def _resolve_combine(args, n_models: int) -> tuple[str, str | None]:
    """``--combine`` for ``n_models`` (> 1) models → ("vote" or "posteriors"
    (``infer.ensemble.resolve_combine``), the line to print on stderr once the models are
    loaded when ``auto`` averages, else None)."""
    from rnntrain.infer.ensemble import resolve_combine
    needs = [opt for opt, on in (("--beam", bool(args.beam)), ("--lexicon", args.lexicon),
                                 ("--lm", args.lm),
                                 ("--nbest", getattr(args, "nbest", 1) > 1),
                                 ("--full", getattr(args, "full", False)),
                                 # eval's --json is a score; decode's/transcribe's: spans
                                 ("--json", args.cmd != "eval" and args.json)) if on]
    combine = resolve_combine(args.combine, needs)
    if args.combine == "auto" and combine == "posteriors":
        return combine, (f"rnntrain: --combine auto: averaging the {n_models} models' "
                         f"posteriors for {', '.join(needs)} (a plain best path is voted)")
    return combine, None


def _prepare(argv: list[str]) -> tuple[list[str], list[str], str | None]:
    """Overrides and --resume are taken out before argparse sees the line, so they may stand
    anywhere (argparse alone would read `--resume run.dir=x` as a path and `--trace t.json
    run.dir=x` as a stray argument)."""
    from rnntrain.config import section_names
    i = next((k for k, a in enumerate(argv) if not a.startswith("-")), None)
    if i is None or argv[i] not in ("train", "crossfold", "finetune"):
        return argv, [], None
    head, rest = argv[: i + 1], argv[i + 1:]
    rest, overrides = split_overrides(rest, section_names())
    rest, resume = take_resume(rest) if argv[i] == "train" else (rest, None)
    return head + rest, overrides, resume


def _cmd_finetune(args) -> int:
    from rnntrain import cli_finetune
    return cli_finetune.run(args)


def _cmd_rank_lines(args) -> int:
    from rnntrain import cli_rank
    return cli_rank.run(args)


def _cmd_models(args) -> int:
    from rnntrain import cli_models
    return cli_models.run(args)


HANDLERS = {"train": _cmd_train, "eval": _cmd_eval, "decode": _cmd_decode,
            "tune-decoder": _cmd_tune_decoder,
            "calibrate": _cmd_calibrate, "transcribe": _cmd_transcribe,
            "export": _cmd_export, "average": _cmd_average, "runs": _cmd_runs,
            "sweep": _cmd_sweep,
            "crossfold": _cmd_crossfold,
            "report": _cmd_report, "init": _cmd_init, "models": _cmd_models,
            "finetune": _cmd_finetune, "rank-lines": _cmd_rank_lines}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = next((a for a in argv if not a.startswith("-")), "rnntrain")
    try:
        argv, overrides, resume = _prepare(argv)
    except UserError as e:
        print(f"rnntrain {cmd}: error: {e}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if args.cmd in ("train", "crossfold", "finetune"):
        args.overrides, args.resume = overrides, resume
    return run_main("rnntrain", args.cmd, HANDLERS[args.cmd], args)
