"""The fleet's read model: what ``slurm-burst status`` shows and the Prometheus series
export (``services.status.fleet_status`` builds it from the state store). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupView:
    """One node group as status and the metrics show it."""

    name: str
    nodes: Mapping[str, int]  # its records by state
    spend_per_hour: float  # dollars an hour of its live instances (an estimate)
    live: int  # instances it pays for now
    failures: int = 0  # failed launches in a row
    protected_until: float = 0.0  # 0: not protected
    reason: str = ""  # why it is protected
    max_nodes: int | None = None  # its cap (None: none)
    holding: int = 0  # its records that hold a place under the cap

    def protected(self, now: float) -> bool:
        return self.protected_until > now


@dataclass(frozen=True)
class Cooling:
    """A size not tried until ``until``: its provider refused it (``code``)."""

    provider: str
    size: str
    until: float
    code: str


@dataclass(frozen=True)
class FleetStatus:
    """The fleet from the state database: the read model ``slurm-burst status`` and the
    Prometheus series share (``Metrics.fleet``). Every configured group is in ``groups``,
    and any group a record still names (one since removed from the config)."""

    at: float
    groups: Mapping[str, GroupView]
    cooling: tuple[Cooling, ...] = ()

    @property
    def spend_per_hour(self) -> float:
        return sum(g.spend_per_hour for g in self.groups.values())
