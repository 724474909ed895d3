"""A pass run every so many seconds until ``stop`` is set: the leader's background loops."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from slurm_burst.ports import Clock

log = logging.getLogger(__name__)


def every(
    seconds: float, stop: threading.Event, clock: Clock, step: Callable[[], object], what: str
) -> None:
    """Run ``step`` now and then every ``seconds`` (counted from each start) until
    ``stop``; a pass that raises is logged as ``<what>_failed`` and the next one runs."""
    while not stop.is_set():
        started = clock.monotonic()
        try:
            step()
        except Exception:
            log.exception("%s_failed", what)
        stop.wait(max(0.0, seconds - (clock.monotonic() - started)))
