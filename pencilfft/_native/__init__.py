"""The runtime of pencilfft's compiled CPU handlers (XLA FFI custom calls).

Holds:

* `build`: the one compiler rule, building a handler's `.cc` source on first use into a cache
  keyed by everything that changes the binary, loading it, registering it with XLA once per
  process;
* `trust`: which cache folder and files may be loaded from (this user's or root's, writable by
  no one else: ssh's and pip's rule), and the private folder used instead;
* `threads`: the one thread rule (the cores a process may use, shared by its CPU devices);
* `malloc`: glibc kept from returning freed memory between calls.

The handlers themselves sit beside the modules that bind them (`_transforms/fftw.cc`,
`_exchange/local.cc` and `mpi.cc`, `_pm/paint.cc`); they ask here to be built, threaded and
registered.  May import: jax, the standard library.  Nothing of pencilfft: every other part
builds on it.
"""
