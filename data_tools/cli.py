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
    print(inspect(a.path, a.subsample))


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
    s.add_argument("--noise", type=float, default=0.6)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET")
    s.set_defaults(fn=_synth)
    i = sub.add_parser("inspect", help="summarise a .nc file or dataset manifest")
    i.add_argument("path")
    i.add_argument("--subsample", type=int, default=1,
                   help="frame stacking used in training (for the infeasible count)")
    i.set_defaults(fn=_inspect)
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
