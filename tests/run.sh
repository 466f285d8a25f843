#!/usr/bin/env bash
# The whole test suite: once in one process with 8 simulated CPU devices, then under
# mpirun -np 2 (4 devices per process) and -np 4 (2 per process): 8 devices in every run; then,
# where CI is set or PENCILFFT_TEST_SLURM=1 asks for it, the slurm/ scripts on a real one-node
# Slurm started on this machine (tests/slurm/run.sh); then, where CI is set or
# PENCILFFT_TEST_MULTINODE=1 asks, the same across 4 nodes made of namespaces on this machine
# (tests/multinode/run.sh).
# Every test runs in the single-process step; under mpirun only those marked `mpirun`, what can
# differ when a mesh spans processes, and under -np 4 only those of them that a 2-D grid of
# processes changes (tests/conftest.py, PROCESS_GRID_FILES, says what and why).
#
#   bash tests/run.sh                 everything (how long: the README's Quickstart)
#   bash tests/run.sh --quick         the quick subset (tests/conftest.py, QUICK_FILES): one
#                                     process and mpirun -np 2, a few minutes
#   bash tests/run.sh -k io           extra arguments go to pytest (no Slurm step)
#
# Time-outs.  Every test has one (PENCILFFT_TEST_TIMEOUT, default 300 s,
# tests/mp/pencilfft_mpi_plugin.py): in one process a test that runs past it fails alone, named,
# and the step goes on; under mpirun the stuck rank prints its stacks and ends, which ends the
# run.  Every step has one too (PENCILFFT_STEP_TIMEOUT sets them all): at its limit the step is
# sent SIGINT, so that pytest prints its summary of the tests run so far, and is killed 60 s
# later if it is still there.
# Each step ends with pytest's summary line, and the script with a table of the steps (name,
# seconds, status, summary).  Under mpirun rank 0 prints the usual pytest report; the other
# ranks write theirs to a log that is printed when that rank failed.  Any failing rank fails
# the run.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
MPIRUN=${MPIRUN:-$BIN/mpirun}
# Without the test extras (a venv of `pip install -e ".[cli]"`, say), stop here with the one line
# that says what to install, before any step: not pytest's and timeout's errors step by step.
INSTALL='pip install -e ".[mpi,fftw,test]"'  # the README's test command (tests/test_readme.py)
# (Both asked of the python, so that a stand-in python, tests/test_reliability.py's, stands in
# for both.)
MISSING=
"$PY" -c "import pytest" 2>/dev/null || MISSING="pytest"
"$PY" -c "import shutil, sys; sys.exit(shutil.which(sys.argv[1]) is None)" "$MPIRUN" 2>/dev/null \
  || MISSING="${MISSING:+$MISSING and }mpirun ($MPIRUN)"
if [ -n "$MISSING" ]; then
  echo "tests/run.sh: $MISSING not found for $("$PY" -c 'import sys; print(sys.executable)' 2>/dev/null || echo "$PY"); install the test dependencies first: $INSTALL"
  exit 2
fi
export PYTHONPATH="$PWD/tests/mp${PYTHONPATH:+:$PYTHONPATH}"
QUICK=${PENCILFFT_TEST_QUICK:-0}
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
export PENCILFFT_TEST_QUICK=$QUICK  # tests/conftest.py keeps only QUICK_FILES when it is 1
# -p no:cacheprovider: ranks must not race on .pytest_cache, nor reorder tests from it.
PYTEST=("$PY" -m pytest -q -p pencilfft_mpi_plugin -p no:cacheprovider)
# Each step's limit: 1800 s for the step in one process, 900 s for each mpirun step, 1200 s
# for Slurm (PENCILFFT_STEP_TIMEOUT sets all of them), so that stuck steps still end within
# CI's 90 minutes.  Measured on an idle 2-core VM (2026-11-28), in a fresh clone: 529 s in
# one process, 122 s under -np 2, 130 s under -np 4, 29 s for Slurm (the README says the
# whole).  -np 4 runs only what a 2-D grid of processes changes
# (tests/conftest.py, PROCESS_GRID_FILES).  The Slurm step's 1200 s cover a slow apt-get (its
# own time-outs: 300 s each).
SINGLE_TIMEOUT=${PENCILFFT_STEP_TIMEOUT:-1800}
MPIRUN_TIMEOUT=${PENCILFFT_STEP_TIMEOUT:-900}
SLURM_TIMEOUT=${PENCILFFT_STEP_TIMEOUT:-1200}
GRACE=60  # seconds between a step's SIGINT and its SIGKILL
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
status=0
TABLE=()  # one row per step: name|seconds|status|summary

# Stopped (Ctrl-C, kill, a cancelled CI job), stop the running step too: bash runs a trap only
# once its foreground command is done, so each step runs in the background and is waited for
# (`wait` returns at once on a trapped signal).  The step's timeout(1) passes our TERM on to
# its processes (mpirun, the ranks: pencilfft.initialize() makes them end on it) and kills them
# 60 s later if they are still there.
child=
stop() {  # stop EXIT_STATUS
  trap - INT TERM HUP
  echo "== tests/run.sh stopped: stopping the running step"
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM
trap 'stop 129' HUP

summary_of() {  # summary_of FILE: pytest's last summary line in FILE ("3 passed in 1.2s"), or
  # the Slurm step's own word where it ran no pytest ("skipped: not root ...")
  local line
  line=$(sed 's/\x1b\[[0-9;]*m//g' "$1" 2>/dev/null \
    | grep -E '(passed|failed|errors?|skipped|deselected|xfailed|xpassed|no tests ran).* in [0-9.]+s' \
    | tail -n 1 | sed 's/^=* *//; s/ *=*$//')
  if [ -z "$line" ]; then
    line=$(grep -E '^== (slurm|multinode): (skipped|cannot run):' "$1" 2>/dev/null | tail -n 1 \
      | sed -E 's/^== (slurm|multinode): //')
  fi
  echo "$line"
}

record() {  # record NAME SECONDS STATUS SUMMARY: a row of the final table
  TABLE+=("$1|$2|$3|$4")
}

step() {  # step NAME TIMEOUT CMD...: run a step with its limit, in the background, wait for
  # it, and say how long it took and what pytest said
  local name=$1 limit=$2 start=$SECONDS rc=0 out tee_fd tee_pid
  shift 2
  out="$LOGS/step.out"
  # The step's output goes to the terminal and, through tee, to a file its summary is read from.
  exec {tee_fd}> >(tee "$out")
  tee_pid=$!
  timeout -s INT -k "$GRACE" "$limit" "$@" >&"$tee_fd" 2>&1 &
  child=$!
  exec {tee_fd}>&-
  wait "$child" || rc=$?
  child=
  for _ in $(seq 100); do kill -0 "$tee_pid" 2>/dev/null || break; sleep 0.05; done
  STEP_SECONDS=$((SECONDS - start))
  STEP_SUMMARY=$(summary_of "$out")
  case $rc in
    0) STEP_STATUS=passed; case $STEP_SUMMARY in skipped:*) STEP_STATUS=skipped ;; esac ;;
    124 | 137) STEP_STATUS="timed out"
       STEP_SUMMARY=${STEP_SUMMARY:-"none: stopped at its limit (under mpirun the ranks end on SIGINT)"}
       echo "== $name: timed out after its $limit s (PENCILFFT_STEP_TIMEOUT): stopped with" \
            "SIGINT; pytest's summary above lists what ran" ;;
    *) STEP_STATUS=failed ;;
  esac
  echo "== $name: $STEP_SECONDS s (exit status $rc): ${STEP_SUMMARY:-no pytest summary}"
  return "$rc"
}

# The single-process step runs its test files on PENCILFFT_TEST_WORKERS pytest processes at once
# (pytest-xdist, default 2: most of a test's time is XLA compiling on one core, so a second
# worker uses the second core); whole files go to one worker, so that the functions a file
# compiles once are shared by its tests.  0 runs them in this process.
WORKERS=${PENCILFFT_TEST_WORKERS:-2}
XDIST=()
if [ "$WORKERS" != 0 ] && "$PY" -c "import xdist" 2>/dev/null; then
  XDIST=(-n "$WORKERS" --dist loadfile)
fi
WHAT="the whole suite"
if [ $# -gt 0 ]; then WHAT="what the pytest arguments select: $*"; fi
if [ "$QUICK" = 1 ]; then WHAT="the quick subset (tests/conftest.py, QUICK_FILES)${*:+, of: $*}"; fi

echo "== single process, 8 devices${XDIST:+ (${WORKERS} pytest workers)}: $WHAT"
PENCILFFT_TEST_DEVICES=8 step "single process" "$SINGLE_TIMEOUT" "${PYTEST[@]}" "${XDIST[@]}" "$@" \
  || status=1
record "single process" "$STEP_SECONDS" "$STEP_STATUS" "$STEP_SUMMARY"

for np in 2 4; do
  if [ "$QUICK" = 1 ] && [ "$np" = 4 ]; then
    echo "== mpirun -np 4: left out (--quick)"
    record "mpirun -np 4" - skipped "--quick"
    continue
  fi
  echo "== mpirun -np $np, $((8 / np)) devices per process"
  rm -f "$LOGS"/rank*
  rc=0
  PENCILFFT_LOG_DIR=$LOGS PENCILFFT_TEST_DEVICES=$((8 / np)) \
    step "mpirun -np $np" "$MPIRUN_TIMEOUT" "$MPIRUN" -np "$np" "${PYTEST[@]}" "$@" || rc=$?
  # pytest's 5: every selected test deselected, none of them marked `mpirun` (e.g.
  # `bash tests/run.sh tests/test_readme.py`): nothing of this step to run, not a failure.
  if [ "$rc" = 5 ]; then rc=0; STEP_STATUS="nothing to run"; fi
  for ((r = 1; r < np; r++)); do
    rank_rc=$(cat "$LOGS/rank$r.rc" 2>/dev/null || echo "none (killed)")
    if [ "$rank_rc" != 0 ] && [ "$rank_rc" != 5 ]; then
      echo "== rank $r of mpirun -np $np failed (pytest exit status: $rank_rc); its output:"
      tail -n 300 "$LOGS/rank$r.log" 2>/dev/null || echo "(no log)"
      if [ "$rc" = 0 ]; then rc=1; STEP_STATUS="failed (rank $r)"; fi
    fi
  done
  if [ "$rc" != 0 ]; then status=1; fi
  record "mpirun -np $np" "$STEP_SECONDS" "$STEP_STATUS" "$STEP_SUMMARY"
done

# A real Slurm: munged, slurmctld and slurmd started here (as root), and the slurm/ scripts
# submitted with sbatch as slurm/README.md tells a user (issue 48).  A user's workstation is
# not CI: the step runs where CI is set (.ci/run sets it) or PENCILFFT_TEST_SLURM=1 asks for
# it, and never with pytest arguments or --quick (a subset was asked for).  tests/slurm/run.sh
# says why when it cannot run, and installs Slurm with apt-get only where CI is set or
# PENCILFFT_TEST_SLURM=1.
SLURM_HOW="PENCILFFT_TEST_SLURM=1 bash tests/run.sh runs it, as root: it starts slurmctld, slurmd and munged, and apt-gets them where missing"
if [ $# -gt 0 ] || [ "$QUICK" = 1 ]; then
  echo "== slurm: left out (a subset was asked for; $SLURM_HOW)"
  record "slurm" - skipped "a subset was asked for"
elif [ -z "${CI:-}" ] && [ "${PENCILFFT_TEST_SLURM:-0}" != 1 ]; then
  echo "== slurm: skipped (CI is not set; $SLURM_HOW)"
  record "slurm" - skipped "not CI: PENCILFFT_TEST_SLURM=1 runs it"
else
  echo "== slurm: a one-node Slurm on this machine (tests/slurm/run.sh)"
  step "slurm" "$SLURM_TIMEOUT" bash tests/slurm/run.sh || status=1
  record "slurm" "$STEP_SECONDS" "$STEP_STATUS" "$STEP_SUMMARY"
fi

# Several nodes (issue 65): a cluster of 4 namespace "nodes" on this machine, with a private
# Slurm and MPICH's hydra across them (tests/multinode/run.sh; root).  Gated as the Slurm step:
# where CI is set or PENCILFFT_TEST_MULTINODE=1 asks, never with a subset.
MULTINODE_TIMEOUT=${PENCILFFT_STEP_TIMEOUT:-900}
MULTINODE_HOW="PENCILFFT_TEST_MULTINODE=1 bash tests/run.sh runs it, as root: 4 network namespaces as nodes, a private Slurm on them"
if [ $# -gt 0 ] || [ "$QUICK" = 1 ]; then
  echo "== multinode: left out (a subset was asked for; $MULTINODE_HOW)"
  record "multinode" - skipped "a subset was asked for"
elif [ -z "${CI:-}" ] && [ "${PENCILFFT_TEST_MULTINODE:-0}" != 1 ]; then
  echo "== multinode: skipped (CI is not set; $MULTINODE_HOW)"
  record "multinode" - skipped "not CI: PENCILFFT_TEST_MULTINODE=1 runs it"
else
  echo "== multinode: 4 nodes on this machine (tests/multinode/run.sh)"
  step "multinode" "$MULTINODE_TIMEOUT" bash tests/multinode/run.sh || status=1
  record "multinode" "$STEP_SECONDS" "$STEP_STATUS" "$STEP_SUMMARY"
fi

echo
echo "== tests/run.sh: $SECONDS s in all ($WHAT)"
printf '%-16s %8s  %-18s %s\n' step seconds status "pytest's summary"
for row in "${TABLE[@]}"; do
  IFS='|' read -r name secs st summ <<< "$row"
  printf '%-16s %8s  %-18s %s\n' "$name" "$secs" "$st" "${summ:--}"
done
exit $status
