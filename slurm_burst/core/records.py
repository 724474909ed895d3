"""What the daemon remembers between steps: node records, the hooks' requests, group health.

These are the values of the :class:`~slurm_burst.ports.NodeStore` port. The SQLite
state database is one implementation (``adapters/state``); the tests' in-memory
store is another. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from slurm_burst.core.errors import EXIT_BAD_INPUT, EXIT_PRECONDITION, BurstError
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.slurm import JobOwner


class StoreError(BurstError):
    """The state store cannot be used (permissions, corruption, a full address pool)."""

    code = "InternalError"
    exit_code = EXIT_PRECONDITION


class DuplicateRequest(StoreError):
    """A request's uid already names another request (other kind, nodes or jobs): the
    second is refused, never merged into the first or dropped unsaid."""

    code = "DuplicateRequest"
    exit_code = EXIT_BAD_INPUT


class PoolExhausted(StoreError):
    """Every address of the mesh subnet is held: no node can join until one is released."""

    code = "MeshPoolFull"


class NodeRecord(NamedTuple):
    """One cloud node as the daemon tracks it.

    A NamedTuple rather than a dataclass: the reconcile loop reads 20,000 of them a
    pass. ``host_keys`` and ``jobs`` stay JSON text for the same reason; read them
    with :meth:`host_key_list` and :meth:`as_dict`.
    """

    name: str
    group: str  # the node group (config ``[node_groups.NAME]``)
    state: NodeState
    want: Want
    error: str = ""  # the failure code, e.g. BootTimeout
    message: str = ""
    provider: str = ""
    size: str = ""
    launch_seq: int = 0  # resumes of this node so far: part of every launch token
    token: str = ""  # the idempotency token of the launch call in flight
    instance_id: str = ""
    ip: str = ""  # where the daemon reaches the node's sshd
    host_keys: str = "[]"  # JSON [[type, base64], ...], attested by the provider
    wg_pubkey: str = ""
    mesh_addr: str = ""
    jobs: str = "[]"  # JSON: the resume file's jobs behind the request
    requested_at: float = 0.0
    state_since: float = 0.0
    # when the daemon saw slurmctld hear from this life's slurmd (0: not yet); what the
    # PrologSlurmctld waits for
    registered_at: float = 0.0
    market: str = ""  # the launch's market: "spot", or "" (on-demand)
    placement: str = ""  # the placement group its instance went in ('' : none)

    def host_key_list(self) -> list[tuple[str, str]]:
        return [(str(k[0]), str(k[1])) for k in json.loads(self.host_keys)]

    def job_list(self) -> list[dict[str, Any]]:
        """The jobs waiting for this node (the resume file's, as stored)."""
        jobs = json.loads(self.jobs or "[]")
        return [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []

    def as_dict(self) -> dict[str, Any]:
        out = self._asdict()
        out["state"] = str(self.state)
        out["want"] = str(self.want)
        out["host_keys"] = json.loads(self.host_keys)
        out["jobs"] = json.loads(self.jobs)
        return out


# The fields a transition or an update may set (``name`` identifies the record).
NODE_FIELDS = frozenset(NodeRecord._fields) - {"name"}


@dataclass(frozen=True)
class Spooled:
    """A request a hook kept in the spool because the state database could not take it."""

    path: str  # the spool file
    uid: str
    kind: str  # resume | suspend | resume-fail
    nodes: tuple[str, ...]
    jobs: list[dict[str, Any]]
    created_at: float


@dataclass(frozen=True)
class Request:
    """What a hook recorded: resume, suspend or resume-fail of some nodes."""

    id: int
    kind: str  # resume | suspend | resume-fail
    nodes: tuple[str, ...]
    jobs: list[dict[str, Any]]
    created_at: float


@dataclass(frozen=True)
class Batch:
    """One launch call for many nodes, recorded before the call: a crash repeats it
    with the same token and parameters (EC2 refuses a token reused with others)."""

    token: str
    nodes: tuple[str, ...]
    provider: str
    size: str
    group: str
    least: int = 0  # the fewest instances worth having (0: a batch kept before it was)
    market: str = ""
    via: str = ""
    placement: str = ""  # its placement group, if any

    def doc(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "provider": self.provider, "size": self.size,
                "group": self.group, "least": self.least, "market": self.market,
                "via": self.via, "placement": self.placement}  # fmt: skip

    @classmethod
    def from_doc(cls, token: str, doc: Mapping[str, Any]) -> Batch:
        return cls(token, tuple(doc.get("nodes") or ()), str(doc.get("provider", "")),
                   str(doc.get("size", "")), str(doc.get("group", "")),
                   int(doc.get("least") or 0), str(doc.get("market") or ""),
                   str(doc.get("via") or ""), str(doc.get("placement") or ""))  # fmt: skip


@dataclass(frozen=True)
class Placement:
    """A per-job placement group: recorded before it is made (a crash leaks nothing),
    ``made`` once the provider has it."""

    name: str
    provider: str
    made: bool = False


@dataclass(frozen=True)
class WarmOverride:
    """``slurm-burst group warm``: keep ``nodes`` of a warm pool up until ``until``."""

    nodes: int
    until: float


@dataclass(frozen=True)
class GroupHealth:
    """A node group's launch record: failures in a row and protected mode."""

    name: str
    failures: int = 0  # failed launches in a row (a join resets it)
    protected_until: float = 0.0  # 0 = not protected
    reason: str = ""

    def protected(self, now: float) -> bool:
        return self.protected_until > now


class StageState:
    """Where a job's stage-in is (the ``stages`` table's ``state``)."""

    REQUESTED = "requested"  # the hook asked; the daemon has not taken it yet
    CHECKING = "checking"  # the daemon resolves its sources as the job's user
    DEFERRED = "deferred"  # may leave, not sent: sent if Slurm gives the job cloud nodes
    PUSHING = "pushing"
    STAGED = "staged"  # every dataset in the store: nodes may pull
    KEPT_HOME = "kept_home"  # sensitive: the job never runs on a cloud node
    FAILED = "failed"


@dataclass(frozen=True)
class StageRecord:
    """A job's stage-in: whose job (``owner``), what (``stages``: src/dst), and what
    came of it."""

    owner: JobOwner
    burst_only: bool  # every partition a burst partition: pushed at stage-in
    stages: list[dict[str, Any]]  # [{"src", "dst"}]
    state: str
    message: str = ""
    datasets: list[dict[str, Any]] = field(default_factory=list)  # per stage: its manifest
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def job_id(self) -> int:
        return self.owner.job_id


class OutputState:
    """Where a job's stage-out is (the ``outputs`` table's ``state``)."""

    WAITING = "waiting"  # nothing synced yet
    SYNCED = "synced"  # a version in the store (``manifest``); the job may still change it
    ENDED = "ended"  # the job ended, its last version synced: on its way home
    PARTIAL = "partial"  # the job ended, its node gone first: the last synced comes home
    SEALED = "sealed"  # the job ended and its last version is home, verified
    LOST = "lost"  # the job ended and not all of it came home: ``message`` says what

    OPEN = (WAITING, SYNCED, ENDED, PARTIAL)
    RUNNING = (WAITING, SYNCED)


@dataclass(frozen=True)
class OutputRecord:
    """One ``stage_out`` of a job: its directory ``name`` on the job's first node, and
    where it goes home (``home``, ``%j`` expanded)."""

    job_id: int
    name: str
    home: str
    sync: int = 0  # seconds between syncs while the job runs; 0: at its end only
    state: str = OutputState.WAITING
    node: str = ""  # the job's first node, once it ran on a cloud node
    manifest: str = ""  # the last version synced
    files: int = 0
    bytes: int = 0
    synced_at: float = 0.0
    message: str = ""
    updated_at: float = 0.0
