#!/usr/bin/env bash
# A real one-node Slurm on this machine, and the project's slurm/ scripts submitted to it with
# sbatch as slurm/README.md tells a user (issue 48): tests/slurm/jobs.py says what is checked.
#
#   bash tests/slurm/run.sh [PYTEST ARGS]    (as root; tests/run.sh runs it as its last step
#                                            where CI is set or PENCILFFT_TEST_SLURM=1)
#
# Where they are missing, it installs Debian's slurmctld, slurmd and munge with apt-get, but
# only where CI is set or PENCILFFT_TEST_SLURM=1 asks for this step (never unasked on a user's
# machine); it writes
# a private configuration under a temporary folder (nothing in /etc is changed: SLURM_CONF
# points there), and starts the daemons by hand, without systemd:
#   * munged on a private socket;
#   * slurmctld, with partitions named as on Jean Zay: cpu_p1 (the default; this machine, its
#     CPUs and memory as `slurmd -C` reports them), gpu_p13 (V100, -C v100-32g, 4 GPUs a
#     node), gpu_p5 (A100, -C a100, 8 GPUs) and gpu_p6 (H100, -C h100, 4 GPUs).  Each GPU
#     partition has one node that runs (a second slurmd on this machine, GPUs declared with
#     device files that are /dev/null, so that `sbatch --test-only` can place a job on it) and
#     nodes that stay down (so that multi-node jobs are accepted and wait).  As on Jean Zay, a
#     GPU job names no partition (job_submit/all_partitions tries each).  MpiDefault=none, as
#     on the cluster of the issue: the scripts must choose srun's MPI plug-in themselves;
#   * slurmd for this machine and for the three running GPU nodes.
# The daemons and every job are stopped when the script ends, however it ends (trap).
#
# Skipped, saying why, where it cannot run: not root, or Slurm missing and not to be installed
# (or no apt-get).  Where it was asked for (CI set, or PENCILFFT_TEST_SLURM=1) it must run:
# those cases fail instead.  Every wait has a time-out.  PENCILFFT_SLURM_KEEP=1 keeps the
# temporary folder (logs, configuration).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python}
START=$SECONDS

say() { echo "== slurm: $*"; }
cannot() {  # cannot REASON: skip, or fail where it was asked for
  if [ -n "${CI:-}" ]; then say "cannot run: $1 (CI is set: this step must run)"; exit 1; fi
  if [ "${PENCILFFT_TEST_SLURM:-0}" = 1 ]; then
    say "cannot run: $1 (PENCILFFT_TEST_SLURM=1 asked for it)"; exit 1
  fi
  say "skipped: $1"
  exit 0
}
INSTALL=0  # apt-get what is missing: in CI, or where PENCILFFT_TEST_SLURM=1 asks for this step
if [ -n "${CI:-}" ] || [ "${PENCILFFT_TEST_SLURM:-0}" = 1 ]; then INSTALL=1; fi

DAEMONS=(slurmctld slurmd munged sbatch srun scontrol sinfo squeue scancel)
missing=()
for d in "${DAEMONS[@]}"; do command -v "$d" > /dev/null || missing+=("$d"); done
if [ "$(id -u)" != 0 ]; then
  cannot "not root (slurmctld, slurmd and munged run as root here, and apt-get installs them)"
fi
if [ ${#missing[@]} -gt 0 ] && ! command -v apt-get > /dev/null; then
  cannot "${missing[*]} missing, and no apt-get to install Debian's slurmctld slurmd munge"
fi
if [ ${#missing[@]} -gt 0 ] && [ "$INSTALL" != 1 ]; then
  cannot "${missing[*]} missing (PENCILFFT_TEST_SLURM=1 installs Debian's slurmctld slurmd munge with apt-get, and runs this step)"
fi

W=$(mktemp -d /tmp/pencilfft-slurm.XXXXXX)
chmod 755 "$W"  # munged wants its socket's folder open to all; jobs read the configuration
PIDS=()  # the daemons started here, stopped in this order's reverse
POLICY_RC=""  # a policy-rc.d of ours, while apt-get installs

cleanup() {
  trap - EXIT INT TERM HUP
  if [ -n "$POLICY_RC" ]; then rm -f "$POLICY_RC"; fi
  if [ -f "$W/slurm.conf" ] && [ ${#PIDS[@]} -gt 0 ]; then
    # Every job first (their steps run under slurmstepd, which outlives slurmd), then the
    # daemons, newest first: TERM, and KILL what is left after 10 s.
    export SLURM_CONF=$W/slurm.conf
    timeout 10 scancel --full --quiet $(timeout 10 squeue -h -o %i 2>/dev/null) 2>/dev/null
    for _ in $(seq 40); do
      [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill -TERM "${PIDS[i]}" 2>/dev/null; done
  for _ in $(seq 20); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if [ "${PENCILFFT_SLURM_KEEP:-0}" = 1 ]; then say "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

fail() { say "FAILED: $*"; for f in "$W"/log/*; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }

# ------------------------------------------------------------------------------ install
if [ ${#missing[@]} -gt 0 ]; then
  say "installing slurmctld slurmd munge (missing: ${missing[*]})"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    # Debian's packages start their services on install unless this says no: we start our own.
    POLICY_RC=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$POLICY_RC" && chmod 755 "$POLICY_RC"
  fi
  install() {
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge > "$W/apt.log" 2>&1
  }
  install || { timeout 300 apt-get update -q > "$W/apt-update.log" 2>&1; install; } \
    || { tail -n 30 "$W/apt.log"; cannot "apt-get install slurmctld slurmd munge failed"; }
  if [ -n "$POLICY_RC" ]; then rm -f "$POLICY_RC"; POLICY_RC=""; fi
  say "installed in $((SECONDS - START)) s"
fi
VERSION=$(slurmd -V)
say "$VERSION"

# ------------------------------------------------------------------------ configuration
NODE=$(hostname -s)
# This machine as slurmd sees it: CPUs, sockets, cores, threads, memory.
HARDWARE=$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]* //; s/ UpTime=.*//')
[ -n "$HARDWARE" ] || fail "slurmd -C printed nothing"
read -r CTLD_PORT SLURMD_PORT V_PORT A_PORT H_PORT < <("$PY" - <<'EOF'
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
mkdir -p "$W"/{munge,state,spool,log,run,dev,user}
chmod 711 "$W/munge"  # munged: the socket reachable by all, the key (0400) private
dd if=/dev/urandom of="$W/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$W/munge/munge.key"
# The fake GPUs: device files that are /dev/null (a character device, as slurmd wants).
for i in 0 1 2 3 4 5 6 7; do
  mknod "$W/dev/nvidia$i" c 1 3 2>/dev/null || touch "$W/dev/nvidia$i"
done
LIVE="NodeAddr=127.0.0.1 State=UNKNOWN"
DOWN="NodeAddr=127.0.0.1 Port=9 State=DOWN"  # never registers: jobs on it wait
cat > "$W/slurm.conf" <<EOF
# Written by pencilfft's tests/slurm/run.sh.
ClusterName=pencilfft-test
# Job ids that an earlier run of this script did not use: MPICH under srun names its shared
# memory after the job step, and an aborted step leaves it in /dev/shm; a later step of the
# same number then fails in MPI_Init (UCX: "failed to unpack address").
FirstJobId=$((RANDOM * 1000 + RANDOM % 1000 + 1000))
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$W/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd-%n.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
JobSubmitPlugins=all_partitions
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
InactiveLimit=0
KillWait=5
MinJobAge=600
SlurmdTimeout=300
NodeName=$NODE NodeAddr=127.0.0.1 $HARDWARE State=UNKNOWN
NodeName=jzv001 Port=$V_PORT CPUs=40 SocketsPerBoard=2 CoresPerSocket=20 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 Feature=v100,v100-32g $LIVE
NodeName=jzv002 CPUs=40 SocketsPerBoard=2 CoresPerSocket=20 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 Feature=v100,v100-32g $DOWN
NodeName=jza001 Port=$A_PORT CPUs=64 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:8 Feature=a100 $LIVE
NodeName=jza[002-032] CPUs=64 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:8 Feature=a100 $DOWN
NodeName=jzh001 Port=$H_PORT CPUs=96 SocketsPerBoard=2 CoresPerSocket=48 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 Feature=h100 $LIVE
NodeName=jzh002 CPUs=96 SocketsPerBoard=2 CoresPerSocket=48 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 Feature=h100 $DOWN
PartitionName=cpu_p1 Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu_p13 Nodes=jzv[001-002] MaxTime=INFINITE State=UP
PartitionName=gpu_p5 Nodes=jza[001-032] MaxTime=INFINITE State=UP
PartitionName=gpu_p6 Nodes=jzh[001-002] MaxTime=INFINITE State=UP
EOF
cat > "$W/gres.conf" <<EOF
NodeName=jzv001 Name=gpu File=$W/dev/nvidia[0-3]
NodeName=jza001 Name=gpu File=$W/dev/nvidia[0-7]
NodeName=jzh001 Name=gpu File=$W/dev/nvidia[0-3]
EOF
export SLURM_CONF=$W/slurm.conf

# ------------------------------------------------------------------------------ daemons
munged -F --force --socket="$W/munge/munge.socket" --key-file="$W/munge/munge.key" \
  --pid-file="$W/run/munged.pid" --seed-file="$W/munge/seed" --log-file="$W/log/munged.log" \
  > "$W/log/munged.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do [ -S "$W/munge/munge.socket" ] && break; sleep 0.2; done
[ -S "$W/munge/munge.socket" ] || fail "munged did not start"
slurmctld -D -f "$SLURM_CONF" > "$W/log/slurmctld.out" 2>&1 &
PIDS+=($!)
for node in "$NODE" jzv001 jza001 jzh001; do
  slurmd -D -f "$SLURM_CONF" -N "$node" > "$W/log/slurmd-$node.out" 2>&1 &
  PIDS+=($!)
done
ready=0
for _ in $(seq 120); do  # 60 s
  states=$(timeout 5 sinfo -h -N -n "$NODE,jzv001,jza001,jzh001" -o %T 2>/dev/null | sort -u | tr '\n' ' ')
  if [ "$states" = "idle " ]; then ready=1; break; fi
  sleep 0.5
done
[ "$ready" = 1 ] || fail "the nodes are not idle after 60 s (sinfo: ${states:-nothing})"
say "cluster up in $((SECONDS - START)) s: $(sinfo -h -o '%P %D %T' | tr '\n' ';')"

# ------------------------------------------------------------------------------- checks
# The user's folder, outside the checkout; the jobs' environment is this one (sbatch
# exports it), less what a cluster would not have.
# In the background and waited for: bash runs the traps (the clean-up) only between commands.
rc=0
PENCILFFT_SLURM_DIR=$W PENCILFFT_SLURM_USER_DIR=$W/user PENCILFFT_SLURM_VERSION="$VERSION" \
  timeout -k 30 600 "$PY" -m pytest -q -p no:cacheprovider --noconftest tests/slurm/jobs.py "$@" &
wait $! || rc=$?
if [ -f "$W/timings.txt" ]; then sed 's/^/== slurm: /' "$W/timings.txt"; fi
say "done in $((SECONDS - START)) s (exit status $rc)"
[ "$rc" = 0 ] || fail "tests/slurm/jobs.py (exit status $rc)"
