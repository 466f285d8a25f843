#!/usr/bin/env bash
# pencilfft across nodes (issue 65): a cluster of 4 nodes on this one machine
# (tests/multinode/cluster.sh: network + hostname namespaces on a private bridge, a private
# Slurm), and the checks of tests/multinode/checks.py run on it: srun across 2 and 4 nodes,
# MPICH's hydra across 2, a plan that differs between nodes, a task that fails on node2, and
# slurm/cpu.slurm and slurm/pm.slurm with --nodes=2.
#
#   bash tests/multinode/run.sh [PYTEST ARGS]   (as root; tests/run.sh runs it as its last step
#                                               where CI is set or PENCILFFT_TEST_MULTINODE=1)
#
# Where they are missing, it installs Debian's slurmctld, slurmd and munge with apt-get, but
# only where CI is set or PENCILFFT_TEST_MULTINODE=1 asks for this step.  Skipped, saying why,
# where it cannot run (not root, no namespaces, no Slurm and none to install); where it was
# asked for, those cases fail instead.  Everything it makes (namespaces, bridge, veths, tc
# rules, daemons, their files) is removed when it ends, however it ends: a trap on EXIT, INT,
# TERM and HUP, and the checks run in the background so that the trap runs at once.
# PENCILFFT_MULTINODE_KEEP=1 keeps the cluster's folder (logs, configuration).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
START=$SECONDS
NODES=4

say() { echo "== multinode: $*"; }
cannot() {  # cannot REASON: skip, or fail where it was asked for
  if [ -n "${CI:-}" ]; then say "cannot run: $1 (CI is set: this step must run)"; exit 1; fi
  if [ "${PENCILFFT_TEST_MULTINODE:-0}" = 1 ]; then
    say "cannot run: $1 (PENCILFFT_TEST_MULTINODE=1 asked for it)"; exit 1
  fi
  say "skipped: $1"
  exit 0
}
INSTALL=0
if [ -n "${CI:-}" ] || [ "${PENCILFFT_TEST_MULTINODE:-0}" = 1 ]; then INSTALL=1; fi

if [ "$(id -u)" != 0 ]; then
  cannot "not root (network namespaces, a bridge and Slurm's daemons need root)"
fi
for tool in ip unshare nsenter taskset tc; do
  command -v "$tool" > /dev/null || cannot "$tool missing (iproute2, util-linux)"
done
missing=()
for d in slurmctld slurmd munged srun sbatch scontrol sinfo scancel; do
  command -v "$d" > /dev/null || missing+=("$d")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get > /dev/null || cannot "${missing[*]} missing, and no apt-get to install Debian's slurmctld slurmd munge"
  [ "$INSTALL" = 1 ] || cannot "${missing[*]} missing (PENCILFFT_TEST_MULTINODE=1 installs Debian's slurmctld slurmd munge with apt-get, and runs this step)"
  say "installing slurmctld slurmd munge (missing: ${missing[*]})"
  POLICY_RC=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then  # Debian's packages would start their services
    POLICY_RC=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$POLICY_RC" && chmod 755 "$POLICY_RC"
  fi
  apt_install() {
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge > /tmp/pencilfft-multinode-apt.log 2>&1
  }
  apt_install || { timeout 300 apt-get update -q > /dev/null 2>&1; apt_install; }
  rc=$?
  [ -n "$POLICY_RC" ] && rm -f "$POLICY_RC"
  [ "$rc" = 0 ] || { tail -n 30 /tmp/pencilfft-multinode-apt.log; cannot "apt-get install slurmctld slurmd munge failed"; }
fi
if ! ip netns add "pfcheck$$" 2> /dev/null; then cannot "cannot make a network namespace here"; fi
ip netns delete "pfcheck$$"

# shellcheck source=tests/multinode/cluster.sh
source tests/multinode/cluster.sh
W=
child=
finish() {
  trap - EXIT INT TERM HUP
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  cluster_down
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

fail() { say "FAILED: $*"; for f in "$W"/log/*; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }

say "$(slurmd -V); $NODES nodes on $(nproc) cores"
cluster_up "$NODES" || fail "the cluster did not come up"
say "cluster up in $((SECONDS - START)) s: $MN_NODES on bridge ${MN_PREFIX}br"

rc=0
timeout -k 30 900 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/multinode/checks.py "$@" &
child=$!
wait "$child" || rc=$?
child=
if [ -f "$W/timings.txt" ]; then sed 's/^/== multinode: /' "$W/timings.txt"; fi
say "done in $((SECONDS - START)) s (exit status $rc)"
[ "$rc" = 0 ] || fail "tests/multinode/checks.py (exit status $rc)"
