"""The fleet's read model: what ``slurm-burst status`` shows and the Prometheus series
export (nodes by state, spend, protected mode, caps), from the state store alone (no
Slurm, no cloud call): usable when the daemon is down."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from slurm_burst.config import Config, Fleet
from slurm_burst.core.cap import holds_instance
from slurm_burst.core.fleetstatus import Cooling, FleetStatus, GroupView
from slurm_burst.core.nodestate import LIVE, NodeState
from slurm_burst.core.pricing import dollars
from slurm_burst.core.reconcile import Tracked, summarize
from slurm_burst.core.records import GroupHealth
from slurm_burst.ports import NodeStore


def pays_for(r: Tracked) -> bool:
    """Whether the record's instance is one the site pays for now."""
    return bool(r.instance_id) and r.state in LIVE and r.state != NodeState.FAILED


def spend_rate(fleet: Fleet, records: Iterable[Tracked]) -> dict[str, int]:
    """Micro-dollars per hour of the instances live now, by group.

    An estimate for status and metrics (the ledger prices each instance exactly):
    prices are looked up once per size and launch minute.
    """
    table = fleet.rate_table
    gpus_of = {name: g.gpus for name, g in fleet.node_groups.items()}

    @lru_cache(maxsize=4096)
    def price(size: str, gpus: int, minute: int) -> int:
        p = table.price(size, gpus, datetime.fromtimestamp(minute * 60, UTC))
        return 0 if p is None else p.micros_per_hour

    out: dict[str, int] = {}
    for r in records:
        if not pays_for(r):
            continue
        minute = int((r.requested_at or r.state_since) // 60)
        out[r.group] = out.get(r.group, 0) + price(r.size, gpus_of.get(r.group, 0), minute)
    return out


def fleet_status(
    fleet: Fleet,
    records: Sequence[Tracked],
    health: Mapping[str, GroupHealth],
    now: float,
    cooling: Mapping[tuple[str, str], tuple[float, str]] | None = None,
) -> FleetStatus:
    by_group = summarize(records)
    spend = spend_rate(fleet, records)
    live: dict[str, int] = {}
    held: dict[str, int] = {}
    for r in records:
        if pays_for(r):
            live[r.group] = live.get(r.group, 0) + 1
        if holds_instance(r.state):
            held[r.group] = held.get(r.group, 0) + 1
    names = list(fleet.node_groups) + sorted(set(by_group) - set(fleet.node_groups))
    groups = {}
    for name in names:
        h = health.get(name)
        g = fleet.node_groups.get(name)
        groups[name] = GroupView(
            name=name,
            nodes=dict(by_group.get(name, {})),
            spend_per_hour=float(dollars(spend.get(name, 0))),
            live=live.get(name, 0),
            failures=h.failures if h is not None else 0,
            protected_until=h.protected_until if h is not None else 0.0,
            reason=h.reason if h is not None else "",
            max_nodes=g.max_nodes if g is not None else None,
            holding=held.get(name, 0),
        )
    cools = tuple(
        Cooling(p, z, until, code) for (p, z), (until, code) in sorted((cooling or {}).items())
    )
    return FleetStatus(now, groups, cools)


@dataclass(frozen=True)
class DaemonView:
    running: bool  # its heartbeat is fresh
    heartbeat_age: float | None  # seconds; None: it never ran
    pid: int | None = None
    node_id: str | None = None
    in_flight: int | None = None  # nodes its workers hold


@dataclass(frozen=True)
class Status:
    """What ``slurm-burst status`` shows."""

    daemon: DaemonView
    leader: str | None
    followers: tuple[str, ...]
    last_pass: Mapping[str, Any] | None  # the last reconcile pass's report
    fleet: FleetStatus

    def doc(self) -> dict[str, Any]:
        """``status --json``."""
        f = self.fleet
        now = f.at
        return {
            "daemon": asdict(self.daemon),
            "leader": self.leader,
            "followers": list(self.followers),
            "last_pass": dict(self.last_pass) if self.last_pass is not None else None,
            "nodes": {n: dict(g.nodes) for n, g in f.groups.items() if g.nodes},
            "protected_groups": {
                n: {"until": g.protected_until, "reason": g.reason, "failures": g.failures}
                for n, g in f.groups.items()
                if g.protected(now)
            },
            "launch_failures_in_a_row": {n: g.failures for n, g in f.groups.items() if g.failures},
            "unavailable_sizes": [asdict(c) for c in f.cooling],
            "caps": {
                n: {"max_nodes": g.max_nodes, "holding": g.holding}
                for n, g in f.groups.items()
                if g.max_nodes is not None
            },
            "spend_per_hour": {n: g.spend_per_hour for n, g in sorted(f.groups.items()) if g.live},
            "spend_per_hour_total": f.spend_per_hour,
        }


def status(cfg: Config, store: NodeStore, now: float, leader: str | None = None) -> Status:
    """What ``slurm-burst status`` shows, from the state database alone."""
    beat = store.heartbeat()
    stale = cfg.daemon.heartbeat_stale
    followers = sorted(
        k for k, v in store.followers().items() if now - float(v.get("at", 0)) < stale
    )
    age = None if beat is None else now - float(beat["at"])
    b = beat or {}
    daemon = DaemonView(age is not None and age < stale, age, b.get("pid"), b.get("node_id"),
                        b.get("in_flight"))  # fmt: skip
    fleet = fleet_status(cfg.fleet, store.nodes(), store.groups(), now, store.unavailable(now))
    return Status(
        daemon, leader if leader is not None else b.get("node_id"), tuple(followers),
        store.last_pass(), fleet,
    )  # fmt: skip
