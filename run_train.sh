#!/usr/bin/env bash
# Train with a config: ./run_train.sh [--np N] [CONFIG] [section.key=value ...]
# With no CONFIG it trains configs/default.toml on generated synthetic data.
# NP=N (or --np N) runs N MPI ranks with mpiexec ($MPIEXEC overrides the launcher, e.g. a
# system Open MPI's mpiexec on a cluster).
set -euo pipefail
cd "$(dirname "$0")"
NP=${NP:-1}
if [ "${1:-}" = "--np" ]; then NP=$2; shift 2; fi
CONFIG=configs/default.toml
if [ $# -gt 0 ] && [[ "$1" != *=* ]] && [[ "$1" != -* ]]; then CONFIG=$1; shift; fi
source scripts/env.sh
if [ "$CONFIG" = configs/default.toml ]; then
  mkdir -p data  # a fresh clone has none (data/ is not tracked)
  [ -f data/synth_train.nc ] || python -m data_tools synth data/synth_train.nc --seqs 3000 --seed 1
  [ -f data/synth_val.nc ] || python -m data_tools synth data/synth_val.nc --seqs 200 --seed 2
fi
if [ "$NP" -gt 1 ]; then
  exec "${MPIEXEC:-mpiexec}" -n "$NP" python -m rnntrain train "$CONFIG" "$@"
fi
exec python -m rnntrain train "$CONFIG" "$@"
