# Shared definitions for the Jean Zay (IDRIS) scripts; sourced, not run.
#
# The one place that knows the partitions: GPUs per node, CPUs per task, constraint, account
# suffix, QoS names, modules.  Edit here when IDRIS changes them (check `idr_compuse`,
# `sinfo -s`, `module avail` and http://www.idris.fr/eng/jean-zay/ ).
# shellcheck shell=bash

# pencilfft_arch ARCH: set the partition variables for v100 | a100 | h100.
#   GPUS_PER_NODE  GPUs in one node = tasks per node (one task per GPU)
#   CPUS_PER_TASK  the node's cores / GPUs: Slurm on Jean Zay gives memory in proportion
#   CONSTRAINT     -C value that selects the partition (V100 gpu_p13 is the default partition)
#   ACCOUNT_SUFFIX the hours a job is charged to: <project>@<suffix>
#   QOS_PREFIX     QoS family: <prefix>-dev (2 h), -t3 (20 h, default), -t4 (100 h)
#   ARCH_MODULE    module to load before any other on that partition ("" for V100)
pencilfft_arch() {
  case "${1:-}" in
    v100)
      GPUS_PER_NODE=4 CPUS_PER_TASK=10 CONSTRAINT=v100-32g ACCOUNT_SUFFIX=v100
      QOS_PREFIX=qos_gpu ARCH_MODULE="" ;;
    a100)
      GPUS_PER_NODE=8 CPUS_PER_TASK=8 CONSTRAINT=a100 ACCOUNT_SUFFIX=a100
      QOS_PREFIX=qos_gpu_a100 ARCH_MODULE=arch/a100 ;;
    h100)
      GPUS_PER_NODE=4 CPUS_PER_TASK=24 CONSTRAINT=h100 ACCOUNT_SUFFIX=h100
      QOS_PREFIX=qos_gpu_h100 ARCH_MODULE=arch/h100 ;;
    *)
      echo "error: unknown architecture '${1:-}' (expected v100, a100 or h100)" >&2
      return 2 ;;
  esac
}

# pencilfft_usage: the running script's header comment (its lines 2 up to `set -euo`).
pencilfft_usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

# pencilfft_arch_arg ARG: the first argument of submit.sh and sweep.sh.  None, -h or --help:
# the usage, and the script ends (status 0); an unknown architecture ends it with status 2;
# otherwise the partition variables are set.
pencilfft_arch_arg() {
  if [[ -z ${1:-} || $1 == -h || $1 == --help ]]; then pencilfft_usage; exit 0; fi
  pencilfft_arch "$1" || exit
}

# Modules loaded after `module purge` (and the arch/ module).  The versions on Jean Zay change:
# override with PENCILFFT_GPU_MODULES="cuda/12.x nccl/... openmpi/...-cuda python/3.x" after
# checking `module avail cuda nccl openmpi python` (take the CUDA-aware "-cuda" openmpi).
# PENCILFFT_MODULES is the older name of PENCILFFT_GPU_MODULES (the GPU scripts only).
PENCILFFT_DEFAULT_MODULES="cuda nccl openmpi python"
# The CPU job (cpu.slurm): a python, an MPI and FFTW (for mpi4py-fft), no CUDA; override with
# PENCILFFT_CPU_MODULES after `module avail python openmpi fftw`.
PENCILFFT_DEFAULT_CPU_MODULES="python openmpi fftw"

# pencilfft_qos ARCH QOS: the QoS name; QOS is dev | t3 | t4 or a full qos_... name.
pencilfft_qos() {
  pencilfft_arch "$1" || return
  case "$2" in
    qos_*) echo "$2" ;;
    dev | t3 | t4) echo "${QOS_PREFIX}-$2" ;;
    *) echo "error: QoS '$2': expected dev, t3, t4 or a full qos_... name" >&2; return 2 ;;
  esac
}

# pencilfft_account ARCH: <project>@<suffix> from PENCILFFT_ACCOUNT (a value with '@' is kept).
pencilfft_account() {
  pencilfft_arch "$1" || return
  local acc=${PENCILFFT_ACCOUNT:-}
  if [[ -z $acc ]]; then
    if [[ ${DRY_RUN:-0} == 1 ]]; then
      acc=PROJECT  # placeholder so that --dry-run works without an account
    else
      echo "error: set PENCILFFT_ACCOUNT to your project (e.g. export PENCILFFT_ACCOUNT=abc; see idr_compuse)" >&2
      return 2
    fi
  fi
  [[ $acc == *@* ]] && echo "$acc" || echo "${acc}@${ACCOUNT_SUFFIX}"
}

# square_pdims N: the most square PxQ with P*Q = N and P <= Q (as benchmarks.harness.square_pdims).
square_pdims() {
  local n=$1 p
  p=$(awk -v n="$n" 'BEGIN { printf "%d", sqrt(n) + 1e-9 }')
  while (( n % p )); do p=$((p - 1)); done
  echo "${p}x$((n / p))"
}

# gpus_to_nodes ARCH N: set NODES and TASKS_PER_NODE for N GPUs, one task per GPU.  Fewer GPUs
# than a node: one partial node; more: whole nodes only.
gpus_to_nodes() {
  pencilfft_arch "$1" || return
  local n=$2
  if (( n < 1 )); then
    echo "error: need at least one GPU, got $n" >&2; return 2
  elif (( n <= GPUS_PER_NODE )); then
    NODES=1 TASKS_PER_NODE=$n
  elif (( n % GPUS_PER_NODE == 0 )); then
    NODES=$((n / GPUS_PER_NODE)) TASKS_PER_NODE=$GPUS_PER_NODE
  else
    echo "error: $n GPUs is not a whole number of $1 nodes ($GPUS_PER_NODE GPUs each)" >&2; return 2
  fi
}

# weak_shape BASE N: a grid of N * BASE^3 points for N = 2^k GPUs, doubling X, Y, Z in turn,
# so that the points per GPU stay BASE^3.
weak_shape() {
  local base=$1 n=$2 i=0
  local -a d=("$base" "$base" "$base")
  if (( n < 1 || (n & (n - 1)) != 0 )); then
    echo "error: weak scaling needs a power-of-two GPU count, got $n" >&2; return 2
  fi
  while (( n > 1 )); do d[i % 3]=$((d[i % 3] * 2)); n=$((n / 2)); i=$((i + 1)); done
  echo "${d[0]}x${d[1]}x${d[2]}"
}

# quote_cmd ARGS...: the command as one shell-quoted line (what --dry-run prints).
quote_cmd() {
  local out="" a
  for a in "$@"; do out+="$(printf '%q' "$a") "; done
  echo "${out% }"
}

# pencilfft_load_env ARCH: modules and python environment inside a GPU job.
#   PENCILFFT_GPU_MODULES  modules to load (else PENCILFFT_MODULES, else
#                          PENCILFFT_DEFAULT_MODULES); "none": no module calls at all
#   PENCILFFT_VENV         a virtualenv to activate afterwards (pip install -e ".[bench]" and mpi4py built against the site MPI; slurm/README.md)
# With DRY_RUN=1 the commands are printed instead.
pencilfft_load_env() {
  pencilfft_arch "$1" || return
  # shellcheck disable=SC2086  # word splitting of the module list is intended
  pencilfft_load_modules "$ARCH_MODULE" \
    ${PENCILFFT_GPU_MODULES:-${PENCILFFT_MODULES:-$PENCILFFT_DEFAULT_MODULES}}
}

# pencilfft_load_cpu_env: modules and python environment inside the CPU job (cpu.slurm).
#   PENCILFFT_CPU_MODULES  modules to load (default PENCILFFT_DEFAULT_CPU_MODULES); "none": no
#                          module calls.  Not PENCILFFT_MODULES, which holds the GPU modules
#                          (CUDA, no FFTW), except PENCILFFT_MODULES=none, which means none here too.
#   PENCILFFT_VENV         as for the GPU jobs.
pencilfft_load_cpu_env() {
  local modules=${PENCILFFT_CPU_MODULES:-}
  if [[ -z $modules && ${PENCILFFT_MODULES:-} == none ]]; then modules=none; fi
  if [[ -z $modules && -n ${PENCILFFT_MODULES:-} ]]; then
    echo "# PENCILFFT_MODULES is for the GPU scripts: this CPU job loads PENCILFFT_CPU_MODULES (default: $PENCILFFT_DEFAULT_CPU_MODULES)"
  fi
  # shellcheck disable=SC2086  # word splitting of the module list is intended
  pencilfft_load_modules "" ${modules:-$PENCILFFT_DEFAULT_CPU_MODULES}
}

# pencilfft_load_modules ARCH_MODULE MODULE...: `module purge`, ARCH_MODULE first if not
# empty, then the modules, then PENCILFFT_VENV if set (printed instead when DRY_RUN=1).
# The module list `none`, or a machine without the `module` command (no Lmod or Environment
# Modules: a container, a laptop, a cluster without them), skips every module call and says
# so once; the virtualenv is still activated.
pencilfft_load_modules() {
  local arch_module=$1
  shift
  if [[ "$*" == none ]]; then
    echo "# modules: none (the module list is 'none'): module purge/load skipped"
  elif [[ ${DRY_RUN:-0} != 1 ]] && ! type -t module > /dev/null; then
    echo "# modules: no \`module\` command on $(hostname -s): module purge/load skipped (set the module list to none to say so)"
  else
    run_or_print module purge
    # IDRIS: on gpu_p5/gpu_p6 the arch/ module must come first, it selects the matching software stack.
    if [[ -n $arch_module ]]; then run_or_print module load "$arch_module"; fi
    run_or_print module load "$@"
  fi
  if [[ -n ${PENCILFFT_VENV:-} ]]; then
    if [[ ${DRY_RUN:-0} == 1 ]]; then echo "source $PENCILFFT_VENV/bin/activate"
    else
      # shellcheck disable=SC1091
      source "$PENCILFFT_VENV/bin/activate"
    fi
  fi
}

# pencilfft_srun_opts: fill the array SRUN_OPTS with the options of every srun of the jobs:
# --kill-on-bad-exit=1 (a task that fails ends the step, as MPI_Abort would) and srun's MPI
# plug-in, which decides whether MPI spans the tasks (without one each task is its own
# one-rank MPI world):
#   PENCILFFT_SRUN_MPI  --mpi=VALUE; "default": no --mpi, the cluster's MpiDefault.  Default:
#                       SLURM_MPI_TYPE if set (a site's MPI module may set it), else pmi2,
#                       which the mpich of pencilfft[mpi] and Intel MPI speak (Open MPI built
#                       with PMIx: pmix; `srun --mpi=list` shows what the cluster has).
pencilfft_srun_opts() {
  local mpi=${PENCILFFT_SRUN_MPI:-${SLURM_MPI_TYPE:-pmi2}}
  SRUN_OPTS=(--kill-on-bad-exit=1)
  if [[ $mpi != default ]]; then SRUN_OPTS+=(--mpi="$mpi"); fi
}

# pencilfft_job_arch: the architecture a GPU job runs on: PENCILFFT_ARCH, else read off the
# job's constraint (v100 when there is none: gpu_p13 is the default partition).
pencilfft_job_arch() {
  if [[ -n ${PENCILFFT_ARCH:-} ]]; then echo "$PENCILFFT_ARCH"; return; fi
  case "${SLURM_JOB_CONSTRAINTS:-}" in
    *h100*) echo h100 ;;
    *a100*) echo a100 ;;
    *) echo v100 ;;
  esac
}

# pencilfft_check_pdims NTASKS ARG...: one GPU per task, so every mesh after --pdims in the
# harness arguments must use exactly NTASKS GPUs; a warning on stderr for each that does not.
pencilfft_check_pdims() {
  local ntasks=$1 take=0 a prod
  shift
  for a in "$@"; do
    if [[ $a == --pdims ]]; then take=1; continue; fi
    if [[ $a == --* ]]; then take=0; continue; fi
    if (( take )) && [[ $a != auto ]]; then
      prod=$(( ${a//x/*} ))
      if (( prod != ntasks )); then
        echo "warning: pdims $a uses $prod GPUs but the job has $ntasks tasks (one per GPU)" >&2
      fi
    fi
  done
}

# has_arg OPTION ARG...: whether OPTION is one of the ARGs (a harness argument given already).
has_arg() {
  local want=$1 a
  shift
  for a in "$@"; do [[ $a == "$want" ]] && return 0; done
  return 1
}

# run_or_print CMD...: run it, or print it when DRY_RUN=1.
run_or_print() {
  if [[ ${DRY_RUN:-0} == 1 ]]; then quote_cmd "$@"; else "$@"; fi
}

# pencilfft_sbatch_opts ARCH GPUS QOS TIME: fill the array SBATCH_OPTS with the partition,
# account, QoS and one-task-per-GPU options of a job on GPUS GPUs.
pencilfft_sbatch_opts() {
  local arch=$1 gpus=$2 qos_short=$3 time=$4 account qos
  gpus_to_nodes "$arch" "$gpus" || return
  account=$(pencilfft_account "$arch") || return
  qos=$(pencilfft_qos "$arch" "$qos_short") || return
  SBATCH_OPTS=(--account="$account" --qos="$qos" -C "$CONSTRAINT"
    --nodes="$NODES" --ntasks-per-node="$TASKS_PER_NODE" --gres=gpu:"$TASKS_PER_NODE"
    --cpus-per-task="$CPUS_PER_TASK" --hint=nomultithread --time="$time")
}
