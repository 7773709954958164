# Sourced by run_train.sh and run_tests.sh: make sure a virtual environment with rnntrain
# and its pinned dependencies exists ($VENV, default .venv), then put it first on PATH.
# EXTRAS selects the optional dependency groups (default: dev,mpi).
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev,mpi}
if [ ! -x "$VENV/bin/python" ]; then
  echo "setting up $VENV (first run only) ..." >&2
  python3 -m venv "$VENV"
fi
stamp="$VENV/.rnntrain-installed-$(cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)-$EXTRAS"
if [ ! -f "$stamp" ]; then
  # constraints.txt pins torch to the CPU build we test with; GPU users install their own
  # torch build first and drop the -c (see README).
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[$EXTRAS]"
  rm -f "$VENV"/.rnntrain-installed-*
  touch "$stamp"
fi
export PATH="$PWD/$VENV/bin:$PATH"
