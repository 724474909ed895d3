"""Job usage as the ledger records it, and the ledger's errors. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

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
        return f"{self.cluster}:{self.job_id}:{int(self.start.timestamp())}"


class LedgerError(RuntimeError):
    """The ledger cannot do what was asked; the message says why."""


class LedgerUnavailable(LedgerError):
    """The database cannot be reached now (writes are spooled and replayed)."""


class LedgerConflict(LedgerError):
    """A row with the same unique key exists (a replay, or another daemon was first)."""


class SchemaOutdated(LedgerError):
    """The database schema is older than this code: run ``slurm-burst db upgrade``."""
