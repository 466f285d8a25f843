#!/usr/bin/env bash
# The whole test suite: once in one process with 8 simulated CPU devices, then under
# mpirun -np 2 (4 devices per process) and -np 4 (2 per process): 8 devices in every run.
# Every step has a timeout, so a stuck rank fails the run instead of hanging it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
MPIRUN=${MPIRUN:-$BIN/mpirun}

echo "== single process, 8 devices"
PENCILFFT_TEST_DEVICES=8 timeout 1200 "$PY" -m pytest -q "$@"

for np in 2 4; do
  echo "== mpirun -np $np, $((8 / np)) devices per process"
  PENCILFFT_TEST_DEVICES=$((8 / np)) timeout 900 "$MPIRUN" -np "$np" \
    "$PY" -m pytest -q -p no:cacheprovider "$@"
done
