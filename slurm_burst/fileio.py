"""Reading and writing files that someone else may have made: the config, a resume file,
an export's target. Stdlib only; shared by the config loader, the hooks and the CLI.

* :func:`read_regular` refuses what is not a regular file (a FIFO would hang the reader,
  a device would never end) and what is larger than a cap, without reading it.
* :func:`untrusted` is sshd's StrictModes rule for files that choose what root runs (the
  config, credentials, programs): nobody but root or us may own or change the file or
  any directory above it.
* :func:`write_atomic` writes a new file under a name nobody can have planted (mkstemp in
  the target directory, created exclusively, never through a symlink) and renames it into
  place, so a half-written file never takes the target's name; it replaces only a
  regular file (a device, FIFO or symlink at the target is refused, not replaced).
* :func:`ensure_dir`, :func:`create_new`, :func:`check_sqlite_files` and
  :func:`open_append` are how the product makes its directories, its databases and its
  logs, as root too: created with their mode, or checked and left as they are. Nothing
  is followed through a symlink it did not make, nothing that is not a plain file is
  written, and the mode of nothing it did not create is changed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from slurm_burst.core.errors import BadInput

# Flags of every file the product opens to write: never through a symlink, never a
# terminal that could become ours, never inherited by a child.
PRIVATE = os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


class FileRefused(BadInput, OSError):
    """The file is not something to read: not regular, or too large. The message says."""

    code = "FileRefused"


def read_regular(path: str | os.PathLike[str], limit: int, *, head: bool = False) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; with
    ``head``, its first ``limit`` bytes whatever its size."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: not a regular file")
        if head:
            return os.read(fd, limit)  # a regular file gives what it has, up to limit
        return read_fd(fd, path, limit, st.st_size)
    finally:
        os.close(fd)


def read_fd(fd: int, path: str | os.PathLike[str], limit: int, size: int) -> bytes:
    """What the open regular file ``fd`` (of ``size`` bytes, by its fstat) holds, if at
    most ``limit`` bytes: FileRefused otherwise (it may grow while it is read)."""
    if size > limit:
        raise FileRefused(f"{path}: {size} bytes, over the limit of {limit}")
    chunks, got = [], 0
    while got <= limit:
        chunk = os.read(fd, limit + 1 - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > limit:
        raise FileRefused(f"{path}: over the limit of {limit} bytes")
    return b"".join(chunks)


def file_error(exc: OSError) -> str:
    """One line saying what went wrong with a file: the refusal's own words, else the
    file's name and the system's error text (no errno, no traceback)."""
    if isinstance(exc, FileRefused) or not exc.strerror:
        return str(exc)
    return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror


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
            return f"{p} is owned by {user_name(st.st_uid)}, not by root"
        writers = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
        if not writers:
            continue
        if p != real and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and not st.st_uid:
            continue
        who = "anyone" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{p} is writable by {who} (mode {mode:04o}; chmod go-w)"
    return None


def user_name(uid: int) -> str:
    """``user NAME (uid N)``, or ``uid N`` where this host has no such user."""
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def plain(path: str | os.PathLike[str], st: os.stat_result) -> None:
    """FileRefused unless ``st`` (an lstat or fstat) is a regular file with one name:
    what a file of ours is. A symlink, a device, a FIFO or a hard link to another file
    is something someone planted, or a mistake; either way not ours to write."""
    if stat.S_ISLNK(st.st_mode):
        raise FileRefused(f"{path} is a symbolic link; slurm-burst follows none it did not make")
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{path} is {kind(st.st_mode)}, not a regular file")
    if st.st_nlink > 1:
        raise FileRefused(f"{path} has {st.st_nlink} hard links; a file of ours has one")


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file"


def ensure_dir(
    path: str | os.PathLike[str], mode: int, gid: int | None = None, what: str = "directory"
) -> bool:
    """Make the directory ``path`` with exactly ``mode`` and group ``gid`` (True), or
    check the one that is there (False) without changing it: a directory (a symlink to
    one only if root owns the link), writable by no others, and, with ``gid``, by no
    group but root's and ``gid``'s. A shared directory such as /tmp (1777) is refused:
    anyone could plant names in it. FileRefused says what is wrong and what to do."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(p, 0o700)  # nobody else's until its mode and group are set
        except FileExistsError:
            st = os.lstat(p)  # made meanwhile by another process: checked below
        else:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _give(fd, mode, gid)
            finally:
                os.close(fd)
            return True
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid != 0:
            raise FileRefused(f"{what} {p} is a symbolic link that root does not own")
        st = os.stat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise FileRefused(f"{what} {p} is {kind(st.st_mode)}, not a directory")
    shown = f"mode {stat.S_IMODE(st.st_mode):04o}"
    if st.st_mode & stat.S_IWOTH:
        raise FileRefused(
            f"{what} {p} is writable by anyone ({shown}): slurm-burst keeps its files in a "
            f"directory of its own (make one, mode {mode:04o})"
        )
    if gid is not None and st.st_mode & stat.S_IWGRP and st.st_gid not in (0, gid):
        raise FileRefused(f"{what} {p} is writable by group {st.st_gid} ({shown}; chmod g-w)")
    return False


def check_sqlite_files(path: str | os.PathLike[str]) -> None:
    """FileRefused unless the SQLite database ``path`` and its journal files, where they
    exist, are plain files (:func:`plain`): checked before SQLite opens anything, since
    SQLite reads through a planted link (and writes a database into it)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        name = f"{os.fspath(path)}{suffix}"
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        plain(name, st)


def open_append(path: str | os.PathLike[str], mode: int, gid: int | None = None) -> int:
    """A descriptor appending to the log file ``path``: made with ``mode`` and ``gid``
    if missing, else the plain file that is there, unchanged. Never through a symlink,
    never a device or a FIFO (opened non-blocking: a FIFO cannot hang us), never a
    controlling terminal."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # link, FIFO, directory
                plain(path, os.lstat(path))
            raise
        try:
            plain(path, os.fstat(fd))
        except FileRefused:
            os.close(fd)
            raise
        return fd
    _give(fd, mode, gid)
    return fd


def create_new(path: str | os.PathLike[str], mode: int, gid: int | None = None) -> bool:
    """Create the empty file ``path`` with exactly ``mode`` (and group ``gid`` if we are
    root), exclusively and never through a symlink; False if it exists (left untouched)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        return False
    try:
        _give(fd, mode, gid)
    finally:
        os.close(fd)
    return True


def _give(fd: int, mode: int, gid: int | None) -> None:
    """What we just made gets exactly ``mode`` (whatever the umask) and, if we are root,
    group ``gid``: through its descriptor, so nothing planted can take its place."""
    if gid is not None and os.geteuid() == 0:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, mode)


def write_durable(directory: Path, name: str, body: bytes, mode: int) -> Path:
    """``directory/name`` holding ``body``, durable when this returns: written under a
    temporary name made exclusively (never through a link), fsynced, renamed into place,
    and the directory fsynced. A crash leaves the whole file or none under ``name``."""
    tmp = directory / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | PRIVATE, mode)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    path = directory / name
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def uid_of(user: str) -> int | None:
    """The id of ``user`` on this host; None if there is no such user."""
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def gid_of(group: str) -> int | None:
    """The id of ``group`` on this host; None if there is no such group."""
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def share(path: str | os.PathLike[str], mode: int, gid: int | None = None) -> None:
    """Give the plain file ``path`` that we (SQLite, for us) just made ``mode`` and group
    ``gid`` where we may: we own it, or are root. By path, never by opening it: closing
    any descriptor of a file drops every POSIX lock this process holds on it, SQLite's
    among them. Anything but a plain file is refused (:func:`plain`)."""
    st = os.lstat(path)
    plain(path, st)
    if os.geteuid() not in (0, st.st_uid):
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
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(target)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):  # a device stays one
            raise FileRefused(
                f"{target} is {kind(st.st_mode)}: slurm-burst replaces only regular files "
                "(give another path, or '-' where standard output is offered)"
            )
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
