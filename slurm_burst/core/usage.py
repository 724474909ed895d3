"""What the ledger records (instance events, job usage) and reads back, and its errors.

Pure: the values of the ledger and accounting ports (``slurm_burst.ports``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slurm_burst.core.errors import EXIT_BAD_INPUT, BurstError
from slurm_burst.core.gpu import job_key
from slurm_burst.core.pricing import GB, MONTH_SECONDS, dollars

FINISHED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REQUEUED",
    }
)


@dataclass(frozen=True)
class JobUsage:
    """One finished job (allocation) from Slurm accounting."""

    cluster: str
    job_id: int
    account: str
    user: str
    partition: str
    nodes: str  # hostlist expression
    node_count: int
    cpus: int
    gpus: int
    mem_mb: int
    submit: datetime
    start: datetime
    end: datetime
    state: str

    @property
    def key(self) -> str:
        """cluster:jobid:start-epoch: one run of a job (a requeued job runs again)."""
        return job_key(self.cluster, self.job_id, self.start.timestamp())


@dataclass(frozen=True)
class InstanceEvent:
    """One event in an instance's life, as the ledger records it (append-only).

    ``event`` is one of requested, running, joined, failed, terminated. The price
    and the node's shape are those at launch: history is never re-priced. The
    field names are the spool's on-disk format (``ledger.spool_dir``): keep them.
    """

    node: str
    instance_id: str
    event: str
    at: float  # unix time
    provider: str = ""
    size: str = ""
    price_per_hour: float = 0.0
    detail: str = ""  # a failure code, or why the row was closed
    group: str = ""
    partition: str = ""
    cpus: int = 0
    gpus: int = 0
    price_source: str = ""  # the rate's name, or "none"
    price_version: str = ""


class TransferDirection(enum.StrEnum):
    """Which way a transfer's bytes went (the ledger stores these values)."""

    IN = "in"  # the site's side to the store (stage-in's push)
    PULL = "pull"  # the store to a cloud node (the node's pull, part of its join)
    OUT = "out"  # a cloud node or the store back to the site (stage-out)


@dataclass(frozen=True)
class Transfer:
    """One transfer of a dataset, as the ledger records it (append-only).

    ``key`` makes a replayed or repeated write add nothing. ``per_gb`` is the price per
    GB sent that applied to this direction (the store's ``upload_per_gb``,
    ``download_per_gb`` or ``egress_per_gb``); ``cost_micros`` is the bytes sent at that
    price (storage is booked apart: :class:`StorageCharge`). ``storage_per_gb_month`` is
    the store's price at the time, for the record. The field names are the spool's
    on-disk format: keep them.
    """

    key: str
    direction: str
    store: str
    provider: str
    account: str
    user: str
    job_id: int  # 0: no job (an admin's pre-stage)
    node: str  # a pull's node; "" for a push
    dataset: str  # the source path (in) or the job's name for it (pull)
    manifest: str
    logical_bytes: int  # the dataset's size
    bytes_sent: int  # on the wire (compressed where stored so)
    objects: int
    objects_sent: int
    seconds: float
    at: float  # unix time the transfer ended
    per_gb: float = 0.0
    storage_per_gb_month: float = 0.0
    cost_micros: int = 0


@dataclass(frozen=True)
class StorageCharge:
    """What an account's namespace of a store held from ``start`` (None: from each
    object's write) to ``at``, as ``stage gc`` books it: ``byte_seconds`` of every key
    listed (objects, manifests, pointers; what the run removes counts until the run),
    at ``per_gb_month`` (2^30 bytes for 730 hours). ``key`` makes a second booking of the
    same period add nothing."""

    key: str
    store: str
    provider: str
    account: str  # '' for a namespace that is no account's
    namespace: str
    start: float | None
    at: float
    key_count: int  # keys held at ``at`` (before the run removed any)
    stored_bytes: int  # their bytes
    byte_seconds: int
    per_gb_month: float
    cost_micros: int

    @property
    def gb_months(self) -> float:
        return self.byte_seconds / (GB * MONTH_SECONDS)

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace, "account": self.account, "store": self.store,
            "provider": self.provider, "start": self.start, "at": self.at,
            "keys": self.key_count, "bytes": self.stored_bytes,
            "byte_seconds": self.byte_seconds, "gb_months": round(self.gb_months, 6),
            "per_gb_month": self.per_gb_month, "cost": float(dollars(self.cost_micros)),
            "cost_micros": self.cost_micros,
        }  # fmt: skip


@dataclass(frozen=True)
class ClosedInstance:
    """An instance with a terminated event and no allocation yet."""

    instance_id: str
    node: str
    partition: str
    size: str
    micros_per_hour: int
    cpus: int
    gpus: int
    start: datetime
    end: datetime


@dataclass(frozen=True)
class AssocUsage:
    """An account's billing minutes: used this period, held by running jobs (their
    remaining time limit), and its GrpTRESMins limit (None: unlimited)."""

    used: int
    running: int
    limit: int | None


# The columns of ``slurm-burst ledger export``: one charge line each.
EXPORT_COLUMNS = (
    "day", "account", "user", "partition", "job_key", "instance_id", "kind",
    "amount", "amount_micros", "node_hours", "gpu_hours",
)  # fmt: skip


def report_totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of report rows (what the table's last line and the JSON's total show)."""
    allocated = sum(int(r["allocated_micros"]) for r in rows)
    overhead = sum(int(r["overhead_micros"]) for r in rows)
    idle_gpu = sum(int(r.get("idle_gpu_micros", 0)) for r in rows)
    staging = sum(int(r.get("staging_micros", 0)) for r in rows)
    return {
        "idle_gpu": float(dollars(idle_gpu)),
        "instance_hours": round(sum(r["instance_hours"] for r in rows), 6),
        "gpu_hours": round(sum(r["gpu_hours"] for r in rows), 6),
        "allocated": float(dollars(allocated)),
        "overhead": float(dollars(overhead)),
        "staging": float(dollars(staging)),
        "staged_bytes": sum(int(r.get("staged_bytes", 0)) for r in rows),
        "total": float(dollars(allocated + overhead + staging)),
        "total_micros": allocated + overhead + staging,
    }


class LedgerError(BurstError):
    """The ledger cannot do what was asked; the message says why."""

    code = "LedgerError"


class LedgerUnavailable(LedgerError):
    """The database cannot be reached now (writes are spooled and replayed)."""

    code = "LedgerUnavailable"


class LedgerConflict(LedgerError):
    """A row with the same unique key exists (a replay, or another daemon was first)."""

    code = "LedgerConflict"


class UnknownRevision(LedgerError):
    """``db upgrade --to`` named a schema revision that does not exist."""

    code = "UnknownRevision"
    exit_code = EXIT_BAD_INPUT


class SchemaOutdated(LedgerError):
    """The database schema is older than this code: run ``slurm-burst db upgrade``."""

    code = "SchemaOutdated"
