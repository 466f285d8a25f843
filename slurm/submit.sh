#!/bin/bash
# Submit one pencilfft benchmark job on Jean Zay: one task per GPU, partition options filled in.
#
#   slurm/submit.sh ARCH [options] [-- HARNESS ARGS]
#
#   ARCH              v100 (gpu_p13, 4 GPUs/node) | a100 (gpu_p5, 8/node) | h100 (gpu_p6, 4/node)
#   --gpus N          total GPUs (default: one node); below a node: a partial node
#   --nodes N         whole nodes instead of --gpus
#   --time HH:MM:SS   wall time (default 00:30:00)
#   --qos Q           dev | t3 | t4 | full name (default: $PENCILFFT_QOS, else t3)
#   --results DIR     where the JSON results go (default: results/jeanzay)
#   --job-name NAME   (default: pencilfft-ARCH-<N>gpu)
#   --dependency SPEC passed to sbatch, e.g. afterok:123
#   --dry-run         print the sbatch command, submit nothing
#   -- ARGS           arguments of `python -m benchmarks.fft` (default: --shapes 512); --pdims
#                     defaults to the most square PxQ of the GPU count, --out to
#                     DIR/ARCH-<N>gpu.jsonl
#
# Account: PENCILFFT_ACCOUNT=<project> (charged as <project>@ARCH; a value with '@' is used as is).
# Prints the job id (or, with --dry-run, the command).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=slurm/common.sh
source "$HERE/common.sh"

pencilfft_arch_arg "${1:-}"
ARCH=$1
shift

GPUS="" NODES_OPT="" TIME=00:30:00 QOS=${PENCILFFT_QOS:-t3} RESULTS=results/jeanzay
JOB_NAME="" DEPENDENCY="" DRY_RUN=0
while (( $# )); do
  case "$1" in
    --gpus) GPUS=$2; shift 2 ;;
    --nodes) NODES_OPT=$2; shift 2 ;;
    --time) TIME=$2; shift 2 ;;
    --qos) QOS=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --job-name) JOB_NAME=$2; shift 2 ;;
    --dependency) DEPENDENCY=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) pencilfft_usage; exit 0 ;;
    --) shift; break ;;
    *) echo "error: unknown option '$1' (harness arguments go after --)" >&2; exit 2 ;;
  esac
done
HARNESS=("$@")

if [[ -n $GPUS && -n $NODES_OPT ]]; then echo "error: give --gpus or --nodes, not both" >&2; exit 2; fi
[[ -n $NODES_OPT ]] && GPUS=$((NODES_OPT * GPUS_PER_NODE))
GPUS=${GPUS:-$GPUS_PER_NODE}

[[ $RESULTS == /* ]] && RESULTS_ABS=$RESULTS || RESULTS_ABS=$ROOT/$RESULTS
(( ${#HARNESS[@]} )) || HARNESS=(--shapes 512)
has_arg --pdims "${HARNESS[@]}" || HARNESS+=(--pdims "$(square_pdims "$GPUS")")
has_arg --out "${HARNESS[@]}" || HARNESS+=(--out "$RESULTS_ABS/$ARCH-${GPUS}gpu.jsonl")

pencilfft_sbatch_opts "$ARCH" "$GPUS" "$QOS" "$TIME"
JOB_NAME=${JOB_NAME:-pencilfft-$ARCH-${GPUS}gpu}
cmd=(sbatch --parsable "${SBATCH_OPTS[@]}" --job-name="$JOB_NAME"
  --output="$RESULTS_ABS/logs/%x-%j.out" --error="$RESULTS_ABS/logs/%x-%j.out"
  --chdir="$ROOT" --export=ALL,PENCILFFT_ARCH="$ARCH",PENCILFFT_ROOT="$ROOT")
[[ -n $DEPENDENCY ]] && cmd+=(--dependency="$DEPENDENCY")
cmd+=("$ROOT/slurm/bench.slurm" "${HARNESS[@]}")

if (( DRY_RUN )); then
  quote_cmd "${cmd[@]}"
else
  mkdir -p "$RESULTS_ABS/logs"  # Slurm does not create the log folder: a missing one loses the log
  "${cmd[@]}"
fi
