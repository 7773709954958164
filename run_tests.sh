#!/usr/bin/env bash
# Run the test suite (sets up .venv with the pinned dependencies on first use).
# Extra arguments go to pytest, e.g. ./run_tests.sh -k ctc
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
exec python -m pytest -q "$@"
