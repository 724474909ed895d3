"""An exclusive lock on a state directory, shared by processes (flock on ``<dir>/.lock``)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_burst.fileio import PRIVATE, ensure_dir


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock (creating the directory 0700) for the ``with`` body."""
    ensure_dir(directory, 0o700)
    fd = os.open(directory / ".lock", os.O_WRONLY | os.O_APPEND | os.O_CREAT | PRIVATE, 0o600)
    with os.fdopen(fd, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
