"""The site's side of a stage: a dataset's files, read as this process's user sees them.

What leaves the site is exactly the regular files under the resolved source: a symlink,
a device, a FIFO or a socket in the tree is refused by name (a symlink could reach data
the rules keep home; a FIFO would block the read). Every file is opened one name at a
time from ``/`` with ``O_NOFOLLOW``, so a directory swapped for a symlink after the scan
is refused too, not followed. A directory holding the marker file (``.slurm-burst-onprem-only``
by default: a data owner's way to say "this stays here"), or under one that does, is
:class:`~slurm_burst.core.staging.SensitiveData`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import tempfile
import threading
import weakref
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from slurm_burst.core.staging import (
    MAX_FILES,
    SensitiveData,
    StagingError,
    check_relpath,
    check_src,
)
from slurm_burst.fileio import kind

MARKER = ".slurm-burst-onprem-only"
CHUNK = 1024 * 1024
SAMPLE = 256 * 1024  # bytes of a file compressed to see whether compressing pays
SPOOL_IN_MEMORY = 64 * 1024 * 1024  # a compressed object larger than this spools to disk
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class LocalTree:
    """One push's view of the site's files: a source's directory is opened once and
    kept while this object lives (make one per push)."""

    def __init__(self, marker: str = MARKER, spool_dir: str | None = None) -> None:
        self.marker = marker
        self.spool_dir = spool_dir
        self._roots: dict[str, int] = {}  # resolved source -> its directory, opened once
        self._lock = threading.Lock()
        weakref.finalize(self, _close_all, self._roots)

    def resolve(self, src: str) -> str:
        check_src(src)
        try:
            real = os.path.realpath(src, strict=True)
        except OSError as exc:
            raise StagingError(f"src={src}: {exc.strerror or exc}") from None
        path = real
        while True:  # the source and every directory above it
            if os.path.lexists(os.path.join(path, self.marker)):
                raise SensitiveData(f"{real}: {os.path.join(path, self.marker)} keeps it on-prem")
            if path == "/":
                return real
            path = os.path.dirname(path)

    def real(self, path: str) -> str:
        return os.path.realpath(path)

    def files(self, real_src: str) -> list[tuple[str, int, bool]]:
        st = self._lstat(real_src)
        if stat.S_ISREG(st.st_mode):
            name = os.path.basename(real_src)
            return [(check_relpath(name, real_src), st.st_size, _executable(st.st_mode))]
        if not stat.S_ISDIR(st.st_mode):
            raise StagingError(f"{real_src}: {kind(st.st_mode)}, not a directory or file")
        out: list[tuple[str, int, bool]] = []
        todo = [""]
        while todo:
            rel = todo.pop()
            where = os.path.join(real_src, rel) if rel else real_src
            try:
                with os.scandir(where) as it:
                    entries = list(it)
            except OSError as exc:
                raise StagingError(f"{where}: cannot be listed ({exc.strerror})") from None
            for e in entries:
                path = f"{rel}/{e.name}" if rel else e.name
                if e.name == self.marker:
                    raise SensitiveData(f"{real_src}: {e.path} keeps it on-prem")
                st = self._lstat(e.path)
                if stat.S_ISDIR(st.st_mode):
                    todo.append(path)
                elif stat.S_ISREG(st.st_mode):
                    out.append((check_relpath(path, real_src), st.st_size, _executable(st.st_mode)))
                    if len(out) > MAX_FILES:
                        raise StagingError(f"{real_src}: over {MAX_FILES:,} files")
                else:
                    raise StagingError(
                        f"{e.path}: {kind(st.st_mode)}; a dataset holds regular files only"
                    )
        return sorted(out)

    def digest(self, real_src: str, path: str, size: int) -> str:
        sha, seen = hashlib.sha256(), 0
        with self._open(real_src, path, size) as f:
            while chunk := f.read(CHUNK):
                sha.update(chunk)
                seen += len(chunk)
        self._same_size(real_src, path, size, seen)
        return sha.hexdigest()

    def sample(self, real_src: str, path: str) -> tuple[int, int]:
        with self._open(real_src, path, -1) as f:
            head = f.read(SAMPLE)
        return len(head), len(zlib.compress(head, 1))

    @contextlib.contextmanager
    def body(
        self, real_src: str, path: str, sha256: str, encoding: str
    ) -> Iterator[tuple[BinaryIO, int]]:
        if encoding == "zlib":
            with tempfile.SpooledTemporaryFile(SPOOL_IN_MEMORY, dir=self.spool_dir) as spool:
                sha, squeeze = hashlib.sha256(), zlib.compressobj(1)
                with self._open(real_src, path, -1) as f:
                    while chunk := f.read(CHUNK):
                        sha.update(chunk)
                        spool.write(squeeze.compress(chunk))
                spool.write(squeeze.flush())
                self._unchanged(real_src, path, sha256, sha.hexdigest())
                size = spool.tell()
                spool.seek(0)
                yield spool, size  # type: ignore[misc]
            return
        with self._open(real_src, path, -1) as f:
            size = os.fstat(f.fileno()).st_size
            reader = _Digesting(f)
            yield reader, size  # type: ignore[misc]
            self._unchanged(real_src, path, sha256, reader.sha.hexdigest())

    # -- opening -----------------------------------------------------------------------

    def _open(self, real_src: str, path: str, size: int) -> BinaryIO:
        """``real_src/path`` (or ``real_src`` itself when the dataset is that one file,
        ``path`` its name) opened one name at a time, following no symlink: from ``/``
        to the source once, then from the source's directory."""
        full = os.path.join(real_src, path)
        fd = -1
        try:
            root = self._root(real_src)
            if root < 0:  # a dataset of one file
                fd = _walk(real_src)
                full = real_src
                if path != os.path.basename(real_src):
                    raise StagingError(f"{real_src}: a file, not a directory holding {path}")
            else:
                parts = path.split("/")
                fd = os.open(
                    parts[0], _OPEN | (os.O_DIRECTORY if len(parts) > 1 else 0), dir_fd=root
                )
                for i, name in enumerate(parts[1:], 2):
                    fd = _step(fd, name, os.O_DIRECTORY if i < len(parts) else 0)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StagingError(f"{full}: {kind(st.st_mode)}; a dataset holds only files")
            if size >= 0:
                self._same_size(real_src, path, size, st.st_size)
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb", buffering=0)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            symlink = exc.errno in (errno.ELOOP, errno.ENOTDIR)
            reason = "a symlink or a file on the way" if symlink else exc.strerror
            raise StagingError(f"{full}: cannot be read ({reason})") from None
        except StagingError:
            if fd >= 0:
                os.close(fd)
            raise

    def _root(self, real_src: str) -> int:
        """The source's directory, opened once from ``/`` without following a symlink
        (-1: the source is a file)."""
        with self._lock:
            if real_src not in self._roots:
                fd = _walk(real_src)
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    self._roots[real_src] = fd
                else:
                    os.close(fd)
                    self._roots[real_src] = -1
            return self._roots[real_src]

    @staticmethod
    def _lstat(path: str) -> os.stat_result:
        try:
            return os.lstat(path)
        except OSError as exc:
            raise StagingError(f"{path}: {exc.strerror}") from None

    @staticmethod
    def _same_size(real_src: str, path: str, want: int, got: int) -> None:
        if want != got:
            raise StagingError(
                f"{real_src}: {path} changed while it was staged ({want} -> {got} bytes)"
            )

    @staticmethod
    def _unchanged(real_src: str, path: str, want: str, got: str) -> None:
        if want != got:
            raise StagingError(
                f"{real_src}: {path} changed while it was staged (its SHA-256 differs)"
            )


def _walk(path: str) -> int:
    """``path`` opened one name at a time from ``/``, following no symlink."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in [n for n in path.split("/") if n]:
            fd = _step(fd, name, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def _close_all(fds: dict[str, int]) -> None:
    for fd in fds.values():
        if fd >= 0:
            os.close(fd)
    fds.clear()


def _step(fd: int, name: str, flags: int) -> int:
    """The next name down from directory ``fd``, not followed if a symlink; ``fd`` is
    closed once the next is open (on an error it stays open: the caller closes it)."""
    nxt = os.open(name, _OPEN | flags, dir_fd=fd)
    os.close(fd)
    return nxt


class _Digesting(io.RawIOBase):
    """A file read through, its SHA-256 taken on the way (what was sent is what was hashed)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        return data

    def fileno(self) -> int:
        return self.f.fileno()


def _executable(mode: int) -> bool:
    return bool(mode & stat.S_IXUSR)


MAX_LISTED = 4096  # entries of a directory looked at for links to a kept path


def symlinks_in(directory: str) -> list[tuple[str, str]]:
    """(link, its resolved target) of each symlink directly in ``directory`` (its first
    :data:`MAX_LISTED` entries; [] if it cannot be read): where a kept path may be
    spelled otherwise (``core.staging.path_spellings``)."""
    out = []
    try:
        with os.scandir(directory) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_LISTED:
                    break
                if entry.is_symlink():
                    out.append((entry.path, os.path.realpath(entry.path)))
    except OSError:
        return []
    return out
