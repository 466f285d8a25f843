# A cluster of N "nodes" on this one machine, for tests/multinode/run.sh and the network
# benchmark (benchmarks/overlap.py); sourced, not run.  As root.
#
# A node is a network namespace and a hostname (UTS) namespace: its own `eth0` with a private
# address on a veth to a private bridge (no address, no route: nothing leaves the machine), its
# own hostname (node1 .. nodeN), its own port space, and its share of the machine's cores (node
# i runs on core (i-1) mod C: two nodes never share a core where there are as many cores;
# PENCILFFT_MULTINODE_PIN=0: every node on every core).
# Every command entered into a node (`node_exec`, and $W/bin/node-exec, which MPICH's hydra
# calls as it would call ssh) also gets a private mount namespace in which a hosts file naming
# the nodes is bound over /etc/hosts: the machine's own file is never touched.  The file system
# is shared, as on a cluster with a shared home.
#
# A private Slurm runs on it: munged on a private socket and key (in the root namespace: a unix
# socket is reached from every network namespace), slurmctld on node1 and one slurmd in each
# node, each with its own configuration, state, spool, log and pid files under $W, started with
# explicit paths and stopped by their PIDs.  It shares nothing with a Slurm already running on
# the machine (the one-node test step's, or a site's): other ports in other namespaces, another
# socket, another configuration (SLURM_CONF).
#
# Everything made is named with one prefix, pf<TAG> (TAG: 4 hex digits, one per cluster), and
# recorded in $W/made: cluster_down removes exactly that, on every exit path (the caller traps
# EXIT, INT, TERM and HUP), including every process still inside a node's namespace.
#
#   cluster_up N        set up N nodes and Slurm on them; exports MN_DIR (= $W), SLURM_CONF,
#                       MN_NODES ("node1,...,nodeN"), MN_EXEC ($W/bin/node-exec)
#   cluster_down        stop and remove everything cluster_up made
#   node_exec NODE CMD  run CMD inside NODE (its namespaces, hosts file and cores)
#   mn_bytes            bytes received and sent on each node's link, one line per node:
#                       "nodeI RX TX" (read on the bridge side of its veth)
#   mn_limit RATE       limit every node's link, both ways, to RATE (tc's units: 1gbit, 500mbit;
#                       token bucket with a 1 MB burst); "none" removes the limits
#
# As a command (benchmarks/overlap.py drives it so):
#   bash tests/multinode/cluster.sh up N          prints MN_DIR=..., the cluster stays up
#   bash tests/multinode/cluster.sh limit DIR RATE
#   bash tests/multinode/cluster.sh down DIR
# shellcheck shell=bash

MN_SUBNET=10.213.0   # the nodes' addresses: 10.213.0.I/24, only inside the namespaces

_mn_say() { echo "== multinode: $*"; }

_mn_record() { echo "$*" >> "$W/made"; }  # what cluster_down removes, one thing a line

cluster_up() {  # cluster_up N
  local n=$1 i cores hw
  W=$(mktemp -d /tmp/pencilfft-multinode.XXXXXX)
  chmod 755 "$W"  # munged wants its socket's folder open to all; jobs read the configuration
  MN_TAG=$(printf '%04x' $(( (RANDOM << 1 ^ $$) & 0xffff )))
  MN_PREFIX=pf$MN_TAG
  MN_N=$n
  : > "$W/made"
  mkdir -p "$W"/{ns,bin,munge,state,spool,log,run,user}
  cores=$(nproc)
  # The hosts file the nodes see: their names, and localhost.
  { echo "127.0.0.1 localhost"
    for ((i = 1; i <= n; i++)); do echo "$MN_SUBNET.$i node$i"; done; } > "$W/hosts"
  # ------------------------------------------------------------------------ network
  ip link add "${MN_PREFIX}br" type bridge || return 1
  _mn_record link "${MN_PREFIX}br"
  ip link set "${MN_PREFIX}br" up
  for ((i = 1; i <= n; i++)); do
    local ns=${MN_PREFIX}n$i host=${MN_PREFIX}h$i
    ip netns add "$ns" || return 1
    _mn_record netns "$ns"
    ip link add "$host" type veth peer name "${MN_PREFIX}e$i" || return 1
    _mn_record link "$host"
    ip link set "${MN_PREFIX}e$i" netns "$ns"
    ip -n "$ns" link set "${MN_PREFIX}e$i" name eth0
    # No IPv6: nothing waits for its address checks, and no MPI picks a link-local address.
    ip netns exec "$ns" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" addr add "$MN_SUBNET.$i/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip link set "$host" master "${MN_PREFIX}br"
    ip link set "$host" up
    # The node's hostname: a UTS namespace kept by a bind mount of its file.
    touch "$W/ns/uts$i"
    unshare --uts="$W/ns/uts$i" hostname "node$i" || return 1
    _mn_record mount "$W/ns/uts$i"
    if [ "${PENCILFFT_MULTINODE_PIN:-1}" = 0 ]; then
      echo "0-$((cores - 1))" > "$W/ns/cpus$i"  # every node on every core
    else
      echo $(( (i - 1) % cores )) > "$W/ns/cpus$i"
    fi
  done
  _mn_write_exec
  printf 'MN_PREFIX=%s\nMN_N=%s\n' "$MN_PREFIX" "$MN_N" > "$W/env"
  MN_NODES=$(seq -s, -f 'node%g' 1 "$n")
  MN_EXEC=$W/bin/node-exec
  MN_DIR=$W
  export MN_DIR MN_NODES MN_EXEC MN_PREFIX MN_N
  # ------------------------------------------------------------------------ Slurm
  hw=$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]* //; s/ UpTime=.*//; s/CPUs=[0-9]* //; s/Boards=[0-9]* //; s/SocketsPerBoard=[0-9]* //; s/CoresPerSocket=[0-9]* //; s/ThreadsPerCore=[0-9]* //')
  chmod 711 "$W/munge"
  dd if=/dev/urandom of="$W/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$W/munge/munge.key"
  cat > "$W/slurm.conf" <<EOF
# Written by pencilfft's tests/multinode/cluster.sh.
ClusterName=pencilfft-multinode
FirstJobId=$((RANDOM * 1000 + RANDOM % 1000 + 1000))
SlurmctldHost=node1($MN_SUBNET.1)
SlurmctldPort=6817
SlurmdPort=6818
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
# No binding by Slurm: each node's processes already run on that node's core (node-exec).
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
InactiveLimit=0
KillWait=5
MinJobAge=600
SlurmdTimeout=300
NodeName=node[1-$n] CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 $hw State=UNKNOWN
PartitionName=cpu_p1 Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP
EOF
  # Each node's address for Slurm.
  sed -i "s/^NodeName=node\[1-$n\] /NodeName=DEFAULT /" "$W/slurm.conf"
  for ((i = 1; i <= n; i++)); do echo "NodeName=node$i NodeAddr=$MN_SUBNET.$i" >> "$W/slurm.conf"; done
  sed -i '/^PartitionName/{h;d};${G}' "$W/slurm.conf"  # the partition after the nodes
  export SLURM_CONF=$W/slurm.conf
  munged -F --force --socket="$W/munge/munge.socket" --key-file="$W/munge/munge.key" \
    --pid-file="$W/run/munged.pid" --seed-file="$W/munge/seed" --log-file="$W/log/munged.log" \
    > "$W/log/munged.out" 2>&1 &
  _mn_record pid $!
  for _ in $(seq 50); do [ -S "$W/munge/munge.socket" ] && break; sleep 0.2; done
  [ -S "$W/munge/munge.socket" ] || { _mn_say "munged did not start"; return 1; }
  node_exec node1 slurmctld -D -f "$SLURM_CONF" > "$W/log/slurmctld.out" 2>&1 &
  _mn_record pid $!
  for ((i = 1; i <= n; i++)); do
    node_exec "node$i" slurmd -D -f "$SLURM_CONF" -N "node$i" > "$W/log/slurmd-node$i.out" 2>&1 &
    _mn_record pid $!
  done
  local states=""
  for _ in $(seq 120); do  # 60 s
    states=$(node_exec node1 timeout 5 sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$states" = "idle " ] && break
    sleep 0.5
  done
  if [ "$states" != "idle " ]; then
    _mn_say "the nodes are not idle after 60 s (sinfo: ${states:-nothing})"
    return 1
  fi
}

_mn_write_exec() {  # $W/bin/node-exec: enter a node as ssh would (MPICH's hydra calls it)
  cat > "$W/bin/node-exec" <<EOF
#!/bin/bash
# node-exec [ssh options] NODE COMMAND...: run COMMAND in NODE of the cluster at $W, as
# \`ssh NODE COMMAND\` would (MPICH's hydra: mpiexec -launcher ssh -launcher-exec THIS).
# Its network and hostname namespaces, a private mount namespace with the nodes' hosts file
# over /etc/hosts, and the node's core.  The words of COMMAND are joined into one shell command
# line, as ssh joins them (quote what must stay one word); the environment is kept.
W=$W
while [ \$# -gt 0 ]; do
  case \$1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;   # ssh options with an argument
    -*) shift ;;
    *) break ;;
  esac
done
node=\${1:?node-exec: no node given}
shift
i=\${node#node}
ns=$MN_PREFIX"n\$i"
if [ ! -e "/run/netns/\$ns" ] || [ ! -e "\$W/ns/uts\$i" ]; then
  echo "node-exec: no node \$node in the cluster at \$W" >&2; exit 255
fi
[ \$# -gt 0 ] || { echo "node-exec: no command given (no login shells here)" >&2; exit 255; }
exec nsenter --net="/run/netns/\$ns" --uts="\$W/ns/uts\$i" -- \\
  unshare --mount --propagation private -- \\
  taskset -c "\$(cat "\$W/ns/cpus\$i")" \\
  bash -c 'mount --bind "\$0/hosts" /etc/hosts || exit 255; exec bash -c "\$1"' "\$W" "\$*"
EOF
  chmod 755 "$W/bin/node-exec"
}

node_exec() { "$W/bin/node-exec" "$@"; }

mn_bytes() {
  local i
  for ((i = 1; i <= MN_N; i++)); do
    echo "node$i $(cat "/sys/class/net/${MN_PREFIX}h$i/statistics/tx_bytes") $(cat "/sys/class/net/${MN_PREFIX}h$i/statistics/rx_bytes")"
  done  # the bridge side's tx is what the node received
}

mn_limit() {  # mn_limit RATE | none
  local i
  for ((i = 1; i <= MN_N; i++)); do
    if [ "$1" = none ]; then  # (none there already: nothing to remove)
      tc qdisc del dev "${MN_PREFIX}h$i" root 2>/dev/null || true
      ip netns exec "${MN_PREFIX}n$i" tc qdisc del dev eth0 root 2>/dev/null || true
    else
      tc qdisc replace dev "${MN_PREFIX}h$i" root tbf rate "$1" burst 1mb latency 50ms || return 1
      ip netns exec "${MN_PREFIX}n$i" tc qdisc replace dev eth0 root tbf rate "$1" burst 1mb latency 50ms || return 1
    fi
  done
}

cluster_down() {
  [ -n "${W:-}" ] && [ -f "$W/made" ] || return 0
  local kind what pids=() i
  if [ -f "$W/slurm.conf" ] && [ -x "$W/bin/node-exec" ]; then
    # Every job first (their steps run under slurmstepd, which outlives slurmd).
    node_exec node1 timeout 10 scancel --full --quiet --user=root 2>/dev/null
  fi
  while read -r kind what; do [ "$kind" = pid ] && pids+=("$what"); done < "$W/made"
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null; done
  for _ in $(seq 20); do
    local alive=0 p
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # Whatever still runs in a node (a job's task, slurmstepd, an mpiexec proxy): killed.
  while read -r kind what; do
    if [ "$kind" = netns ]; then
      # shellcheck disable=SC2046
      kill -KILL $(ip netns pids "$what" 2>/dev/null) 2>/dev/null
    fi
  done < "$W/made"
  sleep 0.2
  tac "$W/made" | while read -r kind what; do
    case $kind in
      netns) ip netns delete "$what" 2>/dev/null ;;
      link) ip link delete "$what" 2>/dev/null ;;
      mount) umount "$what" 2>/dev/null ;;
    esac
  done
  if [ "${PENCILFFT_MULTINODE_KEEP:-0}" = 1 ]; then _mn_say "kept $W"; else rm -rf "$W"; fi
  W=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run as a command, not sourced
  set -u
  _mn_at() {  # _mn_at DIR: the cluster made there
    W=$1
    [ -f "$W/env" ] || { echo "no cluster at $W" >&2; exit 2; }
    # shellcheck disable=SC1091
    source "$W/env"
  }
  case ${1:-} in
    up)
      cluster_up "${2:?up N}" || { cluster_down; exit 1; }
      echo "MN_DIR=$W"; echo "SLURM_CONF=$SLURM_CONF"; echo "MN_EXEC=$MN_EXEC"
      echo "MN_PREFIX=$MN_PREFIX"; echo "MN_NODES=$MN_NODES" ;;
    limit) _mn_at "${2:?limit DIR RATE}"; mn_limit "${3:?limit DIR RATE}" ;;
    down) _mn_at "${2:?down DIR}"; cluster_down ;;
    *) echo "usage: bash $0 up N | limit DIR RATE | down DIR" >&2; exit 2 ;;
  esac
fi
