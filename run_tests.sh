#!/usr/bin/env bash
# Run the test suite (sets up .venv with the pinned dependencies on first use).
# Extra arguments go to pytest, e.g. ./run_tests.sh -k ctc
# The default run leaves out the tests marked slow (long end-to-end cases that a faster
# default test also covers); -m "" runs everything (.ci/run does), -m slow only those.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
exec python -m pytest -q -m "not slow" "$@"
