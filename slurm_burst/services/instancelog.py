"""Every instance event of a node into the ledger, priced at the node's launch: one
writer, shared by the launcher (``requested``, a batch in one write) and the provisioner
(``running``, ``joined``, ``terminated``, ``failed``). The ledger port spools what the
database cannot take; a write that fails even so is logged and never stops a node."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from slurm_burst.config import Fleet
from slurm_burst.core.cloud import Instance
from slurm_burst.core.errors import BurstError
from slurm_burst.core.pricing import dollars
from slurm_burst.core.records import NodeRecord
from slurm_burst.core.usage import InstanceEvent
from slurm_burst.ports import Clock, Ledger

log = logging.getLogger(__name__)


class InstanceLog:
    def __init__(self, fleet: Fleet, ledger: Ledger, clock: Clock) -> None:
        self.fleet = fleet
        self.ledger = ledger
        self.clock = clock

    def event(
        self, rec: NodeRecord, instance_id: str, event: str, at: float, detail: str = ""
    ) -> InstanceEvent:
        """An instance event of ``rec``, priced at its launch."""
        group = self.fleet.group_of(rec.name)
        size = rec.size or (group.size_names[0] if group else "")
        launched = datetime.fromtimestamp(rec.requested_at or at, UTC)
        gpus = group.gpus if group else 0
        price = self.fleet.rate_table.price(size, gpus, launched)
        return InstanceEvent(
            node=rec.name,
            instance_id=instance_id,
            event=event,
            at=at,
            provider=rec.provider,
            size=size,
            price_per_hour=float(dollars(price.micros_per_hour)) if price else 0.0,
            detail=detail,
            group=group.name if group else "",
            partition=group.partition if group else "",
            cpus=group.cpus if group else 0,
            gpus=gpus,
            price_source=price.source if price else "none",
            price_version=price.version if price else "",
        )

    def record(
        self, rec: NodeRecord, instance_id: str, event: str, at: float, detail: str = ""
    ) -> None:
        try:
            self.ledger.instance_event(self.event(rec, instance_id, event, at, detail))
        except (BurstError, OSError) as exc:  # the database away and its spool full
            log.error("ledger.write_failed node=%s event=%s error=%s", rec.name, event, exc)

    def launched(self, pairs: Sequence[tuple[NodeRecord, Instance]]) -> None:
        """Nodes given their instances: one ``requested`` event each, in one write."""
        now = self.clock.now()
        evs = [self.event(rec, inst.id, "requested", rec.requested_at or now)
               for rec, inst in pairs]  # fmt: skip
        try:
            self.ledger.instance_events(evs)
        except (BurstError, OSError) as exc:  # the database away and its spool full
            log.error("ledger.write_failed nodes=%d event=requested error=%s", len(evs), exc)
