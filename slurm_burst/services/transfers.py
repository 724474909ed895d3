"""What each dataset transfer cost, into the ledger and the metrics.

Staging calls this once a transfer is over: a push to a store (``in``: the daemon's for a
job, or an admin's ``stage push``), a node's pull (``pull``: part of its join), a job's
outputs brought home (``out``: a stage-out's promotion), a move that failed. The row's
price is the store's for that direction (``upload_per_gb``, ``download_per_gb``,
``egress_per_gb`` of ``[stores.NAME]``). Storage is charged for the time it is held,
by ``stage gc`` (:meth:`StorageBook.book`), at ``storage_per_gb_month``.
The key of a row is what the transfer was (job, dataset, node, version), so a write
replayed from the spool or repeated after a restart adds nothing. The ledger never holds
up staging: a write it cannot take now waits in its spool.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_burst.core.errors import BurstError
from slurm_burst.core.numbers import json_count
from slurm_burst.core.pricing import (
    PricingError,
    bytes_cost_micros,
    storage_cost_micros,
    to_micros,
)
from slurm_burst.core.staging import account_of
from slurm_burst.core.usage import StorageCharge, Transfer, TransferDirection
from slurm_burst.ports import Clock, Ledger, Metrics, StorageLedger
from slurm_burst.services.staging import Held

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class StorePrices:
    """A store's prices, dollars per GB (2^30 bytes) and per GB-month."""

    store: str
    provider: str = ""  # the provider profile its nodes are of ("" if several)
    upload_per_gb: float = 0.0
    download_per_gb: float = 0.0
    egress_per_gb: float = 0.0
    storage_per_gb_month: float = 0.0

    def per_gb(self, direction: TransferDirection) -> float:
        return {
            TransferDirection.IN: self.upload_per_gb,
            TransferDirection.PULL: self.download_per_gb,
            TransferDirection.OUT: self.egress_per_gb,
        }[direction]


class TransferBook:
    def __init__(
        self,
        cluster: str,
        prices: StorePrices,
        clock: Clock,
        ledger: Ledger | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.cluster = cluster
        self.prices = prices
        self.clock = clock
        self.ledger = ledger
        self.metrics = metrics

    def pushed(
        self, out: Mapping[str, Any], *, account: str, user: str, job_id: int = 0,
        dst: str = "", stage_id: str = "",
    ) -> Transfer:  # fmt: skip
        """A push that completed (``out``: ``Pushed.as_dict()``, or what the child said)."""
        sent = json_count(out.get("bytes_sent"))
        t = self._transfer(
            TransferDirection.IN, out, account=account, user=user, job_id=job_id,
            dataset=str(out.get("src", "")), node="", sent=sent,
            parts=(job_id, stage_id, dst, out.get("src"), out.get("manifest"),
                   self.clock.now() if not job_id else ""),
        )  # fmt: skip
        self._record(t)
        return t

    def pulled(
        self, out: Mapping[str, Any], *, account: str, user: str, job_id: int, dst: str,
        node: str, provider: str, manifest: str, stage_id: str = "",
    ) -> Transfer:  # fmt: skip
        """A node's pull that completed (``out``: what ``node/stagein.py`` said)."""
        got = json_count(out.get("fetched_bytes"))
        t = self._transfer(
            TransferDirection.PULL, {**out, "manifest": manifest}, account=account, user=user,
            job_id=job_id, dataset=dst, node=node, sent=got,
            parts=(job_id, stage_id, dst, node, manifest), provider=provider,
        )  # fmt: skip
        self._record(t)
        return t

    def brought_home(
        self, out: Mapping[str, Any], *, account: str, user: str, job_id: int, name: str,
        node: str, manifest: str,
    ) -> Transfer:  # fmt: skip
        """A stage-out's version brought home (``out``: what ``stage promote`` said): its
        bytes fetched from the store to the site, at the store's ``egress_per_gb``."""
        got = json_count(out.get("bytes"))
        t = self._transfer(
            TransferDirection.OUT, {**out, "manifest": manifest}, account=account, user=user,
            job_id=job_id, dataset=str(out.get("home", "")), node=node, sent=got,
            parts=(job_id, name, manifest),
        )  # fmt: skip
        self._record(t)
        return t

    def failed(self, direction: TransferDirection) -> None:
        if self.metrics is not None:
            self.metrics.transfer(direction, self.prices.store, False, 0, 0.0)

    def _transfer(
        self, direction: TransferDirection, out: Mapping[str, Any], *, account: str, user: str,
        job_id: int, dataset: str, node: str, sent: int, parts: tuple[object, ...],
        provider: str = "",
    ) -> Transfer:  # fmt: skip
        p = self.prices
        per_gb = p.per_gb(direction)
        cost = bytes_cost_micros(sent, _micros(per_gb))
        what = json.dumps([self.cluster, direction, *map(str, parts)]).encode()
        return Transfer(
            key=f"{direction}:{hashlib.sha256(what).hexdigest()}", direction=direction,
            store=p.store, provider=provider or p.provider, account=account, user=user,
            job_id=job_id, node=node, dataset=dataset, manifest=str(out.get("manifest", "")),
            logical_bytes=json_count(out.get("bytes")), bytes_sent=sent,
            objects=json_count(out.get("objects", out.get("files"))),
            objects_sent=json_count(out.get("objects_sent", out.get("files"))) if sent else 0,
            seconds=max(0.0, _float(out.get("seconds"))), at=self.clock.now(), per_gb=per_gb,
            storage_per_gb_month=p.storage_per_gb_month, cost_micros=cost,
        )  # fmt: skip

    def _record(self, t: Transfer) -> None:
        if self.metrics is not None:
            self.metrics.transfer(t.direction, t.store, True, t.bytes_sent, t.seconds)
        if self.ledger is None:
            return
        try:
            self.ledger.transfer(t)
        except (BurstError, OSError) as exc:  # the spool could not take it either: said
            log.error("ledger.transfer_lost job=%s direction=%s bytes_sent=%d error=%s",
                      t.job_id, t.direction, t.bytes_sent, exc)  # fmt: skip


class StorageBook:
    """Storage's GB-months into the ledger, namespace by namespace, as ``stage gc``
    found them: each namespace from its last booking (or, never booked, each key from
    its write) to the run, at the store's ``storage_per_gb_month``."""

    def __init__(self, cluster: str, prices: StorePrices, ledger: StorageLedger) -> None:
        self.cluster = cluster
        self.prices = prices
        self.ledger = ledger

    def booked(self) -> dict[str, float]:
        """When each of the store's namespaces was last booked to."""
        return self.ledger.storage_booked(self.prices.store)

    def charges(self, held: Mapping[str, Held], at: float) -> list[StorageCharge]:
        """What ``held`` (``GcReport.held``) costs, one charge a namespace."""
        p = self.prices
        price = _micros(p.storage_per_gb_month)
        out = []
        for ns, h in sorted(held.items()):
            what = json.dumps([self.cluster, p.store, ns, h.since]).encode()
            out.append(StorageCharge(
                key=f"stored:{hashlib.sha256(what).hexdigest()}", store=p.store,
                provider=p.provider, account=account_of(ns), namespace=ns, start=h.since,
                at=at, key_count=h.keys, stored_bytes=h.bytes, byte_seconds=h.byte_seconds,
                per_gb_month=p.storage_per_gb_month,
                cost_micros=storage_cost_micros(h.byte_seconds, price),
            ))  # fmt: skip
        return out

    def book(self, charges: list[StorageCharge]) -> None:
        for c in charges:
            self.ledger.storage(c)


def _micros(dollars: float) -> int:
    try:
        return max(0, to_micros(dollars))
    except PricingError:  # config validation refuses these; a bad price charges nothing
        return 0


def _float(v: object) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok and v > 0 else 0.0  # type: ignore[arg-type,operator]
