"""Reading and writing files that someone else may have made: the config, a resume file,
an export's target. Stdlib only; shared by the config loader, the hooks and the CLI.

* :func:`read_regular` refuses what is not a regular file (a FIFO would hang the reader,
  a device would never end) and what is larger than a cap, without reading it.
* :func:`untrusted` is sshd's StrictModes rule for files that choose what root runs (the
  config, credentials, programs): nobody but root or us may own or change the file or
  any directory above it.
* :func:`write_atomic` writes a new file under a name nobody can have planted (mkstemp in
  the target directory, created exclusively, never through a symlink) and renames it into
  place, so a half-written file never takes the target's name.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class FileRefused(OSError):
    """The file is not something to read: not regular, or too large. The message says."""


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: not a regular file")
        if st.st_size > limit:
            raise FileRefused(f"{path}: {st.st_size} bytes, over the limit of {limit}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise FileRefused(f"{path}: over the limit of {limit} bytes")
    return b"".join(chunks)


def not_private(mode: int) -> str | None:
    """Why a secret file of ``mode`` is not private to its owner (None if it is): any
    permission for its group or for others. The rule for credentials of every kind."""
    if mode & 0o077:
        return f"is mode {stat.S_IMODE(mode):04o}; only its owner may read it (chmod 600)"
    return None


def untrusted(path: str | os.PathLike[str], uids: frozenset[int] | None = None) -> str | None:
    """Why someone other than root or us could change what ``path`` holds (None if
    nobody can): the file (symlinks resolved) and every directory above it must be owned
    by root or by us (``uids``) and writable by no one else, by neither group (unless the
    group is root's) nor others. A directory that is root's and sticky (/tmp) is fine
    above it: others may write there, but cannot replace what is not theirs."""
    uids = frozenset({0, os.geteuid()}) if uids is None else uids
    real = Path(os.path.realpath(path))
    for p in (real, *real.parents):
        try:
            st = os.stat(p)
        except OSError as exc:
            return f"{p}: {exc.strerror}"
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in uids:
            return f"{p} is owned by {_user(st.st_uid)}, not by root"
        writers = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
        if not writers:
            continue
        if p != real and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and not st.st_uid:
            continue
        who = "anyone" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{p} is writable by {who} (mode {mode:04o}; chmod go-w)"
    return None


def _user(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def ensure_mode(path: str | os.PathLike[str], mode: int, gid: int | None = None) -> None:
    """Create the file ``path`` with ``mode`` (and group ``gid``) if it is missing, never
    through a symlink and whatever the umask; give an existing one ``mode`` and ``gid``
    where we may (:func:`share`).

    An existing file is never opened: closing any descriptor of a file drops every
    POSIX lock this process holds on it, and SQLite's locks on a database (and on its
    -shm) are such locks. A process that has the database open must not lose them."""
    if not create_new(path, mode, gid):
        share(path, mode, gid)


def create_new(path: str | os.PathLike[str], mode: int, gid: int | None = None) -> bool:
    """Create the empty file ``path`` with exactly ``mode`` (and group ``gid`` if we are
    root), exclusively and never through a symlink; False if it exists (left untouched)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        return False
    try:
        if gid is not None and os.geteuid() == 0:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return True


def gid_of(group: str) -> int | None:
    """The id of ``group`` on this host; None if there is no such group."""
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def share(path: str | os.PathLike[str], mode: int, gid: int | None = None) -> None:
    """Give ``path`` (a file or directory; a symlink is left alone) ``mode`` and group
    ``gid`` where we may: we own it, or are root. By path, never by opening it (see
    :func:`ensure_mode`)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or os.geteuid() not in (0, st.st_uid):
        return
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


@contextlib.contextmanager
def write_atomic(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[IO[str]]:
    """A text file that replaces ``path`` once the block ends without an error (and is
    removed if it does not). Raises OSError for a missing or unwritable directory."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", newline="") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
