"""What ``slurm-burst status`` shows and what the live instances cost, from the state
store alone (no Slurm, no cloud call): usable when the daemon is down."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from slurm_burst.config import Config, Fleet
from slurm_burst.core.nodestate import LIVE, NodeState
from slurm_burst.core.pricing import dollars
from slurm_burst.core.reconcile import Tracked, summarize
from slurm_burst.ports import NodeStore


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
        if not r.instance_id or r.state not in LIVE or r.state == NodeState.FAILED:
            continue
        minute = int((r.requested_at or r.state_since) // 60)
        out[r.group] = out.get(r.group, 0) + price(r.size, gpus_of.get(r.group, 0), minute)
    return out


def status(cfg: Config, store: NodeStore, now: float, leader: str | None = None) -> dict[str, Any]:
    """What ``slurm-burst status`` shows, from the state database alone."""
    beat = store.heartbeat()
    records = store.nodes()
    groups = store.groups()
    last = store.last_pass()
    followers = {
        k: v
        for k, v in store.followers().items()
        if now - float(v.get("at", 0)) < cfg.daemon.heartbeat_stale
    }
    age = None if beat is None else now - float(beat["at"])
    spend = spend_rate(cfg.fleet, records)
    return {
        "daemon": {
            "running": age is not None and age < cfg.daemon.heartbeat_stale,
            "heartbeat_age": age,
            "pid": None if beat is None else beat.get("pid"),
            "node_id": None if beat is None else beat.get("node_id"),
            "in_flight": None if beat is None else beat.get("in_flight"),
        },
        "leader": leader if leader is not None else (beat or {}).get("node_id"),
        "followers": sorted(followers),
        "last_pass": last,
        "nodes": summarize(records),
        "protected_groups": {
            name: {"until": g.protected_until, "reason": g.reason, "failures": g.failures}
            for name, g in groups.items()
            if g.protected(now)
        },
        "launch_failures_in_a_row": {n: g.failures for n, g in groups.items() if g.failures},
        "unavailable_sizes": [
            {"provider": p, "size": z, "until": until, "code": code}
            for (p, z), (until, code) in sorted(store.unavailable(now).items())
        ],
        "spend_per_hour": {g: float(dollars(v)) for g, v in sorted(spend.items())},
        "spend_per_hour_total": float(dollars(sum(spend.values()))),
    }
