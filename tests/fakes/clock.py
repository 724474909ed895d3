"""A clock whose sleep advances time at once: waits of minutes take microseconds."""

from __future__ import annotations

import threading
import time


class FakeClock:
    """The Clock port. ``now`` starts at a fixed instant; ``sleep`` moves both clocks on."""

    def __init__(self, start: float = 1_790_000_000.0) -> None:
        self._start = start
        self._elapsed = 0.0
        self._lock = threading.Lock()
        self.slept = 0.0

    def now(self) -> float:
        with self._lock:
            return self._start + self._elapsed

    def monotonic(self) -> float:
        with self._lock:
            return self._elapsed

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        time.sleep(0)  # let other threads run, as a real sleep would

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._elapsed += seconds
            self.slept += seconds
