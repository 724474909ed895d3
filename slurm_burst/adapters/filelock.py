"""An exclusive lock on a state directory, shared by processes (flock on ``<dir>/.lock``)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock (creating the directory 0700) for the ``with`` body."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
