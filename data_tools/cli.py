"""``rnntrain-data``: make, convert and check RNNLIB-format NetCDF datasets."""
from __future__ import annotations

import argparse
import sys

from rnntrain.errors import UserError
from rnntrain.data.ncdata import FORMATS


def _synth(a):
    from .synth import write_synth
    write_synth(a.out, a.seqs, a.labels, a.inputs, a.seed, a.format,
                mean_labels=a.mean_labels, noise=a.noise)
    print(f"wrote {a.out}: {a.seqs} sequences")


def _inspect(a):
    from .inspect_nc import inspect
    problems: list[str] = []
    print(inspect(a.path, a.subsample, problems=problems))
    if problems:
        raise UserError(f"{len(problems)} problem(s) found; first: {problems[0]}")


def _shard(a):
    from .shard import shard

    def progress(s, c, entry):
        print(f"  shard {s} chunk {c}: {entry['numSeqs']} sequences, "
              f"{entry['numTimesteps']:,} frames", flush=True)
    path = shard(a.inputs, a.shards, a.out, a.chunk_frames, a.chunk_seqs, a.seed, a.within,
                 a.merge_labels, a.format, progress if a.verbose else None)
    print(f"wrote {path}")


def _audio(a):
    from .audio import AudioSource, convert, feature_config, parse_labels
    cfg = feature_config(a.features, a.rate, a.mels, a.stats, a.list)
    st = convert(a.list, a.out, AudioSource(cfg), a.stats, a.save_stats,
                 parse_labels(a.labels) if a.labels else None, a.format)
    print(f"wrote {a.out}: {cfg.kind} {cfg.size} features at {cfg.rate} Hz, "
          f"{len(st.labels)} labels" + ("" if a.stats else f"; statistics from {st.frames} "
                                        f"frames saved to {a.save_stats or a.out + '.stats.json'}"))


def _convert(a):
    from .audio import ArraySource, convert, parse_labels
    st = convert(a.list, a.out, ArraySource(), a.stats, a.save_stats,
                 parse_labels(a.labels) if a.labels else None, a.format)
    print(f"wrote {a.out}: {len(st.mean)} features, {len(st.labels)} labels"
          + ("" if a.stats else f"; statistics saved to {a.save_stats or a.out + '.stats.json'}"))


def _fsdd_strings(a):
    from .fsdd import make_strings, parse_range
    lst = make_strings(a.recordings, a.split, a.count, parse_range(a.digits, "--digits"),
                       a.seed, a.out, parse_range(a.takes, "--takes") if a.takes else None)
    print(f"wrote {a.count} {a.split} strings and {lst}")


def _yesno_lists(a):
    from .yesno import make_lists
    out = make_lists(a.recordings, a.out, a.seed, a.test, a.val)
    print("wrote " + ", ".join(str(p) for p in out.values()))


def _list_args(s, what: str):
    s.add_argument("--list", required=True, help=f"LIST.tsv: {what}<TAB>transcript per line")
    s.add_argument("--out", required=True, help="output .nc file")
    s.add_argument("--stats", help="apply these saved statistics (validation/test sets)")
    s.add_argument("--save-stats", help="where to save the statistics computed on this list "
                                        "(default OUT.stats.json)")
    s.add_argument("--labels", help="alphabet in index order, comma-separated "
                                    "(default: sorted set of transcript tokens)")
    s.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET")


def _rnnlib_config(a):
    from .rnnlib_config import convert_file
    toml, warnings = convert_file(a.config)
    for w in warnings:
        print(f"rnntrain-data rnnlib-config: warning: {w}", file=sys.stderr)
    print(toml, end="")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rnntrain-data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("synth", help="write a synthetic CTC dataset")
    s.add_argument("out")
    s.add_argument("--seqs", type=int, default=2000)
    s.add_argument("--labels", type=int, default=20)
    s.add_argument("--inputs", type=int, default=20, help="inputPattSize")
    s.add_argument("--mean-labels", type=float, default=6.0)
    s.add_argument("--noise", type=float, default=0.5)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET")
    s.set_defaults(fn=_synth)
    i = sub.add_parser("inspect", help="summarise a .nc file or dataset manifest")
    i.add_argument("path")
    i.add_argument("--subsample", type=int, default=1,
                   help="frame stacking used in training (for the infeasible count)")
    i.set_defaults(fn=_inspect)
    h = sub.add_parser("shard", help="length-sorted shards + manifest (streaming)")
    h.add_argument("inputs", nargs="+", metavar="INPUT.nc")
    h.add_argument("--shards", type=int, required=True, help="number of shards (a multiple "
                   "of the number of MPI ranks you will train on)")
    h.add_argument("--out", required=True, help="output folder (gets manifest.json)")
    g = h.add_mutually_exclusive_group()
    g.add_argument("--chunk-frames", type=int, help="frames per chunk file (default 2000000)")
    g.add_argument("--chunk-seqs", type=int, help="sequences per chunk file")
    h.add_argument("--seed", type=int, default=1, help="breaks length ties (and shuffles "
                   "with --within shuffle)")
    h.add_argument("--within", choices=("sorted", "shuffle"), default="sorted",
                   help="order inside a shard: sorted by length (default) or shuffled "
                   "(the RNNLIB recipe)")
    h.add_argument("--merge-labels", action="store_true",
                   help="allow inputs with different alphabets (uses their union)")
    h.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET")
    h.add_argument("-v", "--verbose", action="store_true", help="print each chunk written")
    h.set_defaults(fn=_shard)
    a = sub.add_parser("audio", help="WAV files listed in a LIST.tsv → normalised features .nc")
    _list_args(a, "path.wav")
    a.add_argument("--features", choices=("fbank", "mfcc"),
                   help="log-mel filterbank (default) or MFCC 13 + delta + delta-delta")
    a.add_argument("--rate", type=int, help="feature sample rate in Hz; other rates are "
                                            "resampled (default: the first file's rate)")
    a.add_argument("--mels", type=int, help="mel bands (default 40)")
    a.set_defaults(fn=_audio)
    c = sub.add_parser("convert", help=".npy arrays (frames, features) listed in a LIST.tsv "
                                       "→ normalised .nc")
    _list_args(c, "path.npy")
    c.set_defaults(fn=_convert)
    f = sub.add_parser("fsdd-strings", help="connected-digit WAVs + LIST.tsv from FSDD")
    f.add_argument("--recordings", required=True, help="FSDD recordings/ folder")
    f.add_argument("--split", choices=("train", "test"), required=True,
                   help="train: takes 5-49; test: takes 0-4")
    f.add_argument("--takes", help="narrow the split's takes, e.g. 5-9")
    f.add_argument("--count", type=int, default=1000)
    f.add_argument("--digits", default="3-7", help="digits per string, A-B")
    f.add_argument("--seed", type=int, default=1)
    f.add_argument("--out", required=True, help="output folder (wav/, list.tsv, sources.tsv)")
    f.set_defaults(fn=_fsdd_strings)
    y = sub.add_parser("yesno-lists", help="seeded train/val/test LIST.tsv files for YesNo")
    y.add_argument("--recordings", required=True, help="the waves_yesno/ folder")
    y.add_argument("--out", required=True, help="output folder (train.tsv, val.tsv, test.tsv)")
    y.add_argument("--seed", type=int, default=1)
    y.add_argument("--test", type=int, default=15, help="held-out recordings")
    y.add_argument("--val", type=int, default=5, help="validation recordings (from the rest)")
    y.set_defaults(fn=_yesno_lists)
    r = sub.add_parser("rnnlib-config", help="convert an RNNLIB config file to rnntrain TOML "
                       "(stdout; warnings on stderr)")
    r.add_argument("config", help="RNNLIB config file ('name value' lines)")
    r.set_defaults(fn=_rnnlib_config)
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        a.fn(a)
    except UserError as e:
        print(f"rnntrain-data {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 0
