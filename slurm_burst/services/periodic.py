"""The daemon's loop boundaries: a pass run every so many seconds until ``stop`` is set
(the leader's background loops), and :func:`contain`, the one way a thread or a loop
keeps going past an error no port declares.

Everything a port raises derives from ``BurstError`` and is handled where it is met. What
reaches a boundary is a defect or a library's surprise: it must not end the daemon, and
it must not pass unseen, so it is logged with its code and traceback and counted in
``slurm_burst_contained_errors_total{where,code}`` (docs/architecture.md lists the
boundaries).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from slurm_burst.core.errors import BurstError
from slurm_burst.ports import Clock, Metrics

log = logging.getLogger(__name__)


def contain(where: str, exc: Exception, metrics: Metrics | None) -> None:
    """Say that the boundary ``where`` (an event name, ``reconcile.pass``) stopped
    ``exc``: logged as ``<where>_failed`` with its code and traceback, and counted."""
    code = exc.code if isinstance(exc, BurstError) else type(exc).__name__
    log.error("%s_failed code=%s error=%s", where, code, exc, exc_info=exc)
    if metrics is not None:
        metrics.contained(where, code)


def every(
    seconds: float,
    stop: threading.Event,
    clock: Clock,
    step: Callable[[], object],
    what: str,
    metrics: Metrics | None = None,
) -> None:
    """Run ``step`` now and then every ``seconds`` (counted from each start) until
    ``stop``; a pass that raises is contained as ``what`` and the next one runs."""
    while not stop.is_set():
        started = clock.monotonic()
        try:
            step()
        except Exception as exc:  # boundary: the loop outlives one pass
            contain(what, exc, metrics)
        stop.wait(max(0.0, seconds - (clock.monotonic() - started)))
