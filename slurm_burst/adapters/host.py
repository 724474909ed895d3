"""The daemon's process on its host (ports.DaemonHost): an exclusive lock on the state
directory, and the wake-up socket the hooks write to."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path

from slurm_burst.adapters.proc import release_free_memory
from slurm_burst.core.errors import DaemonError
from slurm_burst.fileio import PRIVATE, FileRefused, ensure_dir


class LocalHost:
    def __init__(self, state_dir: str, socket_path: str, lock_name: str, group: int | None) -> None:
        self.state = Path(state_dir)
        self.socket_path = Path(socket_path)
        self.lock_name = lock_name  # daemon.lock, or daemon.<node_id>.lock with HA
        self.group = group  # SlurmUser's gid: its hooks wake the daemon through the socket
        self._lockfile: int | None = None
        self._sock: socket.socket | None = None

    def acquire(self) -> None:
        """One daemon per host: an exclusive lock on the state directory.

        With HA each daemon has its own lock file, so two daemons may share a state
        directory on shared storage; the election decides which one acts.
        """
        try:  # its mode: the state store's
            ensure_dir(self.state, 0o770, self.group, "daemon.state_dir")
        except FileRefused as exc:
            raise DaemonError(str(exc)) from None
        path = self.state / self.lock_name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | PRIVATE, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DaemonError(f"another slurm-burst daemon holds {path}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lockfile = fd

    def open(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(path))
        os.chmod(path, 0o660)  # the hooks run as SlurmUser: give its group access
        if self.group is not None:
            os.chown(path, -1, self.group)
        self._sock = sock

    def wait(self, timeout: float) -> None:
        assert self._sock is not None, "open() first"
        self._sock.settimeout(timeout)
        try:
            self._sock.recv(64)
            self._sock.setblocking(False)
            while True:  # drain a burst of wake-ups
                self._sock.recv(64)
        except (TimeoutError, BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    def release_memory(self) -> None:
        release_free_memory()
