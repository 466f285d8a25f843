#!/usr/bin/env bash
# Here, before `python -m benchmarks.device` runs on a lent GPU machine (no network there):
# the Python 3.12 manylinux wheels it lacks into .whl/, and JaxPM's source into .carry/JaxPM.
# Both folders are git-ignored (.git/info/exclude), never committed; the device call names
# them in `carry` (64 MiB at most together with the tree: these are about 18 MiB).
#
#   bash benchmarks/device_prep.sh [JAXPM_GIT_DIR]
#
# JAXPM_GIT_DIR: a bare clone of github.com/DifferentiableUniverseInitiative/JaxPM (the `fetch`
# tool brings one to /work/.mirror/DifferentiableUniverseInitiative+JaxPM/repo, the default);
# only its jaxpm/ package is extracted (the mirror may lack large notebook blobs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JAXPM_GIT=${1:-/work/.mirror/DifferentiableUniverseInitiative+JaxPM/repo}
EXCLUDE=$(git rev-parse --git-path info/exclude)
for d in /.whl/ /.carry/; do
  grep -qxF "$d" "$EXCLUDE" 2>/dev/null || echo "$d" >> "$EXCLUDE"
done

# The machine has jax 0.11.2 (CUDA), numpy, scipy, pytest(-xdist), rich, mpi4py (without an MPI
# library); it lacks FFTW (pyFFTW's wheel bundles it), an MPI runtime with mpirun (mpich's
# wheel), and jaxdecomp (its PyPI wheel: the JAX backend only, no cuDecomp build exists there).
# mpi4py comes too: the same version as here, built for mpich's ABI.
mkdir -p .whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  pyfftw==0.15.1 mpi4py==4.1.2 mpich==5.0.2 jaxdecomp==0.3.1

rm -rf .carry/JaxPM && mkdir -p .carry/JaxPM
git --git-dir="$JAXPM_GIT" archive --prefix=jaxpm/ HEAD:jaxpm | tar -x -C .carry/JaxPM
echo "JaxPM $(git --git-dir="$JAXPM_GIT" rev-parse --short HEAD) in .carry/JaxPM; wheels:"
ls -l .whl
