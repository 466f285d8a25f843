#!/bin/bash
# Benchmark job on Jean Zay's V100 partition: slurm/submit.sh v100 [options] [-- harness args].
#   single node: slurm/v100.sh -- --shapes 512
#   multi-node:  slurm/v100.sh --nodes 4 -- --shapes 1024
# See slurm/submit.sh --help and slurm/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/submit.sh" v100 "$@"
