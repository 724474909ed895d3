"""Files the product acts on come from a writer it trusts: spooled requests (which
launch instances and release nodes), the mesh store's grant key (which mints grants for
every account's data), the config and its drop-ins (which choose what root runs).

sshd's StrictModes is the model: a file is trusted only if it, and every directory
above it, is owned by a trusted user and writable by nobody else. Here that is checked
on the opened descriptor, not on the path: the file is opened without following a link
(relative to its directory's descriptor), and the directories are walked up through
``..`` from that descriptor to ``/``, so nothing renamed or replaced between the check
and the read is read unchecked.

The rule, for the file and each directory above it:

* owned by a trusted uid (root, the daemon's own, and where configured SlurmUser);
* writable by its group only if that group is a trusted gid (root's, SlurmUser's);
* writable by others never, except a directory above the file's own that root owns and
  that is sticky (/tmp): there others cannot replace what is not theirs. The file's own
  directory is never world-writable: anyone could put a file in it.

A refusal is :class:`UntrustedFile` (a ``FileRefused``: code ``UntrustedFile``, exit 2)
naming the file or directory, its owner or mode, and what to do.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from slurm_burst.fileio import (
    PRIVATE,
    FileRefused,
    gid_of,
    plain,
    read_fd,
    uid_of,
    user_name,
)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UntrustedFile(FileRefused):
    """A file the product would act on, written or writable by someone it does not
    trust; never read, never acted on."""

    code = "UntrustedFile"


@dataclass(frozen=True)
class Writers:
    """Who may have written what is read: owners (uids) and groups (gids)."""

    uids: frozenset[int]
    gids: frozenset[int] = frozenset({0})

    @classmethod
    def us(cls, *, user: str = "", group: str = "") -> Writers:
        """Root and this process's user; and ``user`` and ``group`` (SlurmUser's, for
        what the hooks write) where this host has them."""
        uids, gids = {0, os.geteuid()}, {0}
        if user:
            uid = uid_of(user)
            if uid is not None:
                uids.add(uid)
        if group:
            gid = gid_of(group)
            if gid is not None:
                gids.add(gid)
        return cls(frozenset(uids), frozenset(gids))

    def refuses(self, st: os.stat_result, *, own_dir: bool = False) -> str | None:
        """Why ``st`` (a file, or a directory above one) is not trusted; None if it is."""
        mode = f"mode {stat.S_IMODE(st.st_mode):04o}"
        if st.st_uid not in self.uids:
            return f"is owned by {user_name(st.st_uid)}, whom slurm-burst does not trust"
        if st.st_mode & stat.S_IWOTH:
            shared = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
            if own_dir or not shared:
                return f"is writable by anyone ({mode}; chmod o-w)"
        if st.st_mode & stat.S_IWGRP and st.st_gid not in self.gids:
            return f"is writable by group {group_name(st.st_gid)} ({mode}; chmod g-w)"
        return None


def group_name(gid: int) -> str:
    import grp

    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def open_trusted(path: str | os.PathLike[str], writers: Writers) -> int:
    """A read-only descriptor of the plain file ``path`` (one name, no link followed at
    its last component) if it and every directory above it pass ``writers``' rule;
    :class:`UntrustedFile` (or another ``FileRefused``) naming what does not. OSError
    as ``open`` gives it (FileNotFoundError...)."""
    fd, why = open_checked(path, writers)
    if why:
        os.close(fd)
        raise UntrustedFile(f"{why}; slurm-burst does not act on it")
    return fd


def open_checked(
    path: str | os.PathLike[str], writers: Writers, *, follow: bool = False
) -> tuple[int, str | None]:
    """A read-only descriptor of the plain file ``path`` and why it is not trusted (None
    if it is), for a reader that reports every problem of what it read (the config).
    ``follow``: ``path`` may be a symlink (a config an admin links into /etc): the file
    it leads to is opened, a regular file with any number of names, and its own
    directories are the ones checked."""
    where = os.path.realpath(path) if follow else os.path.abspath(path)
    parent, name = os.path.split(where)
    dfd = os.open(parent, _DIR)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | PRIVATE, dir_fd=dfd)
        given = False
        try:
            st = os.fstat(fd)
            if not follow:
                plain(where, st)
            elif not stat.S_ISREG(st.st_mode):
                raise FileRefused(f"{path}: not a regular file")
            why = writers.refuses(st)
            why = f"{where} {why}" if why else _above(dfd, parent, writers)
            given = True
            return fd, why
        finally:
            if not given:  # refused, or an error reading it: the descriptor is not handed out
                os.close(fd)
    finally:
        os.close(dfd)


def _above(dfd: int, parent: str, writers: Writers) -> str | None:
    """Walk from the directory ``dfd`` up to ``/`` through ``..``: why one of them is
    not trusted, or None."""
    fd = os.dup(dfd)
    shown, own = os.path.realpath(parent), True
    try:
        while True:
            st = os.fstat(fd)
            why = writers.refuses(st, own_dir=own)
            if why:
                return f"the directory {shown} {why}"
            up = os.open("..", _DIR, dir_fd=fd)
            above = os.fstat(up)
            if (above.st_dev, above.st_ino) == (st.st_dev, st.st_ino):  # "/"
                os.close(up)
                return None
            os.close(fd)
            fd, shown, own = up, os.path.dirname(shown) or "/", False
    finally:
        os.close(fd)


def read_checked(
    path: str | os.PathLike[str], writers: Writers, limit: int, *, follow: bool = False
) -> tuple[bytes, str | None]:
    """The bytes of ``path`` (at most ``limit``: FileRefused over it) and why it is not
    trusted (None if it is), both from one descriptor (``follow``: as open_checked)."""
    fd, why = open_checked(path, writers, follow=follow)
    try:
        return read_fd(fd, path, limit, os.fstat(fd).st_size), why
    finally:
        os.close(fd)


def read_trusted(path: str | os.PathLike[str], writers: Writers, limit: int) -> bytes:
    """The bytes of ``path`` (at most ``limit``) if :func:`open_checked` trusts it;
    :class:`UntrustedFile` otherwise."""
    data, why = read_checked(path, writers, limit)
    if why:
        raise UntrustedFile(f"{why}; slurm-burst does not act on it")
    return data
