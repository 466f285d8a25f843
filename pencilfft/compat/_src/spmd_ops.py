"""`jaxdecomp._src.spmd_ops` as far as code outside jaxdecomp reads it: whether the Shardy
partitioner may be used (jaxdecomp's tests skip their Shardy cases when it is False)."""
import jax as _jax  # private: the module holds the one name

__all__ = ["ALLOW_SHARDY_PARTITIONER"]

# jaxdecomp 0.3.1 computes `Version(jax.__version__) > Version("0.7.0")` (and, when False, turns
# Shardy off globally).  pencilfft needs jax >= 0.9, where it is always True; computed the same
# way all the same, without jaxdecomp's `packaging` dependency and without the global switch.
ALLOW_SHARDY_PARTITIONER: bool = tuple(_jax.__version_info__) > (0, 7, 0)
