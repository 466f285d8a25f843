#!/bin/bash
# Strong- and weak-scaling sweep of pencilfft on Jean Zay, then a plot job.
#
#   slurm/sweep.sh ARCH [options] [-- EXTRA HARNESS ARGS]
#
#   ARCH                v100 | a100 | h100
#   --strong-grid N     global grid N^3 of the strong-scaling series (default 1024)
#   --weak-base N       N^3 points per GPU in the weak-scaling series (default 512)
#   --min-gpus N        smallest GPU count (default 1); counts are powers of two
#   --max-gpus N        largest GPU count (default 256)
#   --no-strong | --no-weak   leave out a series
#   --results DIR       output folder (default results/sweep-ARCH-<date>): DIR/strong/n<N>.jsonl,
#                       DIR/weak/n<N>.jsonl, DIR/logs/, then DIR/plots/*.png and DIR/tables.md
#   --time HH:MM:SS     wall time per benchmark job (default 00:30:00)
#   --qos Q             dev | t3 | t4 | full name (default: $PENCILFFT_QOS, else t3); the plot
#                       job always uses dev
#   --dry-run           print the sbatch commands (with made-up job ids), submit nothing
#   -- ARGS             appended to every benchmark's arguments (default before them:
#                       --skip fftn-sharded, since it gathers the whole grid on every GPU)
#
# Each GPU count is one job (one task per GPU, pdims = the most square PxQ); every job appends
# JSON lines to its own file.  The plot job waits for all of them (afterany: a failed point
# still leaves the others plotted).  Account: PENCILFFT_ACCOUNT (see slurm/README.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
# shellcheck source=slurm/common.sh
source "$HERE/common.sh"

pencilfft_arch_arg "${1:-}"
ARCH=$1
shift

STRONG_GRID=1024 WEAK_BASE=512 MIN_GPUS=1 MAX_GPUS=256 DO_STRONG=1 DO_WEAK=1
RESULTS="" TIME=00:30:00 QOS=${PENCILFFT_QOS:-t3} DRY_RUN=0
while (( $# )); do
  case "$1" in
    --strong-grid) STRONG_GRID=$2; shift 2 ;;
    --weak-base) WEAK_BASE=$2; shift 2 ;;
    --min-gpus) MIN_GPUS=$2; shift 2 ;;
    --max-gpus) MAX_GPUS=$2; shift 2 ;;
    --no-strong) DO_STRONG=0; shift ;;
    --no-weak) DO_WEAK=0; shift ;;
    --results) RESULTS=$2; shift 2 ;;
    --time) TIME=$2; shift 2 ;;
    --qos) QOS=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) pencilfft_usage; exit 0 ;;
    --) shift; break ;;
    *) echo "error: unknown option '$1' (harness arguments go after --)" >&2; exit 2 ;;
  esac
done
EXTRA=(--skip fftn-sharded "$@")
RESULTS=${RESULTS:-results/sweep-$ARCH-$(date +%Y%m%d-%H%M%S)}
[[ $RESULTS == /* ]] || RESULTS=$ROOT/$RESULTS

# GPU counts: powers of two in [MIN_GPUS, MAX_GPUS]; above one node they are whole nodes.
counts=()
for ((n = 1; n <= MAX_GPUS; n *= 2)); do (( n >= MIN_GPUS )) && counts+=("$n"); done
(( ${#counts[@]} )) || { echo "error: no power of two between $MIN_GPUS and $MAX_GPUS" >&2; exit 2; }
for n in "${counts[@]}"; do gpus_to_nodes "$ARCH" "$n"; done  # fail before submitting anything

fake_id=1000
ids=()
# submit SERIES N SHAPE: one benchmark job; its id is appended to ids.
submit() {
  local series=$1 n=$2 shape=$3 out id
  local -a dry=()
  if (( DRY_RUN )); then dry=(--dry-run); fi
  out=$("$HERE/submit.sh" "$ARCH" --gpus "$n" --time "$TIME" --qos "$QOS" --results "$RESULTS" \
        --job-name "pencilfft-$series-$ARCH-${n}gpu" "${dry[@]}" \
        -- --shapes "$shape" --pdims "$(square_pdims "$n")" --tag "$series" \
           --out "$RESULTS/$series/n$n.jsonl" "${EXTRA[@]}")
  if (( DRY_RUN )); then
    echo "$out"
    fake_id=$((fake_id + 1)); id=$fake_id
  else
    id=${out%%;*}  # --parsable prints "id" or "id;cluster"
    echo "# submitted $series n=$n ($shape): job $id" >&2
  fi
  ids+=("$id")
}

echo "# pencilfft sweep on $ARCH: GPUs ${counts[*]}; results in $RESULTS"
if (( DO_STRONG )); then
  echo "# strong scaling: ${STRONG_GRID}^3"
  for n in "${counts[@]}"; do submit strong "$n" "$STRONG_GRID"; done
fi
if (( DO_WEAK )); then
  echo "# weak scaling: ${WEAK_BASE}^3 points per GPU"
  for n in "${counts[@]}"; do submit weak "$n" "$(weak_shape "$WEAK_BASE" "$n")"; done
fi
(( ${#ids[@]} )) || { echo "error: nothing to submit (--no-strong and --no-weak)" >&2; exit 2; }

# The plot job: one GPU of the same partition for a few minutes, after every benchmark job.
pencilfft_sbatch_opts "$ARCH" 1 dev 00:15:00
dep=$(IFS=:; echo "afterany:${ids[*]}")
plot=(sbatch --parsable "${SBATCH_OPTS[@]}" --job-name="pencilfft-plot-$ARCH" --dependency="$dep"
  --output="$RESULTS/logs/%x-%j.out" --error="$RESULTS/logs/%x-%j.out" --chdir="$ROOT"
  --export=ALL,PENCILFFT_ARCH="$ARCH",PENCILFFT_ROOT="$ROOT" "$ROOT/slurm/plot.slurm" "$RESULTS")
echo "# plots and tables once all jobs have ended: $RESULTS/plots, $RESULTS/tables.md"
if (( DRY_RUN )); then
  quote_cmd "${plot[@]}"
else
  mkdir -p "$RESULTS/logs"
  "${plot[@]}"
fi
