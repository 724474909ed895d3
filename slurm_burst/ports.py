"""The ports: what services need from the outside world, as Protocols.

Adapters implement them; services receive them through their constructors
(see ``slurm_burst.wiring``). Nothing in ``core`` or the services imports an
adapter's libraries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from slurm_burst.core.slurm import SlurmJob, SlurmNode, SlurmPartition


class Scheduler(Protocol):
    """Slurm, as the daemon sees it."""

    def nodes(self) -> list[SlurmNode]: ...

    def jobs(self) -> list[SlurmJob]: ...

    def partitions(self) -> list[SlurmPartition]: ...

    def ping(self) -> bool: ...

    def update_nodes(
        self,
        names: Sequence[str],
        *,
        state: str | None = None,
        reason: str | None = None,
        addrs: Sequence[str] | None = None,
        hostnames: Sequence[str] | None = None,
    ) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
