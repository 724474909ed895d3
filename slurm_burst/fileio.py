"""Reading and writing files that someone else may have made: the config, a resume file,
an export's target. Stdlib only; shared by the config loader, the hooks and the CLI.

* :func:`read_regular` refuses what is not a regular file (a FIFO would hang the reader,
  a device would never end) and what is larger than a cap, without reading it.
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
