"""``rnntrain`` command line: train, eval, decode, tune-decoder, runs, sweep, report.

User mistakes (UserError, a ValueError) print one line and exit 2, without a traceback.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from rnntrain.errors import UserError


_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _cmd_train(args) -> int:
    from rnntrain.config import load_config
    cfg = load_config(args.config, args.overrides)
    if args.trace:
        from rnntrain.run import trace
        trace.configure(args.trace, trace.parse_window(args.trace_steps))
    from rnntrain.run.train import train  # torch: imported once the arguments are known to be good
    try:
        train(cfg, args.config, args.overrides, resume=args.resume)
    except BaseException as e:
        from rnntrain.parallel import mpi as dist
        dist.fail(e)  # under MPI: name this rank and abort the whole job (no hang)
        raise
    return 0


def _load_for_eval(checkpoint: str, data: str, device: str):
    import torch
    from rnntrain.run import checkpoint as ckpt
    from rnntrain.config import config_from_dict
    from rnntrain.data.dataset import Dataset, check_fits
    from rnntrain.errors import DataError
    from rnntrain.compute.model import build_model
    from rnntrain.compute.device import pick_device
    ck = ckpt.load(checkpoint, need=ckpt.MODEL_KEYS)
    try:
        cfg = config_from_dict(ck["config"])
    except UserError as e:
        raise UserError(f"{checkpoint}: its config does not fit this rnntrain ({e})") from None
    ds = Dataset.open(data, cfg.data.chunk_frames)
    check_fits(ds, ck["labels"], ck["input_size"], "the checkpoint's")
    height = ck.get("image_height", 0)
    if ds.is_2d:
        ds.set_pad_height(height or 1, f"checkpoint {checkpoint}")
    if (ds.column_height or ds.is_2d) and ds.frame_height != height:
        raise DataError(data, f"image height {ds.frame_height} differs from the "
                              f"checkpoint's ({height})")
    dev = pick_device(device)
    model = build_model(cfg.model, ds.frame_size, len(ck["labels"]), max(height, 1))
    try:
        model.load_state_dict(ck["model"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{checkpoint}: its weights do not fit its own [model] section "
                        f"({(str(e).splitlines() or [type(e).__name__])[0][:200]})") from None
    model.to(dev)
    return cfg, ds, model, dev


def _decoding(args, ds, model):
    """The decoder the options ask for (or None), the separator's index, thread count."""
    from rnntrain.decode.options import decode_threads, decoder_from_args, space_index
    return (decoder_from_args(args, ds.labels, model.blank), space_index(args, ds.labels),
            decode_threads(args))


def _cmd_eval(args) -> int:
    from rnntrain.compute.model import total_subsample
    from rnntrain.run.evaluate import evaluate
    cfg, ds, model, dev = _load_for_eval(args.checkpoint, args.data, args.device)
    decoder, space, threads = _decoding(args, ds, model)
    keep = ds.feasible(total_subsample(cfg.model))
    if not keep.any():  # a score over nothing would read as LER 0
        raise UserError(f"{args.data}: none of its {ds.num_seqs} sequences is long enough "
                        f"for its target (subsampling {total_subsample(cfg.model)}): nothing "
                        "to score")
    counts = evaluate(model, ds, keep, args.batch_frames or cfg.train.batch_frames, dev,
                      decoder=decoder, space=space, threads=threads)
    out = {k: c.summary() for k, c in counts.items()}
    if decoder is not None:
        out["beam"]["decoder"] = decoder.describe()
    if args.json:
        print(json.dumps(out if decoder is not None else out["best"]))
    else:
        for k, s in out.items():
            name = "best path" if k == "best" else decoder.describe()
            wer = f"WER {s['wer']:.4f}, " if "wer" in s else ""
            print(f"{name:>10}: {wer}LER {s['ler']:.4f} (sub {s['sub']:.4f}, del {s['del']:.4f}, "
                  f"ins {s['ins']:.4f}), sequence error {s['seq_error']:.4f}, CTC loss "
                  f"{s['loss']:.4f}, {s['seqs']} sequences, {s['skipped']} skipped")
    return 0


def _cmd_decode(args) -> int:
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise UserError(f"--out {args.out}: its folder does not exist")  # before decoding
    from rnntrain.compute.model import total_subsample
    from rnntrain.run.evaluate import evaluate
    cfg, ds, model, dev = _load_for_eval(args.checkpoint, args.data, args.device)
    decoder, space, threads = _decoding(args, ds, model)
    keep = ds.feasible(total_subsample(cfg.model))
    hyps: dict[int, list[int]] = {}
    evaluate(model, ds, keep, args.batch_frames or cfg.train.batch_frames, dev,
             decoder=decoder, space=space, threads=threads,
             on_hyp=lambda s, h: hyps.__setitem__(s, h))
    lines = []
    for i in range(ds.num_seqs):
        hyp = " ".join(ds.labels[k] for k in hyps[i]) if i in hyps else "<skipped: too short>"
        lines.append(f"{ds.tag(i)}\t{hyp}\n")
    if not args.out:
        sys.stdout.writelines(lines)
        return 0
    from rnntrain.fsutil import atomic_write
    try:  # an interrupted decode never leaves a partial file under the name
        atomic_write(args.out, "".join(lines))
    except OSError as e:
        raise UserError(f"cannot write {args.out} ({e.strerror})") from None
    return 0


def _cmd_tune_decoder(args) -> int:
    from rnntrain.run.tune import tune_decoder
    cfg, ds, model, dev = _load_for_eval(args.checkpoint, args.data, args.device)
    return tune_decoder(args, cfg, ds, model, dev)


def _cmd_runs(args) -> int:
    from rnntrain.tools.runs import list_runs
    print(list_runs(args.dir, as_json=args.json))
    return 0


def _cmd_sweep(args) -> int:
    from rnntrain.tools.sweep import sweep
    return sweep(args.config, args.grid, out=args.out, print_only=args.print,
                 launcher=args.launcher, show_output=args.show_output)


def _cmd_report(args) -> int:
    from rnntrain.tools.report import report
    md = report(args.runs, out=args.out, tensorboard=args.tensorboard)
    print(f"wrote {md} and its figures in {md.parent}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from rnntrain.decode.options import add_decoder_arguments
    p = argparse.ArgumentParser(prog="rnntrain", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train from a TOML config",
                       description="Train from a TOML config. Overrides: section.key=value.")
    t.add_argument("config")
    t.add_argument("overrides", nargs="*", help="section.key=value (TOML values)")
    t.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="continue from a checkpoint: a path, or 'auto' (newest in run.dir)")
    t.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace (JSON) of "
                   "every thread and rank for a window of steps")
    t.add_argument("--trace-steps", metavar="A:B", default="1:11",
                   help="global steps A <= step < B to trace (default 1:11)")
    for name, hlp in (("eval", "score a checkpoint on a dataset"),
                      ("decode", "print tag and hypothesis per sequence")):
        e = sub.add_parser(name, help=hlp)
        e.add_argument("checkpoint")
        e.add_argument("data", help=".nc file or dataset manifest")
        e.add_argument("--device", default="cpu")
        e.add_argument("--batch-frames", type=int, default=0)
        add_decoder_arguments(e)
        if name == "eval":
            e.add_argument("--json", action="store_true")
        else:
            e.add_argument("--out", help="write here instead of stdout")
    u = sub.add_parser("tune-decoder", help="search LM weight and word bonus on a "
                       "validation set", description="Runs the network once over DATA, then "
                       "decodes it for every LM weight x word bonus in the grid; prints the "
                       "table (WER with --space, else LER) and the best pair.")
    u.add_argument("checkpoint")
    u.add_argument("data", help="validation .nc file or dataset manifest")
    u.add_argument("--device", default="cpu")
    u.add_argument("--batch-frames", type=int, default=0)
    add_decoder_arguments(u)
    u.add_argument("--lm-weights", default="0,0.25,0.5,0.75,1,1.5,2",
                   help="comma-separated LM weights to try")
    u.add_argument("--word-bonuses", default="-1,0,1,2",
                   help="comma-separated word bonuses to try")
    u.add_argument("--json", action="store_true", help="print the table as JSON")
    r = sub.add_parser("runs", help="list run folders: status, epochs, best LER, speed")
    r.add_argument("dir", nargs="?", default="runs", help="folder to search (default runs)")
    r.add_argument("--json", action="store_true")
    w = sub.add_parser("sweep", help="train a grid of configurations and tabulate them",
                       description="Train every combination of key=v1,v2,... one after "
                                   "another and write results.md/results.csv.")
    w.add_argument("config")
    w.add_argument("grid", nargs="+", help="section.key=v1,v2,... (one value: all runs)")
    w.add_argument("--out", help="sweep folder (default sweeps/<config>-<date-time>)")
    w.add_argument("--print", action="store_true", help="print the commands, run nothing")
    w.add_argument("--launcher", default="", help="prefix for each run, e.g. 'mpiexec -n 4'")
    w.add_argument("--show-output", action="store_true",
                   help="show each run's output instead of saving it in console.log")
    g = sub.add_parser("report", help="plots and a markdown summary of one or more runs")
    g.add_argument("runs", nargs="+", help="run folders (several overlay)")
    g.add_argument("--out", help="output folder (default RUN/report, or ./report)")
    g.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard event files (needs tensorboard)")
    return p


def main(argv=None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if args.cmd == "train":
        # `--section.key=value` overrides look like options to argparse
        bad = [a for a in extra if not (a.startswith("--") and "=" in a and "." in a)]
        if bad:
            build_parser().error(f"unrecognized arguments: {' '.join(bad)}")
        args.overrides = list(args.overrides) + extra
    elif extra:
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    handler = {"train": _cmd_train, "eval": _cmd_eval, "decode": _cmd_decode,
               "tune-decoder": _cmd_tune_decoder,
               "runs": _cmd_runs, "sweep": _cmd_sweep, "report": _cmd_report}[args.cmd]
    try:
        return handler(args)
    except UserError as e:
        print(f"rnntrain {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in _STORAGE_ERRORS:
            raise
        # disk full, quota, file size limit, read-only: a condition of the machine, not a bug
        print(f"rnntrain {args.cmd}: error: cannot write {e.filename or 'a file'} "
              f"({e.strerror}); checkpoints written before are intact", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rnntrain {args.cmd}: interrupted", file=sys.stderr)
        return 130
