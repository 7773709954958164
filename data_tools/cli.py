"""``rnntrain-data``: make, convert and check RNNLIB-format NetCDF datasets."""
from __future__ import annotations

import argparse
import sys

from rnntrain.errors import UserError
from rnntrain.ncdata import FORMATS


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
        raise UserError(f"{len(problems)} chunk file(s) failed verification; first: {problems[0]}")


def _shard(a):
    from .shard import shard

    def progress(s, c, entry):
        print(f"  shard {s} chunk {c}: {entry['numSeqs']} sequences, "
              f"{entry['numTimesteps']:,} frames", flush=True)
    path = shard(a.inputs, a.shards, a.out, a.chunk_frames, a.chunk_seqs, a.seed, a.within,
                 a.merge_labels, a.format, progress if a.verbose else None)
    print(f"wrote {path}")


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
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        a.fn(a)
    except UserError as e:
        print(f"rnntrain-data {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    return 0
