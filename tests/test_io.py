"""scatter / gather / save / load, in one process and under mpirun.

Every rank builds the same data from a seed, so each rank can check its own blocks; only the
root passes it to `scatter`.  Bad input must raise the same exception on every rank: each
`pytest.raises` below runs on all ranks.
"""
from __future__ import annotations

import errno
import math
import os
import re
import stat

import jax
import numpy as np
import pytest
from conftest import (MPIRUN, MULTI_PROCESS, RANK, barrier, make_mesh, put_global, rel_err, root_only,
                      seeded_data, to_numpy, tol)
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import pencilfft
from pencilfft._processes import blocks as _blocks, io as _io, npyfile as _npyfile
from pencilfft._processes import transport as _transport
from pencilfft import gather, load, save, scatter
from pencilfft._decomposition.sharding import k_space_sharding, real_space_sharding

LAST = jax.process_count() - 1
# The loaders exist for several processes: all of this module runs under mpirun too (it is
# cheap: no transform is compiled here but a few round trips).
pytestmark = MPIRUN

# (global shape, dtype): a batch axis, odd Z, integers (accepted, as the transforms promote them).
CASES = [
    ((8, 8, 4), np.float64),
    ((16, 8, 5), np.complex128),
    ((3, 8, 16, 2), np.float32),
    ((8, 16, 3), np.int32),
]
CASE_IDS = ["x".join(map(str, s)) + "-" + np.dtype(d).name for s, d in CASES]


def _assert_blocks(x: jax.Array, data: np.ndarray, sharding) -> None:
    """Every local device holds exactly its block of `data` (bit for bit)."""
    assert x.shape == data.shape and x.dtype == data.dtype
    assert x.sharding.is_equivalent_to(sharding, data.ndim)
    index_map = sharding.addressable_devices_indices_map(data.shape)
    assert {s.device for s in x.addressable_shards} == set(index_map)
    for shard in x.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), data[index_map[shard.device]])


def _assert_gathered(got, data: np.ndarray, root: int = 0) -> None:
    if RANK == root:
        assert isinstance(got, np.ndarray) and got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)
    else:
        assert got is None


# ------------------------------------------------------------------------ scatter / gather


@pytest.mark.parametrize("shape,dtype", CASES, ids=CASE_IDS)
def test_scatter_gather_roundtrip(pdims, shape, dtype):
    mesh = make_mesh(pdims)
    data = seeded_data(shape, dtype)
    x = scatter(root_only(data), mesh)
    _assert_blocks(x, data, real_space_sharding(mesh, len(shape)))
    _assert_gathered(gather(x), data)


@pytest.mark.parametrize("pdims", [(4, 2), (8,)], ids=["4x2", "8"])
def test_scatter_gather_other_root(pdims):
    mesh = make_mesh(pdims)
    data = seeded_data((8, 8, 4), np.complex64)
    x = scatter(root_only(data, LAST), mesh, root=LAST)
    _assert_blocks(x, data, real_space_sharding(mesh))
    _assert_gathered(gather(x, root=LAST), data, root=LAST)


def test_scatter_auto_mesh():
    mesh = make_mesh((2, 4), "auto")
    data = seeded_data((4, 8, 2), np.float64)
    x = scatter(root_only(data), mesh)
    _assert_blocks(x, data, real_space_sharding(mesh))


@pytest.mark.parametrize("replicated", [False, True], ids=["real-space", "x-replicated"])
def test_scatter_receives_exactly_own_blocks(pdims, replicated, monkeypatch):
    """A non-root rank receives its distinct blocks, each once (however many of its devices
    hold one: a mesh axis the sharding leaves out), and nothing else."""
    mesh = make_mesh(pdims)
    sharding = (NamedSharding(mesh, P(None, mesh.axis_names[-1])) if replicated
                else real_space_sharding(mesh))
    data = seeded_data((8, 16, 4), np.float64)
    received = []
    real_recv = _io._recv

    def recording_recv(comm, buf, source):
        received.append(buf.shape)
        real_recv(comm, buf, source)

    monkeypatch.setattr(_io, "_recv", recording_recv)
    x = scatter(root_only(data), sharding if replicated else mesh)
    _assert_blocks(x, data, sharding)
    index_map = sharding.addressable_devices_indices_map(data.shape)
    own = {_blocks.block_key(index, data.shape) for index in index_map.values()}
    expected = [] if RANK == 0 else sorted(_blocks.block_shape(k) for k in own)
    assert sorted(received) == expected


@pytest.mark.parametrize("limit", [7, 100], ids=["7B", "100B"])
def test_scatter_gather_chunked_messages(monkeypatch, limit):
    """Blocks larger than MAX_MESSAGE_BYTES go in several messages (odd sizes split items)."""
    monkeypatch.setattr(_transport, "MAX_MESSAGE_BYTES", limit)
    mesh = make_mesh((2, 4))
    data = seeded_data((4, 8, 3), np.complex128)
    x = scatter(root_only(data), mesh)
    _assert_blocks(x, data, real_space_sharding(mesh))
    _assert_gathered(gather(x), data)


class _RecordingComm:
    """Stands in for a communicator: records what _send sends, replays it to _recv."""

    def __init__(self):
        self.messages: list[bytes] = []

    def Send(self, buf, dest, tag):
        self.messages.append(bytes(buf))

    def Recv(self, buf, source, tag):
        msg = self.messages.pop(0)
        assert len(msg) == buf.nbytes
        buf[...] = np.frombuffer(msg, np.uint8)


@pytest.mark.parametrize("limit,n_messages", [(1 << 30, 1), (160, 1), (100, 2), (64, 3), (7, 23)])
def test_chunking_logic(monkeypatch, limit, n_messages):
    monkeypatch.setattr(_transport, "MAX_MESSAGE_BYTES", limit)
    block = seeded_data((2, 4, 5), np.float64)[:, 1:3]  # 2*2*5*8 = 160 bytes, not contiguous
    block = np.ascontiguousarray(block)
    comm = _RecordingComm()
    _transport.send(comm, block, dest=1)
    assert [len(m) for m in comm.messages][:-1] == [limit] * (n_messages - 1)
    assert len(comm.messages) == n_messages and sum(map(len, comm.messages)) == block.nbytes
    out = np.empty_like(block)
    _transport.recv(comm, out, source=0)
    np.testing.assert_array_equal(out, block)


@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_gather_k_space(pdims, layout):
    mesh = make_mesh(pdims)
    data = seeded_data((2, 8, 8, 8), np.complex128)
    _assert_gathered(gather(put_global(data, k_space_sharding(mesh, layout, 4))), data)


@pytest.mark.parametrize(
    "spec", [P(), P(None, "y", None), P("y", None, None)], ids=["replicated", "y-only", "x-by-y"]
)
def test_gather_replicated_blocks(spec):
    """Blocks held by several devices (maybe on several processes) arrive once and right."""
    mesh = make_mesh((2, 4))
    data = seeded_data((8, 8, 2), np.float32)
    x = put_global(data, NamedSharding(mesh, spec))
    _assert_gathered(gather(x), data)
    _assert_gathered(gather(x, root=LAST), data, root=LAST)


@pytest.mark.parametrize("pdims", [(4, 2), (8,)], ids=["4x2", "8"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_fft_roundtrip_from_scatter_to_gather(pdims, layout):
    """scatter -> pfft3d -> pifft3d -> gather, and the gathered spectrum against numpy."""
    pfft3d, pifft3d = pencilfft.pfft3d, pencilfft.pifft3d
    mesh = make_mesh(pdims)
    data = seeded_data((8, 8, 8), np.complex128)
    k = pfft3d(scatter(root_only(data), mesh), layout=layout, mesh=mesh)
    spectrum = gather(k)
    back = gather(pifft3d(k, layout=layout, mesh=mesh))
    if RANK == 0:
        ref = np.fft.fftn(data)
        if layout == "transposed":
            ref = np.transpose(ref, (1, 2, 0))  # k-space global order (Y, Z, X)
        assert rel_err(spectrum, ref) < tol(np.complex128)
        assert rel_err(back, data) < tol(np.complex128)
    else:
        assert spectrum is None and back is None


# ------------------------------------------------------------------------------ save / load


@pytest.mark.parametrize("shape,dtype", CASES[:3], ids=CASE_IDS[:3])
def test_save_load_roundtrip(pdims, shape, dtype, shared_dir):
    mesh = make_mesh(pdims)
    data = seeded_data(shape, dtype)
    path = os.path.join(shared_dir, "x.npy")
    save(path, put_global(data, real_space_sharding(mesh, len(shape))))
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), data)  # a standard .npy file
    y = load(path, mesh)
    _assert_blocks(y, data, real_space_sharding(mesh, len(shape)))


@pytest.mark.parametrize(
    "sharding", ["k-transposed", "k-natural", "replicated-y"], ids=lambda s: s
)
def test_save_any_sharding(sharding, shared_dir):
    """k-space arrays and blocks held by several devices: each block written once, right."""
    mesh = make_mesh((2, 4))
    sharding = {
        "k-transposed": k_space_sharding(mesh, "transposed"),
        "k-natural": k_space_sharding(mesh, "natural"),
        "replicated-y": NamedSharding(mesh, P(None, "x")),
    }[sharding]
    data = seeded_data((8, 8, 8), np.complex64)
    path = os.path.join(shared_dir, "k.npy")
    save(path, put_global(data, sharding))
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), data)


@pytest.mark.parametrize("order", ["C", "F"])
def test_load_file_written_by_numpy(order, shared_dir):
    mesh = make_mesh((4, 2))
    data = seeded_data((8, 4, 3), np.float64)
    path = os.path.join(shared_dir, "np.npy")
    if RANK == 0:
        np.save(path, np.asfortranarray(data) if order == "F" else data)
    barrier()
    y = load(path, mesh)
    _assert_blocks(y, data, real_space_sharding(mesh))
    np.testing.assert_array_equal(to_numpy(y), data)


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "pdims,shape,message",
    [
        ((4, 2), (6, 8, 4), r"axis 0 \(X=6\) must be divisible by mesh axis 'x' \(=4\)"),
        ((2, 4), (8, 6, 4), r"axis 1 \(Y=6\) must be divisible by mesh axis 'y' \(=4\)"),
        ((8,), (2, 4, 8, 8), r"axis 1 \(X=4\) must be divisible by mesh axis 'x' \(=8\)"),
        ((4, 2), (8, 8), r"at least 3 dimensions \(\.\.\., X, Y, Z\); got shape \(8, 8\): a "
                         r"mesh stands for the real-space sharding of a field \(\.\.\., X, Y, "
                         r"Z\); for an array of 2 dimensions pass a NamedSharding, e\.g\. "
                         r"NamedSharding\(mesh, P\('x', 'y'\)\)"),
    ],
)
def test_scatter_rejects_shape(pdims, shape, message):
    with pytest.raises(ValueError, match=message):
        scatter(root_only(np.zeros(shape)), make_mesh(pdims))


@pytest.mark.parametrize("dtype", [object, "U3", "datetime64[s]"])
def test_scatter_rejects_dtype(dtype):
    data = np.zeros((8, 8, 2), dtype=dtype)
    message = ("`data` must have a bool, integer, float or complex dtype; got dtype "
               + str(np.dtype(dtype)))
    with pytest.raises(TypeError, match=re.escape(message)):
        scatter(root_only(data), make_mesh((4, 2)))


def test_scatter_rejects_missing_data_on_root():
    with pytest.raises(ValueError, match=r"`data` must be a numpy array on the root rank 0; got None"):
        scatter(None, make_mesh((4, 2)))


@pytest.mark.skipif(not MULTI_PROCESS, reason="needs several ranks")
def test_scatter_rejects_data_on_other_ranks():
    data = np.zeros((8, 8, 2))
    message = (
        "`data` must be None on every rank but the root rank 0; rank 1 passed an array "
        "(numpy.ndarray) of shape (8, 8, 2) and dtype float64"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        scatter(data if RANK in (0, 1) else None, make_mesh((4, 2)))


@pytest.mark.parametrize("what", ["sharding", "mesh", "both", "root", "comm"])
def test_scatter_rejects_arguments(what):
    data = root_only(np.zeros((8, 8, 2)))
    if what == "sharding":
        with pytest.raises(TypeError, match=r"^`sharding` must be a jax.sharding.NamedSharding "
                                            r"\(an array of any rank, .*\) or a jax.sharding.Mesh "
                                            r"\(the real-space sharding .*\); got a tuple$"):
            scatter(data, (4, 2))
    elif what == "mesh":  # the former name, as a keyword: its message of before
        with pytest.raises(TypeError, match=r"`mesh` must be a jax.sharding.Mesh .*; got tuple"):
            scatter(data, mesh=(4, 2))
    elif what == "both":
        with pytest.raises(TypeError, match=r"pass `sharding` or `mesh` \(its former name\), "
                                            r"not both"):
            scatter(data, make_mesh((4, 2)), mesh=make_mesh((4, 2)))
    elif what == "root":
        message = f"`root` must be a rank in [0, {LAST + 1}); got {LAST + 1}"
        with pytest.raises(ValueError, match=re.escape(message)):
            scatter(data, make_mesh((4, 2)), root=LAST + 1)
    else:
        with pytest.raises(TypeError, match=r"`comm` must be an mpi4py communicator; got str"):
            scatter(data, make_mesh((4, 2)), comm="world")


@pytest.mark.skipif(not MULTI_PROCESS, reason="needs several ranks")
def test_comm_must_match_jax_processes():
    from mpi4py import MPI

    message = "`comm` must have one rank per jax process: it has 1 ranks but jax runs"
    with pytest.raises(ValueError, match=re.escape(message)):
        gather(put_global(np.zeros((8, 8, 2)), real_space_sharding(make_mesh((4, 2)))), comm=MPI.COMM_SELF)


def test_gather_rejects_numpy():
    message = "`x` must be a jax.Array; got an array (numpy.ndarray) of shape (8, 8, 2)"
    with pytest.raises(TypeError, match=re.escape(message)):
        gather(np.zeros((8, 8, 2)))


def test_save_rejects_missing_directory(shared_dir):
    x = put_global(np.zeros((8, 8, 2)), real_space_sharding(make_mesh((4, 2))))
    with pytest.raises(FileNotFoundError, match=r"no-such-dir"):
        save(os.path.join(shared_dir, "no-such-dir", "x.npy"), x)


def _write_bad_file(path: str, kind: str) -> None:
    if kind == "garbage":
        with open(path, "wb") as f:
            f.write(b"this is not a numpy file\n" * 10)
    elif kind == "truncated":
        np.save(path, np.zeros((8, 8, 4)))
        with open(path, "r+b") as f:
            f.truncate(300)
    elif kind == "npz":
        np.savez(path, a=np.zeros((8, 8, 4)))
    elif kind == "pickle":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "text":
        with open(path, "w") as f:
            f.write("1 2 3\n4 5 6\n")
    elif kind == "magic":  # one byte of numpy's magic string damaged
        np.save(path, np.zeros((8, 8, 4)))
        with open(path, "r+b") as f:
            f.write(b"\x94")
    elif kind == "header":  # the header's dictionary damaged
        np.save(path, np.zeros((8, 8, 4)))
        with open(path, "r+b") as f:
            f.seek(12)
            f.write(b"#garbage#")
    elif kind == "empty":
        open(path, "wb").close()
    elif kind == "shape":
        np.save(path, np.zeros((8, 6, 4)))
    elif kind == "2d":
        np.save(path, np.zeros((8, 8)))


@pytest.mark.parametrize(
    "kind,error,message",
    [
        ("missing", FileNotFoundError, r"`path` names no file: '.*bad\.npy'"),
        ("garbage", ValueError, r"`path` '.*bad\.npy' is not a \.npy file: it does not start "
                                r"with numpy's magic string b'\\x93NUMPY' \(its first bytes are "
                                r"b'this is not a nu'\); expected a file written by numpy\.save"),
        ("text", ValueError, r"`path` '.*bad\.npy' is not a \.npy file: it does not start "
                             r"with numpy's magic string .*b'1 2 3\\n4 5 6\\n'"),
        ("magic", ValueError, r"`path` '.*bad\.npy' is not a \.npy file: it does not start "
                              r"with numpy's magic string .*\\x94NUMPY"),
        ("empty", ValueError, r"`path` '.*bad\.npy' is not a \.npy file: it is empty"),
        ("header", ValueError, r"`path` '.*bad\.npy' has a corrupt \.npy header: "),
        ("truncated", ValueError, r"`path` '.*bad\.npy' is truncated: its \.npy header "
                                  r"describes an array of shape \(8, 8, 4\) and dtype float64 "
                                  r"\(2048 bytes after the header\), but the file holds only "
                                  r"172 bytes"),
        ("npz", ValueError, r"`path` '.*bad\.npy' is a \.npz archive \(numpy\.savez\), not a "
                            r"\.npy file"),
        ("pickle", TypeError, r"the array in '.*bad\.npy' holds Python objects \(dtype object, "
                              r"stored as pickles\); pencilfft\.load reads bool, integer, float "
                              r"and complex arrays only"),
        ("shape", ValueError, r"the array in '.*bad\.npy' has shape \(8, 6, 4\): axis 1 \(Y=6\) must "
                              r"be divisible by mesh axis 'y' \(=4\)"),
        ("2d", ValueError, r"the array in '.*bad\.npy' must have at least 3 dimensions"),
    ],
)
def test_load_rejects_bad_file(kind, error, message, shared_dir):
    path = os.path.join(shared_dir, "bad.npy")
    if RANK == 0 and kind != "missing":
        _write_bad_file(path, kind)
        if kind == "npz":
            os.replace(path + ".npz", path)
    barrier()
    with pytest.raises(error, match=message) as info:
        load(path, make_mesh((2, 4)))
    assert "allow_pickle" not in str(info.value)  # load has no such argument (issue 21)


@pytest.mark.parametrize("func", ["save-load", "scatter-gather"])
def test_bool_arrays_round_trip(func, shared_dir):
    """save wrote bool files that load refused (issue 21): the four take the same dtypes."""
    data = seeded_data((8, 8, 2), np.float32) > 0.5
    mesh = make_mesh((4, 2))
    if func == "save-load":
        path = os.path.join(shared_dir, "mask.npy")
        save(path, put_global(data, real_space_sharding(mesh)))
        x = load(path, mesh)
    else:
        x = scatter(root_only(data), mesh)
    assert x.dtype == np.bool_
    _assert_blocks(x, data, real_space_sharding(mesh))
    _assert_gathered(gather(x), data)


@pytest.mark.skipif(not MULTI_PROCESS, reason="needs several ranks")
def test_load_error_on_one_rank_reaches_all(shared_dir):
    """Only the last rank is given a missing file: every rank raises its error, none hangs."""
    good = os.path.join(shared_dir, "good.npy")
    if RANK == 0:
        np.save(good, np.zeros((8, 8, 2)))
    barrier()
    path = os.path.join(shared_dir, "missing.npy") if RANK == LAST else good
    with pytest.raises(FileNotFoundError, match=r"`path` names no file: '.*missing\.npy'"):
        load(path, make_mesh((4, 2)))


# ------------------------------------------------------------- dtypes, files, tracers (issue 11)


def test_scatter_gather_bfloat16():
    """bfloat16 is a float: the transforms take it, so scatter does (the message said otherwise)."""
    import jax.numpy as jnp

    data = seeded_data((8, 8, 2), np.float32).astype(jnp.bfloat16)
    x = scatter(root_only(data), make_mesh((4, 2)))
    assert x.dtype == jnp.bfloat16
    _assert_blocks(x, data, real_space_sharding(make_mesh((4, 2))))
    _assert_gathered(gather(x), data)


def test_save_refuses_bfloat16(shared_dir):
    import jax.numpy as jnp

    x = put_global(seeded_data((8, 8, 2), np.float32).astype(jnp.bfloat16),
                   real_space_sharding(make_mesh((4, 2))))
    message = ("`x` has dtype bfloat16, which a .npy file cannot describe (numpy would read it "
               "back as raw bytes, dtype '<V2'); expected a bool, integer, float or complex dtype")
    with pytest.raises(TypeError, match=re.escape(message)):
        save(os.path.join(shared_dir, "b.npy"), x)
    if RANK == 0:
        assert os.listdir(shared_dir) == []


@pytest.mark.skipif(np.finfo(np.longdouble).bits <= 64, reason="long double is float64 here")
def test_scatter_rejects_long_double():
    data = np.zeros((8, 8, 2), dtype=np.longdouble)
    message = f"got dtype {np.dtype(np.longdouble)}, which jax does not support"
    with pytest.raises(TypeError, match=re.escape(message)):
        scatter(root_only(data), make_mesh((4, 2)))


def test_scatter_too_big_is_refused_before_it_allocates(monkeypatch):
    """Issue 57: scatter had no memory check (a block too big grew the process until the OOM
    killer acted).  Now, as `load`: MemoryLimitError on every rank, naming the sizes, before any
    receive buffer is allocated or any block moves.  64^3 float32 on 4x2: blocks of 128 KiB,
    twice on CPU devices (the host copy), do not fit in 100 KiB; they do in 1 MiB."""
    data = seeded_data((64, 64, 64), np.float32)
    mesh = make_mesh((4, 2))
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "100KiB")
    block = data.size // 8
    allocated = []
    real_empty = np.empty

    def empty(shape, *args, **kwargs):  # the receive and send buffers
        if int(np.prod(shape)) >= block:
            allocated.append(shape)
        return real_empty(shape, *args, **kwargs)

    def moved(*args, **kwargs):
        raise AssertionError("a block moved before the memory check")

    with monkeypatch.context() as m:
        m.setattr(np, "empty", empty)
        for name in ("_send", "_recv", "_assemble"):
            m.setattr(_io, name, moved)
        with pytest.raises(pencilfft.MemoryLimitError) as info:
            scatter(root_only(data), mesh)
    assert isinstance(info.value, MemoryError)
    assert allocated == []
    assert str(info.value).startswith(
        "scattering `data` (global shape (64, 64, 64), float32) on a 4x2 mesh needs about 0.25 "
        "MiB per device (its block, and the host copy it is received into), but a device has "
        "about 0.0977 MiB (PENCILFFT_MEMORY_LIMIT=100KiB)."), str(info.value)
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "1MiB")
    _assert_blocks(scatter(root_only(data), mesh), data, real_space_sharding(mesh))


def _x64_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "jax_enable_x64 is off" in str(w.message)]


@pytest.mark.parametrize("func", ["scatter", "load"])
@pytest.mark.parametrize("dtype,narrow", [(np.float64, np.float32), (np.int64, np.int32),
                                          (np.complex128, np.complex64)])
def test_x64_off_narrows_with_a_warning(func, dtype, narrow, shared_dir):
    """Without x64 the result is 32-bit: one warning (on the root / rank 0) says so."""
    import warnings

    mesh = make_mesh((4, 2))
    data = seeded_data((8, 8, 2), dtype)
    path = os.path.join(shared_dir, "w.npy")
    if RANK == 0:
        np.save(path, data)
    barrier()
    with jax.enable_x64(False), warnings.catch_warnings(record=True) as caught:
        # Only this warning: a catch-all "always" can outlive the block in the C warnings
        # state and make Python print ResourceWarnings at exit.
        warnings.filterwarnings("always", message=r"pencilfft\.", category=UserWarning)
        x = scatter(root_only(data), mesh) if func == "scatter" else load(path, mesh)
        assert x.dtype == narrow
        _assert_blocks(x, data.astype(narrow), real_space_sharding(mesh))
    messages = _x64_warnings(caught)
    if RANK == 0:
        assert len(messages) == 1 and f"has dtype {np.dtype(dtype)}" in messages[0]
        assert f"the result has dtype {np.dtype(narrow)}" in messages[0]
    else:
        assert messages == []


def test_x64_warning_as_error_reaches_every_rank():
    """A warning turned into an error on the root alone must not leave the others waiting."""
    import warnings

    with jax.enable_x64(False), warnings.catch_warnings():
        if RANK == 0:
            warnings.filterwarnings("error", message=r"pencilfft\.", category=UserWarning)
        with pytest.raises(RuntimeError, match=r"UserWarning: pencilfft.scatter: `data` has dtype "
                                               r"float64, but jax_enable_x64 is off"):
            scatter(root_only(np.zeros((8, 8, 2))), make_mesh((4, 2)))


def test_load_rejects_directory(shared_dir):
    with pytest.raises(IsADirectoryError, match=r"`path` '.*' is a directory; expected a \.npy file"):
        load(shared_dir, make_mesh((4, 2)))


def test_load_rejects_unreadable_file(shared_dir, monkeypatch):
    """PermissionError, not 'not a readable .npy file' (ValueError)."""
    import builtins

    path = os.path.join(shared_dir, "secret.npy")
    if RANK == 0:
        np.save(path, np.zeros((8, 8, 2)))
    barrier()
    real_open = builtins.open

    def denied(file, *args, **kwargs):  # as chmod 000 would for anyone but root
        if os.fspath(file) == path:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(PermissionError, match=r"`path` '.*secret\.npy' cannot be read: "
                                              r"Permission denied"):
        load(path, make_mesh((4, 2)))


def test_save_rejects_directory(shared_dir):
    x = put_global(np.zeros((8, 8, 2)), real_space_sharding(make_mesh((4, 2))))
    with pytest.raises(IsADirectoryError, match=r"`path` '.*' is a directory; expected a file name"):
        save(shared_dir, x)


def _make_special(path: str, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    else:  # /dev/full's numbers (1, 7): a scratch node, never the machine's own
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 7))


@pytest.mark.parametrize("kind,link", [("chardev", False), ("chardev", True), ("fifo", False)])
def test_save_refuses_what_is_not_a_regular_file(kind, link, shared_dir):
    """Issue 57: saving to /dev/full as root replaced the device node with a regular file (the
    rename of the temporary file).  A device, a FIFO, or a symbolic link to one is refused with
    an OSError (EINVAL) naming `path` and what it is; nothing is written, the node stays."""
    if kind == "chardev" and os.geteuid() != 0:
        pytest.skip("making a character device (mknod) needs root; the FIFO case runs anyway")
    node = os.path.join(shared_dir, f"node-{kind}")
    path = os.path.join(shared_dir, f"link-{kind}") if link else node
    if RANK == 0:
        _make_special(node, kind)
        if link:
            os.symlink(node, path)
    barrier()
    x = put_global(np.zeros((8, 8, 2)), real_space_sharding(make_mesh((4, 2))))
    what = {"chardev": "a character device", "fifo": "a FIFO (named pipe)"}[kind]
    via = f" (through symbolic links: {node!r})" if link else ""
    with pytest.raises(OSError) as info:
        save(path, x)
    assert info.value.errno == errno.EINVAL
    assert str(info.value) == (
        f"[Errno 22] `path` {path!r} is {what}{via}, not a regular file: pencilfft.save replaces its target "
        f"with a new .npy file, so it writes only to a new name, a regular file or a symbolic "
        f"link to one; {path!r} is unchanged")
    check = stat.S_ISCHR if kind == "chardev" else stat.S_ISFIFO
    assert check(os.stat(path).st_mode)
    assert os.path.islink(path) == link
    assert not [f for f in os.listdir(shared_dir) if f.endswith(_npyfile.TMP_SUFFIX)]


def test_save_rechecks_the_target_before_the_rename(shared_dir, monkeypatch):
    """A target that became a FIFO between the first check and the rename is refused there:
    the temporary file is removed, the FIFO stays."""
    path = os.path.join(shared_dir, "late.npy")
    x = put_global(np.zeros((8, 8, 2)), real_space_sharding(make_mesh((4, 2))))
    real_write = _io._write_blocks

    def write_then_swap(*args, **kwargs):
        real_write(*args, **kwargs)
        if RANK == 0 and not os.path.exists(path):
            os.mkfifo(path)

    monkeypatch.setattr(_io, "_write_blocks", write_then_swap)
    with pytest.raises(OSError, match=re.escape(
            f"cannot save {path!r}: `path` {path!r} is a FIFO (named pipe), not a regular file: "
            f"pencilfft.save replaces its target with a new .npy file, so it writes only to a new "
            f"name, a regular file or a symbolic link to one; {path!r} is unchanged")):
        save(path, x)
    barrier()  # rank 0 removes the temporary file as it leaves `save`
    assert stat.S_ISFIFO(os.stat(path).st_mode)
    assert not [f for f in os.listdir(shared_dir) if f.endswith(_npyfile.TMP_SUFFIX)]


@pytest.mark.parametrize("func", ["gather", "save"])
def test_tracer_is_refused(func, shared_dir):
    """Under jit these cannot move data: a TypeError saying so, not RuntimeError(AttributeError)."""
    x = put_global(np.zeros((8, 8, 2)), real_space_sharding(make_mesh((4, 2))))
    call = gather if func == "gather" else lambda a: save(os.path.join(shared_dir, "t.npy"), a)
    with pytest.raises(TypeError, match=rf"`x` must be a concrete jax.Array; got a tracer "
                                        rf"\(.*\): pencilfft.{func} moves data"):
        jax.jit(lambda a: (call(a), a)[1])(x)


@pytest.mark.parametrize("spec", [P(None, "y", None, "x"), P("x", None, None, "y")],
                         ids=["y-and-last", "batch-and-z"])
def test_save_blocks_with_short_runs(spec, shared_dir):
    """Blocks split along the last axis are many short runs in the file: each lands right."""
    mesh = make_mesh((2, 4))
    data = seeded_data((2, 8, 3, 8), np.complex128)
    path = os.path.join(shared_dir, "runs.npy")
    save(path, put_global(data, NamedSharding(mesh, spec)))
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), data)


# ------------------------------------------------------- any rank, any NamedSharding (issue 67)

# Meshes of 1, 2 and 3 axes over the 8 devices.  The parameter is `mesh_shape`, not `pdims`:
# conftest runs a `pdims` of one axis in the single-process step only, and where the blocks of a
# one-axis mesh lie across processes is part of what these tests check under mpirun.
MESH_SHAPES = [(8,), (4, 2), (2, 2, 2)]
MESH_IDS = ["x".join(map(str, m)) for m in MESH_SHAPES]


def _nd_mesh(mesh_shape) -> Mesh:
    return jax.make_mesh(tuple(mesh_shape), ("x", "y", "z")[: len(mesh_shape)],
                         axis_types=(AxisType.Explicit,) * len(mesh_shape))


def _spec(kind: str, ndim: int, mesh: Mesh) -> P:
    """split: every mesh axis splits an array axis (mesh axis k array axis k, the mesh axes left
    over all on the last array axis); replicated: the mesh's first axis alone splits the last
    array axis, its other axes hold copies (all copies, P(), on a one-axis mesh)."""
    names = mesh.axis_names
    if kind == "replicated":
        return P() if len(names) == 1 else P(*(None,) * (ndim - 1), names[0])
    entries = [() for _ in range(ndim)]
    for k, name in enumerate(names):
        entries[min(k, ndim - 1)] += (name,)
    return P(*(None if not e else e[0] if len(e) == 1 else e for e in entries))


def _shape(ndim: int, specs, mesh: Mesh) -> tuple[int, ...]:
    """A small global shape that every spec of `specs` divides: per axis the devices that split
    it (in either spec) times 3, 2, 1, 2 (odd lengths and blocks of one along an axis too)."""
    sizes = dict(mesh.shape)

    def split(spec, axis):
        entry = tuple(spec)[axis] if axis < len(tuple(spec)) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else entry
        return math.prod(sizes[n] for n in names)

    return tuple(math.lcm(*(split(s, a) for s in specs)) * (3, 2, 1, 2)[a] for a in range(ndim))


def _allgather(value):
    """Every rank's `value`, in rank order (a list of one in a single process)."""
    if not MULTI_PROCESS:
        return [value]
    from mpi4py import MPI

    return MPI.COMM_WORLD.allgather(value)


# Every rank on every mesh, each with one of the four (dtype, kind) pairs in turn, so that each
# pair meets every rank and every mesh once or more (12 cases: the suite's time; every case
# also loads into the other kind).
_PAIRS = [(np.float32, "split"), (np.complex128, "replicated"), (np.complex128, "split"),
          (np.float32, "replicated")]
_ANY_RANK = [(ndim, mesh_shape, *_PAIRS[(ndim + m) % 4]) for ndim in (1, 2, 3, 4)
             for m, mesh_shape in enumerate(MESH_SHAPES)]


@pytest.mark.parametrize("ndim,mesh_shape,dtype,kind", _ANY_RANK, ids=[
    f"{n}d-{'x'.join(map(str, m))}-{np.dtype(d).name}-{k}" for n, m, d, k in _ANY_RANK])
def test_any_rank_round_trip(ndim, mesh_shape, dtype, kind, shared_dir):
    """scatter -> gather and save -> numpy.load -> load, against numpy, for arrays of rank 1 to
    4 in a NamedSharding that splits over every mesh axis or leaves some replicated; `load`
    reads the file into the other one (the sharding the next step needs)."""
    mesh = _nd_mesh(mesh_shape)
    specs = {k: _spec(k, ndim, mesh) for k in ("split", "replicated")}
    data = seeded_data(_shape(ndim, specs.values(), mesh), dtype)
    sharding = NamedSharding(mesh, specs[kind])
    x = scatter(root_only(data), sharding)
    _assert_blocks(x, data, sharding)
    _assert_gathered(gather(x), data)
    path = os.path.join(shared_dir, "nd.npy")
    save(path, x)
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), data)
    other = NamedSharding(mesh, specs["replicated" if kind == "split" else "split"])
    _assert_blocks(load(path, other), data, other)


def test_mesh_keyword_still_works(shared_dir):
    """`mesh=`, the former name of `sharding`, keeps its meaning: the real-space sharding."""
    mesh = make_mesh((4, 2))
    data = seeded_data((8, 4, 3), np.float32)
    x = scatter(root_only(data), mesh=mesh)
    _assert_blocks(x, data, real_space_sharding(mesh))
    path = os.path.join(shared_dir, "m.npy")
    save(path, x)
    _assert_blocks(load(path, mesh=mesh), data, real_space_sharding(mesh))


@pytest.mark.parametrize("devices", ["first-half", "every-other"])
def test_mesh_over_some_devices(devices, shared_dir):
    """A sharding over some of the devices: a process holding none of them still takes part
    (it receives, writes and reads nothing, and holds no shard), and so may the root."""
    chosen = jax.devices()[:4] if devices == "first-half" else jax.devices()[::2]
    mesh = Mesh(np.array(chosen).reshape(2, 2), ("x", "y"))
    sharding = NamedSharding(mesh, P("y", None))  # "x" holds copies
    data = seeded_data((6, 3), np.complex64)
    x = scatter(root_only(data, LAST), sharding, root=LAST)
    _assert_blocks(x, data, sharding)
    _assert_gathered(gather(x, root=LAST), data, root=LAST)
    path = os.path.join(shared_dir, "some.npy")
    save(path, x)
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), data)
    _assert_blocks(load(path, sharding), data, sharding)


@pytest.mark.parametrize("spec", [P(), P("y"), P(None, "x")], ids=["replicated", "y", "x-last"])
def test_save_writes_each_block_once_by_the_lowest_rank(spec, shared_dir, monkeypatch):
    """A block held by several devices, maybe of several processes, is written once, by rank 0
    if it holds it, else by the lowest rank that does."""
    mesh = make_mesh((2, 4))
    data = seeded_data((8, 8), np.float64)
    x = put_global(data, NamedSharding(mesh, spec))
    written = []
    real_write = _io._pwrite_block

    def recording(fd, block, key, shape, base):
        written.append(key)
        real_write(fd, block, key, shape, base)

    monkeypatch.setattr(_io, "_pwrite_block", recording)
    path = os.path.join(shared_dir, "once.npy")
    save(path, x)
    holders: dict = {}
    for device, index in x.sharding.devices_indices_map(data.shape).items():
        holders.setdefault(_blocks.block_key(index, data.shape), set()).add(device.process_index)
    expected = [sorted(k for k, ranks in holders.items() if min(ranks) == r)
                for r in range(jax.process_count())]
    assert [sorted(w) for w in _allgather(written)] == expected
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), data)


class _RecordingMap:
    """Stands in for load's memory map: records the blocks read from it."""

    def __init__(self, mm, reads):
        self.mm, self.reads = mm, reads

    def __getattr__(self, name):
        return getattr(self.mm, name)

    def __getitem__(self, index):
        self.reads.append(_blocks.block_key(index, self.mm.shape))
        return self.mm[index]


@pytest.mark.parametrize("spec", [P("x", "y"), P(None, "y")], ids=["split", "x-replicated"])
def test_load_reads_only_own_blocks(spec, shared_dir, monkeypatch):
    """Each process reads the distinct blocks of its own devices from the file, each once."""
    mesh = make_mesh((4, 2))
    sharding = NamedSharding(mesh, spec)
    data = seeded_data((8, 6), np.float32)
    path = os.path.join(shared_dir, "own.npy")
    if RANK == 0:
        np.save(path, data)
    barrier()
    reads = []
    real_open = _io.open_npy
    monkeypatch.setattr(_io, "open_npy", lambda p: _RecordingMap(real_open(p), reads))
    _assert_blocks(load(path, sharding), data, sharding)
    own = {_blocks.block_key(i, data.shape)
           for i in sharding.addressable_devices_indices_map(data.shape).values()}
    assert sorted(reads) == sorted(own)


def test_fftn_from_scatter_to_load(shared_dir):
    """The docs' way for the N-D names: a 2-D field scattered in a NamedSharding, fftn, the
    spectrum saved and loaded in its own sharding (`k.sharding`), ifftn, gathered: against
    numpy."""
    mesh = make_mesh((4, 2))
    data = seeded_data((8, 6), np.complex128)
    k = pencilfft.fftn(scatter(root_only(data), NamedSharding(mesh, P("x", "y"))))
    path = os.path.join(shared_dir, "k.npy")
    save(path, k)
    k2 = load(path, k.sharding)
    assert k2.sharding == k.sharding
    spectrum, back = gather(k2), gather(pencilfft.ifftn(k2))
    if RANK == 0:
        assert rel_err(spectrum, np.fft.fftn(data)) < tol(np.complex128)
        assert rel_err(back, data) < tol(np.complex128)


def _sharding_case(case: str) -> tuple[NamedSharding, tuple[int, ...]]:
    mesh = make_mesh((4, 2), "auto" if case == "unconstrained" else "explicit")
    spec, shape = {
        "uneven": (P("x"), (6, 4)),
        "uneven-tuple": (P(None, ("x", "y")), (8, 12)),
        "entries": (P("x", "y", None), (8,)),
        "unconstrained": (P(P.UNCONSTRAINED, None), (8, 8)),
    }[case]
    return NamedSharding(mesh, spec), shape


_SHARDING_ERRORS = {
    "uneven": "{what} has shape (6, 4): axis 0 (=6) must be divisible by mesh axis 'x' (=4), "
              "which `sharding` {spec} splits it over: jax splits an array evenly (as fftn's "
              "input and result); split it by mesh axes whose sizes divide it, keep it whole "
              "(None), or pad the array",
    "uneven-tuple": "{what} has shape (8, 12): axis 1 (=12) must be divisible by mesh axes "
                    "('x', 'y') (=8), which `sharding` {spec} splits it over",
    "entries": "`sharding` {spec} has 3 entries, but {what} has 1 dimension (shape (8,)): give "
               "one entry per array axis at most (None keeps an axis whole)",
    "unconstrained": "`sharding` {spec} leaves axis 0 unconstrained: the loaders place every "
                     "block themselves; name the mesh axes that split it, or None",
}


@pytest.mark.parametrize("func", ["scatter", "load"])
@pytest.mark.parametrize("case", list(_SHARDING_ERRORS))
def test_sharding_that_does_not_fit_is_refused(func, case, shared_dir):
    """A spec that does not divide the shape (jax's arrays, as fftn's, are split evenly), has
    more entries than the array has axes, or leaves an axis to jax: a ValueError naming
    `sharding`, on every rank, before anything moves."""
    sharding, shape = _sharding_case(case)
    path = os.path.join(shared_dir, "fit.npy")
    if RANK == 0:
        np.save(path, np.zeros(shape, np.float32))
    barrier()
    what = "`data`" if func == "scatter" else f"the array in {path!r}"
    message = _SHARDING_ERRORS[case].format(what=what, spec=sharding.spec)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        if func == "scatter":
            scatter(root_only(np.zeros(shape, np.float32)), sharding)
        else:
            load(path, sharding)


@pytest.mark.parametrize("func", ["scatter", "load"])
def test_sharding_of_another_kind_is_refused(func, shared_dir):
    sharding = SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(TypeError, match=r"`sharding` must be a jax.sharding.NamedSharding .*; "
                                        r"got a SingleDeviceSharding$"):
        if func == "scatter":
            scatter(root_only(np.zeros((8, 8))), sharding)
        else:
            load(os.path.join(shared_dir, "none.npy"), sharding)


@pytest.mark.skipif(not MULTI_PROCESS, reason="needs several ranks")
@pytest.mark.parametrize("func", ["scatter", "load"])
def test_sharding_differs_on_one_rank(func, shared_dir):
    mesh = make_mesh((4, 2))
    sharding = NamedSharding(mesh, P(None, "x") if RANK == LAST else P("x"))
    data = seeded_data((8, 8), np.float32)
    path = os.path.join(shared_dir, "d.npy")
    if RANK == 0:
        np.save(path, data)
    barrier()
    with pytest.raises(ValueError, match=r"`sharding` must be the same on every rank; got axes"):
        if func == "scatter":
            scatter(root_only(data), sharding)
        else:
            load(path, sharding)


@pytest.mark.parametrize("func", ["scatter", "load"])
def test_sharding_too_big_is_refused(func, shared_dir, monkeypatch):
    """The memory check counts a block as the sharding makes it (a replicated mesh axis gives
    bigger blocks) and says so."""
    sharding = NamedSharding(make_mesh((4, 2)), P("x"))
    data = seeded_data((64, 64), np.float32)  # blocks of 16 x 64 floats: 4 KiB, twice on CPUs
    path = os.path.join(shared_dir, "big.npy")
    if RANK == 0:
        np.save(path, data)
    barrier()
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "4KiB")
    verb, what, into = (("scattering", "`data`", "received into") if func == "scatter"
                        else ("loading", repr(path), "read into"))
    message = (f"{verb} {what} (global shape (64, 64), float32) split {sharding.spec} on a 4x2 "
               f"mesh needs about 0.00781 MiB per device (its block, and the host copy it is "
               f"{into}), but a device has about 0.00391 MiB (PENCILFFT_MEMORY_LIMIT=4KiB). "
               f"Split the array over every mesh axis (`sharding` {sharding.spec} keeps it whole "
               f"along mesh axes ('y',): each of their devices holds a copy of its block)")
    run = (lambda: scatter(root_only(data), sharding)) if func == "scatter" else (
        lambda: load(path, sharding))
    with pytest.raises(pencilfft.MemoryLimitError, match="^" + re.escape(message)):
        run()
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "16KiB")
    _assert_blocks(run(), data, sharding)
