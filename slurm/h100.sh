#!/bin/bash
# Benchmark job on Jean Zay's H100 partition: slurm/submit.sh h100 [options] [-- harness args].
#   single node: slurm/h100.sh -- --shapes 512
#   multi-node:  slurm/h100.sh --nodes 4 -- --shapes 1024
# See slurm/submit.sh --help and slurm/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/submit.sh" h100 "$@"
