"""The .npy file the loaders read and write: its header, and `save`'s temporary file.

`save` (`io`) writes a standard .npy file (C order, format 1.0, or 2.0 for a long header) in
steps every process takes part in: rank 0 creates a hidden temporary file next to the target
and reserves its full size (`create_temporary`), each process writes its blocks into it at
their offsets (`pwrite_block`), and rank 0 renames it over the target once all succeeded
(`commit`).  `load` memory-maps a file (`open_npy`) after reading its header itself, so that
each kind of bad file gets a message that says what it is.  Shapes are global.
"""
from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from typing import Any

import numpy as np

from .blocks import Key
from .transport import EXCEPTIONS

__all__ = ["MAX_WRITE_BYTES", "TMP_SUFFIX", "check_path", "check_target", "commit",
           "create_temporary", "file_error", "open_npy", "pwrite_block", "refuse_special",
           "remove_quietly"]

# Largest single pwrite: Linux writes at most 0x7ffff000 bytes per call.
MAX_WRITE_BYTES = 1 << 30

# The temporary file `save` writes: hidden, next to the target, with a random part.
TMP_SUFFIX = ".pencilfft-tmp"


def check_path(path: Any) -> str:
    """`path` as an absolute str (the same on every rank that means the same file)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike; got {type(path).__name__}")
    return os.path.abspath(os.fspath(path))


def check_target(path: str) -> None:
    """Where `save` can write: an existing directory, and not a directory itself, nor anything
    else that is not a regular file (`refuse_special`)."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"`path` {path!r} cannot be written: its directory {directory!r} does not exist"
        )
    if os.path.isdir(path):
        raise IsADirectoryError(f"`path` {path!r} is a directory; expected a file name")
    refuse_special(path)


_SPECIAL_FILES = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def refuse_special(path: str, unchanged: bool = True) -> None:
    """OSError (EINVAL) if `path`, or what its symbolic links lead to, exists and is not a
    regular file.  `save` replaces its target with a new file (a rename), so saving to
    /dev/null or /dev/full as root replaced the device node itself with a regular file
    (issue 57); numpy.save would write into the device instead (ENOSPC for /dev/full).
    pencilfft refuses: a new name, a regular file or a symbolic link to one."""
    target = os.path.realpath(path)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return  # a new file (or a dangling link's target, created)
    except OSError:
        return  # unreadable: the temporary file's creation says why
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):  # a directory: IsADirectoryError above
        return
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")
    via = f" (through symbolic links: {target!r})" if target != path else ""
    raise OSError(
        errno.EINVAL,
        f"`path` {path!r} is {kind}{via}, not a regular file: pencilfft.save replaces its target "
        f"with a new .npy file, so it writes only to a new name, a regular file or a symbolic "
        f"link to one" + (f"; {path!r} is unchanged" if unchanged else ""),
    )


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def open_npy(path: str) -> np.ndarray:
    """Memory-map the array in a .npy file (reads nothing but the header).

    The header is read here first, so that a file that is not a .npy file, a corrupt or
    truncated one and one holding Python objects each get a message that says so (numpy's
    own would speak of pickles and an `allow_pickle` argument that `load` does not have).
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(f"`path` names no file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"`path` {path!r} is a directory; expected a .npy file")
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype, offset = _read_npy_header(f, path)
    except PermissionError as e:
        raise PermissionError(f"`path` {path!r} cannot be read: {e.strerror}") from e
    except FileNotFoundError as e:  # e.g. a dangling symbolic link
        raise FileNotFoundError(f"`path` names no file: {path!r} ({e.strerror})") from e
    if dtype.hasobject:
        raise TypeError(
            f"the array in {path!r} holds Python objects (dtype {dtype}, stored as pickles); "
            f"pencilfft.load reads bool, integer, float and complex arrays only"
        )
    data = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < offset + data:
        raise ValueError(
            f"`path` {path!r} is truncated: its .npy header describes an array of shape "
            f"{tuple(shape)} and dtype {dtype} ({data} bytes after the header), but the file "
            f"holds only {size - offset} bytes after the header"
        )
    try:
        mm = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy says ValueError, OSError, EOFError ...
        raise ValueError(f"`path` {path!r} is not a readable .npy file: {e}") from e
    return mm


def _read_npy_header(f, path: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, offset of the data) from an open .npy file."""
    start = f.read(len(_NPY_MAGIC))
    if start.startswith(_ZIP_MAGIC):
        raise ValueError(
            f"`path` {path!r} is a .npz archive (numpy.savez), not a .npy file; load one array "
            f"of it with numpy.load and write it with numpy.save or pencilfft.save"
        )
    if start != _NPY_MAGIC:
        what = "it is empty" if not start else (
            f"it does not start with numpy's magic string {_NPY_MAGIC!r} (its first bytes are "
            f"{start + f.read(10)!r})")
        raise ValueError(
            f"`path` {path!r} is not a .npy file: {what}; expected a file written by "
            f"numpy.save or pencilfft.save"
        )
    f.seek(0)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # 3.0 (utf-8 field names): numpy has no public reader for it
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    except (ValueError, EOFError, SyntaxError, TypeError, AttributeError) as e:
        raise ValueError(f"`path` {path!r} has a corrupt .npy header: {e}") from e
    return tuple(shape), bool(fortran), np.dtype(dtype), f.tell()


def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The header numpy writes for a C-order array (format 1.0, or 2.0 when it must)."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
         "shape": tuple(int(n) for n in shape)}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:  # a header longer than 64 KiB
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def create_temporary(path: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[str, int]:
    """Rank 0: the temporary file next to `path`, header written and full size reserved.

    Returns (its name, the header length).  Next to the (resolved) target so that the final
    rename stays within one file system.
    """
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    header = _npy_header(shape, dtype)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}{TMP_SUFFIX}")
        try:
            fd = os.open(tmp, flags, 0o666)  # 0o666 & ~umask, like numpy.save
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary file name next to {path!r}")
    try:
        try:
            if os.path.isfile(target):  # overwriting keeps the old file's permissions
                os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        except OSError:
            pass
        _pwrite_all(fd, np.frombuffer(header, np.uint8), 0)
        _reserve(fd, len(header) + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        remove_quietly(tmp)
        raise
    os.close(fd)
    return tmp, len(header)


def _reserve(fd: int, size: int) -> None:
    """Allocate the whole file now: a full disk or a size limit is an OSError here.

    Writing into a sparse file can fail later, and through a memory map that failure is a
    SIGBUS that kills the process.  Where the file system cannot preallocate, the file is
    only extended; `pwrite` then still reports a full disk as an OSError.
    """
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None and size > 0:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def pwrite_block(fd: int, block: np.ndarray, key: Key, shape: tuple[int, ...], base: int) -> None:
    """Write a C-contiguous block of a C-order array stored at byte `base` of the file.

    The block is a set of runs, each contiguous in the file: along the last axis the block
    does not span entirely, times all the axes after it (which it spans).
    """
    if block.size == 0:
        return
    n = len(shape)
    strides = [int(np.prod(shape[m + 1:], dtype=np.int64)) for m in range(n)]
    j = n
    while j > 0 and key[j - 1] == (0, shape[j - 1]):
        j -= 1
    offsets = np.zeros((), np.int64)
    if j == 0:
        run = block.size
    else:
        for m in range(j - 1):
            offsets = offsets[..., None] + np.arange(*key[m], dtype=np.int64) * strides[m]
        offsets = offsets + key[j - 1][0] * strides[j - 1]
        run = (key[j - 1][1] - key[j - 1][0]) * strides[j - 1]
    itemsize = block.dtype.itemsize
    rows = block.reshape(-1).view(np.uint8).reshape(-1, run * itemsize)
    for row, offset in zip(rows, offsets.reshape(-1).tolist()):
        _pwrite_all(fd, row, base + offset * itemsize)


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done : done + MAX_WRITE_BYTES], offset + done)
        if written <= 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing at offset {offset + done}")
        done += written


def commit(tmp: str, path: str, expected: int) -> None:
    """Rank 0, after every rank wrote and synced its blocks: check the size, rename, sync."""
    size = os.stat(tmp).st_size
    if size != expected:
        raise OSError(
            errno.EIO,
            f"the temporary file {tmp!r} has {size} bytes after every process wrote its "
            f"blocks, not the {expected} of the array",
        )
    # Again: the file system may have changed since the first check (`file_error` then says
    # that `path` is unchanged).
    refuse_special(path, unchanged=False)
    target = os.path.realpath(path)
    os.replace(tmp, target)
    # The rename itself must reach the disk for the new file to survive a crash.
    try:
        dir_fd = os.open(os.path.dirname(target), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:  # some file systems cannot sync a directory
        pass
    finally:
        os.close(dir_fd)


def file_error(e: Exception, path: str) -> Exception:
    """An OSError of `save`, with the target and the guarantee that it is unchanged."""
    if not isinstance(e, OSError) or type(e).__name__ not in EXCEPTIONS:
        return e
    reason = e.strerror or str(e)
    detail = f" ({e.filename})" if e.filename and e.filename != path else ""
    out = type(e)(f"cannot save {path!r}: {reason}{detail}; {path!r} is unchanged")
    out.errno = e.errno
    return out


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
