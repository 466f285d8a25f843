"""Which cache folder and files a compiled handler may be loaded from: only its owner's.

A library in the cache is run (its constructors, then its handlers) inside this process, so
whoever can write the cache folder can run code as this user (issue 57: a library planted in a
folder of mode 777, or owned by another user, ran inside root's process; its `.sha256` record
was no check, since the same person could write it too).  The rule is ssh's StrictModes and
pip's cache rule:

* the folder, and each file that is read from it (the library, its record, the lock), must be
  owned by this user (`os.geteuid()`) or by root, and not be writable by its group or others;
* every folder above it must be owned by this user or by root too, and not writable by its
  group or others unless it has the sticky bit (like /tmp: there others cannot rename or
  delete what is ours);
* a file that is a symbolic link is not followed;
* a POSIX ACL (`setfacl`) counts as the mode does: a folder or file whose ACL lets a user or a
  group besides its owner (and the owner's own group) write it breaks the rule, whatever the
  mode says (with an ACL the mode's group bits are the ACL's mask: `drwxrwx---+` can be a
  folder that user nobody may write, issue 68); and so does the cache folder's default ACL,
  which everything made in the folder inherits.  Read from the `system.posix_acl_access` and
  `system.posix_acl_default` extended attributes (Linux), no library needed; a file system
  without ACLs has none to read.

Group write is accepted in one case, as Debian's ssh accepts it: the group is this user's own
(a user private group: named as the user, the user's primary group, no other member), which a
umask of 002 gives to everything its user makes.

Root-owned folders and files are accepted when not running as root (as ssh and pip do): root
can replace anything this process runs (python, libc) anyway, so trusting it adds nothing, and
it lets a site install prebuilt handlers in a read-only folder of its own.

A folder that breaks the rule is not used at all: the caller warns once and keeps its handlers
in `private_folder()` (this user's folder under the temporary folder, made 0700, or a fresh
one when that is not ours either).
"""
from __future__ import annotations

import atexit
import errno
import functools
import grp
import os
import pathlib
import pwd
import shutil
import stat
import struct
import tempfile

__all__ = ["Untrusted", "acl_writers", "file_problem", "folder_problem", "owner_and_mode",
           "private_folder", "trusted_owner", "writable_by_others"]

# POSIX ACLs as Linux keeps them in extended attributes (linux/posix_acl_xattr.h): a version
# (2), then entries of (tag, permissions, user or group id), little-endian.
_ACCESS_ACL, _DEFAULT_ACL = "system.posix_acl_access", "system.posix_acl_default"
_ACL_VERSION = 2
_ACL_USER, _ACL_GROUP_OBJ, _ACL_GROUP, _ACL_MASK, _ACL_OTHER = 0x02, 0x04, 0x08, 0x10, 0x20
_ACL_WRITE = 0x02
# No ACL there: none set, or a file system (or system) without them.
_NO_ACL = {errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


class Untrusted(Exception):
    """A cache folder or file that breaks the rule (the message says which and why)."""


def trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def writable_by_others(st: os.stat_result) -> bool:
    """Whether someone but the owner may write the file or folder `st` describes."""
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and not _own_group(st)))


def _own_group(st: os.stat_result) -> bool:
    """The group of `st` is this user's own (and `st` is this user's): a user private group."""
    return st.st_uid == os.geteuid() and _private_group(st.st_uid, st.st_gid)


@functools.cache  # the list of users can be long (a site's directory): read once per process
def _private_group(uid: int, gid: int) -> bool:
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return (group.gr_gid == user.pw_gid and group.gr_name == user.pw_name
            and set(group.gr_mem) <= {user.pw_name}
            and all(other.pw_uid == uid for other in pwd.getpwall() if other.pw_gid == gid))


def _acl(target: int | str | os.PathLike, name: str) -> list[tuple[int, int, int]] | None:
    """The entries (tag, permissions, id) of the ACL `name` of `target` (a descriptor, or a path
    whose last link is not followed); None where it has none.  A ValueError for an ACL that is
    not in the format above."""
    if not hasattr(os, "getxattr"):
        return None  # not Linux: no ACLs of this kind
    try:
        data = (os.getxattr(target, name) if isinstance(target, int)
                else os.getxattr(target, name, follow_symlinks=False))
    except OSError as e:
        if e.errno in _NO_ACL:
            return None
        raise
    if len(data) < 4 or (len(data) - 4) % 8 or struct.unpack_from("<I", data)[0] != _ACL_VERSION:
        raise ValueError(f"{name}, {len(data)} bytes, in a format that pencilfft cannot read")
    return [struct.unpack_from("<HHI", data, at) for at in range(4, len(data), 8)]


def acl_writers(target: int | str | os.PathLike, st: os.stat_result,
                default: bool = False) -> list[str]:
    """Whom, besides the owner of `st` (the stat of `target`), this user, root and their own
    groups, its POSIX ACL lets write it, in words ([] for nobody, or no ACL): named users and
    groups whose entry has write within the ACL's mask, and the file's group or others where
    the ACL gives them write.  `default`: the folder's default ACL instead, which what is made
    in it gets."""
    try:
        entries = _acl(target, _DEFAULT_ACL if default else _ACCESS_ACL)
    except ValueError as e:  # what it allows cannot be told
        return [f"whoever it names ({e})"]
    if not entries:
        return []
    # The mask bounds the named entries and the group's (all but the owner's and others').
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 0o7)
    writers = []
    for tag, perm, ident in entries:
        if not perm & _ACL_WRITE or (tag != _ACL_OTHER and not mask & _ACL_WRITE):
            continue
        # Entries of this user or root (or their private groups) let no one else in.
        if tag == _ACL_USER and not (trusted_owner(ident) or ident == st.st_uid):
            writers.append(f"user {_user(ident)}")
        elif tag == _ACL_GROUP and not any(_private_group(uid, ident)
                                           for uid in {os.geteuid(), 0}):
            writers.append(f"group {_group(ident)}")
        elif tag == _ACL_GROUP_OBJ and not _own_group(st):
            writers.append(f"its group {_group(st.st_gid)}")
        elif tag == _ACL_OTHER:
            writers.append("others")
    return writers


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def owner_and_mode(st: os.stat_result) -> str:
    return f"owner {_user(st.st_uid)}, mode {stat.filemode(st.st_mode)}"


def file_problem(st: os.stat_result, what: str, target: int | str | os.PathLike) -> str | None:
    """Why a file or folder must not be read from, or None: `st` is the `os.fstat` of what was
    opened (`target`, its descriptor) or the `os.lstat` of `target` (a path), `what` it is in
    words."""
    if not trusted_owner(st.st_uid):
        return (f"{what} is owned by {_user(st.st_uid)}, not by this user "
                f"({_user(os.geteuid())}) or root")
    if writable_by_others(st):
        return f"its group or others can write {what}"
    if writers := acl_writers(target, st):
        return f"its ACL lets {', '.join(writers)} write {what}"
    return None


def _above_problem(folder: pathlib.Path) -> str | None:
    """Why `folder`, holding the cache, lets someone else replace it, or None."""
    for above in (folder, *folder.parents):
        st = os.lstat(above)
        if not trusted_owner(st.st_uid):
            return (f"it lies in {above}, owned by {_user(st.st_uid)} (not this user or root), "
                    f"who can replace it")
        if st.st_mode & stat.S_ISVTX:
            continue  # others may write it, but not rename or delete what is ours (/tmp)
        if writable_by_others(st):
            return (f"it lies in {above}, which its group or others can write without the "
                    f"sticky bit ({owner_and_mode(st)}): they can replace it")
        if writers := acl_writers(above, st):
            return (f"it lies in {above}, whose ACL lets {', '.join(writers)} write it without "
                    f"the sticky bit ({owner_and_mode(st)}): they can replace it")
    return None


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why `folder` (a real path: no symbolic links, `os.path.realpath`) must not be used, or
    None: it or a folder above it breaks the rule."""
    folder = pathlib.Path(folder)
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):  # realpath's answer changed under us: someone swaps links
        return "it became a symbolic link"
    why = file_problem(st, "the folder", folder)
    if why is None and (writers := acl_writers(folder, st, default=True)):
        why = f"its default ACL lets {', '.join(writers)} write what is made in the folder"
    if why is not None:
        return f"{why} ({owner_and_mode(st)})"
    return _above_problem(folder.parent)


def private_folder(avoid: pathlib.Path | None = None) -> pathlib.Path:
    """A folder of this user's only, for a cache that breaks the rule (and for the default
    cache where there is no usable home folder): `<tmp>/pencilfft-<uid>`, made 0700, when it
    follows the rule; else a fresh 0700 folder (`tempfile.mkdtemp`), removed when the process
    ends.  Raises `Untrusted` when even the temporary folder breaks it (a /tmp anyone can
    write without the sticky bit: what is built there could be swapped before it is read)."""
    shared = pathlib.Path(tempfile.gettempdir()).resolve() / f"pencilfft-{os.geteuid()}"
    if shared != avoid:
        try:
            shared.mkdir(mode=0o700, exist_ok=True)
            st = os.lstat(shared)
            if (folder_problem(shared) is None and st.st_uid == os.geteuid()
                    and not st.st_mode & 0o077):
                return shared
        except OSError:
            pass
    return _fresh_folder()


@functools.cache
def _fresh_folder() -> pathlib.Path:
    """One fresh 0700 folder per process (its handlers are rebuilt each time: a last resort)."""
    why = _above_problem(pathlib.Path(tempfile.gettempdir()).resolve())
    if why is not None:
        raise Untrusted(f"the temporary folder {tempfile.gettempdir()} cannot hold a private "
                        f"cache either: {why}")
    folder = pathlib.Path(tempfile.mkdtemp(prefix=f"pencilfft-{os.geteuid()}-")).resolve()
    atexit.register(shutil.rmtree, folder, True)
    return folder
