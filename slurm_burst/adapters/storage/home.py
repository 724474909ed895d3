"""Where a job's outputs land on-prem: a stored version made to appear at its path whole.

Run as the job's user (``slurm-burst stage promote --as-user``): the files are theirs,
and a path they could not write to fails as it would for them. A version is written
into a work directory beside its destination (``.<name>.slurm-burst-<random>``, 0700),
then swapped with the destination in one ``renameat2(RENAME_EXCHANGE)``: a reader sees
the old tree or the new one, never a mix. Where the filesystem cannot exchange (NFS,
some FUSE), the old tree is renamed aside and the new one into place: for a moment the
path is missing, never half-written. The old tree is then removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import secrets
import shutil
import stat
from typing import BinaryIO

from slurm_burst.core.staging import StagingError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


class LocalHome:
    def begin(self, home: str) -> str:
        parent, name = os.path.split(home)
        try:
            st = os.stat(parent)
        except OSError as exc:
            raise StagingError(f"{home}: its directory {parent}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise StagingError(f"{home}: {parent} is not a directory")
        work = os.path.join(parent, f".{name}.slurm-burst-{secrets.token_hex(6)}")
        try:
            os.mkdir(work, 0o700)
        except OSError as exc:
            raise StagingError(f"{home}: cannot write in {parent}: {exc.strerror}") from None
        return work

    def open_file(self, work: str, path: str, executable: bool) -> BinaryIO:
        """A new file ``path`` (relative, checked by the manifest) under ``work``; its
        directories made 0755. The file is 0644 (0755 if ``executable``) less the umask."""
        parts = path.split("/")
        where = work
        for part in parts[:-1]:
            where = os.path.join(where, part)
            with contextlib.suppress(FileExistsError):
                os.mkdir(where, 0o755)
        mode = 0o755 if executable else 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.fdopen(os.open(os.path.join(work, *parts), flags, mode), "wb")

    def finish(self, work: str, home: str) -> bool:
        """``work`` becomes ``home``; True if it was one exchange (or ``home`` was new)."""
        os.chmod(work, 0o755)  # noqa: S103 (a directory as mkdir makes it under umask 022)
        if not os.path.lexists(home):
            os.rename(work, home)
            return True
        if _exchange(work, home):
            _remove_tree(work)  # now the old tree
            return True
        old = f"{work}.old"
        os.rename(home, old)
        os.rename(work, home)
        _remove_tree(old)
        return False

    def abandon(self, work: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            _remove_tree(work)


def _exchange(a: str, b: str) -> bool:
    if _renameat2 is None:
        return False
    rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # the filesystem cannot exchange: rename aside instead
    raise OSError(err, os.strerror(err), b)


def _remove_tree(path: str) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    shutil.rmtree(path)
