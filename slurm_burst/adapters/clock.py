"""The Clock port on the real clock."""

from __future__ import annotations

import time


class SystemClock:
    """Wall time for records, ``time.monotonic`` for deadlines, and a real sleep."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
