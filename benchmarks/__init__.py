"""Benchmarks for pencilfft (not part of the installed package): one harness, one file per
comparison.

`harness` (one command line, the machine, input data, one timing loop, records, one markdown
table writer), `private` (every pencilfft private name they use), `plot` (the figures),
`results` (RESULTS.md's tables from benchmarks/data/), `device` (the run on a lent GPU machine);
the comparisons: `fft` (the distributed FFTs side by side), `steps`, `memory`, `chunks`,
`kernel`, `threads`, `layouts`, `mpi`, `margin`, `kinds`, `batch`, `power`, `paint`, `pm`,
`gpu`.  Each runs as `python -m benchmarks.<comparison> --help`.
"""
