"""The daemon's host (ports.DaemonHost) in memory: the lock, wake-ups and heap releases
counted, a wait that returns at once unless told to block."""

from __future__ import annotations

from slurm_burst.core.errors import DaemonError


class FakeHost:
    def __init__(self) -> None:
        self.held = False
        self.taken = False  # another daemon holds the lock
        self.opened = 0
        self.waits: list[float] = []
        self.released = 0
        self.closed = 0

    def acquire(self) -> None:
        if self.taken:
            raise DaemonError("another slurm-burst daemon holds daemon.lock")
        self.held = True

    def open(self) -> None:
        self.opened += 1

    def wait(self, timeout: float) -> None:
        self.waits.append(timeout)

    def close(self) -> None:
        self.closed += 1

    def release_memory(self) -> None:
        self.released += 1
