"""The ports: what services need from the outside world, as Protocols.

Adapters implement them; services receive them through their constructors, and
``slurm_burst.wiring`` is the one place that builds adapters and hands them in.
Nothing in ``core`` or ``services`` imports an adapter or an adapter's libraries.
The tests' in-memory fakes (``tests/fakes``) implement the same ports and pass the
same contract suites (``tests/contracts``) as the real adapters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import date, datetime
from typing import Any, BinaryIO, Protocol

from slurm_burst.core.allocation import Allocation
from slurm_burst.core.cloud import Instance, LaunchSpec
from slurm_burst.core.fleetstatus import FleetStatus
from slurm_burst.core.gpu import GpuSample, GpuUsage, GroupGpus
from slurm_burst.core.mesh import Peer
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.records import (
    Batch,
    GroupHealth,
    NodeRecord,
    OutputRecord,
    Placement,
    Request,
    Spooled,
    StageRecord,
    WarmOverride,
)
from slurm_burst.core.slurm import JobOwner, QueuedJob, SlurmJob, SlurmNode, SlurmPartition
from slurm_burst.core.usage import (
    AssocUsage,
    ClosedInstance,
    InstanceEvent,
    JobUsage,
    StorageCharge,
    Transfer,
)


class Clock(Protocol):
    """Time, passed in: wall time for records, a monotonic clock and sleep for waits."""

    def now(self) -> float: ...  # unix time

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class JobSteering(Protocol):
    """Slurm's pending queue, read and steered by the burst policy (the CLI backend)."""

    def pending_jobs(self) -> list[QueuedJob]: ...  # one call

    # the jobs' partition list and AdminComment; returns Slurm's complaints
    def steer_jobs(
        self, job_ids: Sequence[str], partitions: Sequence[str], comment: str
    ) -> list[str]: ...


class StagePusher(Protocol):
    """Reads a dataset as a user and pushes it (or, with ``check``, only checks it may
    leave); the result as ``slurm-burst stage push --json`` gives it. A refusal or a
    failure raises a BurstError with its code (StageSensitive: kept home)."""

    def push(
        self, user: str, src: str, account: str, qos: str, *, check: bool
    ) -> dict[str, Any]: ...


class OutputPromoter(Protocol):
    """Brings a stored version of a job's output home, as the job's user (a child
    ``slurm-burst stage promote --as-user``); StorageError (``StageOutCorrupt``: nothing
    replaced) or another BurstError if it could not."""

    def promote(self, user: str, account: str, manifest: str, home: str) -> dict[str, Any]: ...


class JobOwners(Protocol):
    """Whose a job is (the stage-in hook's one question to Slurm; the CLI backend)."""

    def job_owner(self, job_id: int) -> JobOwner: ...


class Scheduler(Protocol):
    """Slurm, as the daemon sees it."""

    def nodes(self) -> list[SlurmNode]: ...

    def registered(self, names: Sequence[str]) -> set[str]: ...  # one call, any count

    def jobs(self, partitions: Sequence[str] | None = None) -> list[SlurmJob]: ...

    def job_counts(self, partitions: Sequence[str] | None = None) -> dict[tuple[str, str], int]: ...

    def partitions(self) -> list[SlurmPartition]: ...

    # job id -> node -> the GPU indices it holds there (gone jobs left out)
    def job_gpus(self, job_ids: Sequence[int]) -> dict[int, dict[str, tuple[int, ...]]]: ...

    def ping(self) -> bool: ...

    def update_nodes(
        self,
        names: Sequence[str],
        *,
        state: str | None = None,
        reason: str | None = None,
        addrs: Sequence[str] | None = None,
        hostnames: Sequence[str] | None = None,
        comment: str | None = None,  # the node's Comment ('' clears it)
        instance: tuple[str, str, str] | None = None,  # one node's (id, type, extra), 23.11+
    ) -> None: ...

    # dynamic nodes (23.11+): ``scontrol create NodeName=<names> <settings>``, one call
    def create_nodes(
        self, names: Sequence[str], settings: Sequence[tuple[str, object]]
    ) -> None: ...

    # ``scontrol delete``: Slurm deletes each it may (no job, no reservation) and names
    # the others in the SchedulerError it then raises
    def delete_nodes(self, names: Sequence[str]) -> None: ...


class JobControl(Protocol):
    """What is done to a running job when its node is to be reclaimed (SlurmCli has it)."""

    # the jobs on ``node`` in ``states`` (squeue's: "RUNNING", "all", a comma list)
    def jobs_on(self, node: str, states: str = "RUNNING") -> list[int]: ...

    def batch_script(self, job_id: int) -> str: ...  # '' if it has none (an salloc)

    def signal_job(self, job_id: int, signal: str, batch_only: bool) -> None: ...

    def requeue(self, job_ids: Sequence[int]) -> None: ...


class DaemonHost(Protocol):
    """The daemon's own process on its host: the one-per-host lock, the wake-up channel
    the hooks poke, and the heap it hands back after a pass (adapters/host.py)."""

    def acquire(self) -> None: ...  # DaemonError if another daemon holds the lock

    def open(self) -> None: ...  # the wake-up channel, before the first wait

    def wait(self, timeout: float) -> None: ...  # until a wake-up (all drained) or timeout

    def close(self) -> None: ...  # the channel, if open (again: nothing); the lock stays

    def release_memory(self) -> None: ...


class RequestSpool(Protocol):
    """Where a hook keeps a request the state database cannot take; the daemon drains it."""

    def put(
        self, uid: str, kind: str, nodes: list[str], jobs: list[dict[str, Any]], now: float
    ) -> object:
        """Durable once it returns; OSError when it cannot be written."""
        ...

    def pending(self) -> list[Spooled]:
        """The requests waiting, oldest first (unreadable ones set aside, never returned)."""
        ...

    def remove(self, item: Spooled) -> None: ...

    def reject(self, item: Spooled, why: str) -> None:
        """Set ``item`` aside, never to be acted on, and log ``why``."""
        ...


class Cloud(Protocol):
    """One provider profile (a libcloud driver with its region and credentials)."""

    @property
    def name(self) -> str: ...

    @property
    def batch_max(self) -> int: ...  # instances one launch call may make (1: no batching)

    def launch(self, spec: LaunchSpec) -> Instance: ...

    def launch_many(self, spec: LaunchSpec) -> list[Instance]: ...  # min_count..count, or none

    def find(self, token: str, cluster: str) -> list[Instance]: ...  # what a token launched

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None: ...

    def get(self, instance_id: str) -> Instance | None: ...

    def list_instances(self, cluster: str) -> list[Instance]: ...

    def terminate(self, instance_id: str) -> None: ...

    # one read; ``size`` (the instance's type, if known) spares a describe first
    def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]: ...

    # a placement group for one job's instances (EC2: cluster strategy); making one that
    # exists and deleting one that is gone are no errors; deleting one that still holds
    # instances raises InUseError (try again later)
    def create_placement(self, name: str) -> None: ...

    def delete_placement(self, name: str) -> None: ...


class Mesh(Protocol):
    """The WireGuard hub on the controller side."""

    def ensure_hub(self) -> str: ...  # returns the hub's public key

    def add_peer(self, public_key: str, address: str, node: str) -> None: ...

    def remove_peer(self, public_key: str) -> None: ...

    def peers(self) -> list[Peer]: ...

    def node_config(self, allowed: Sequence[str]) -> str: ...  # the node's side, no key


class RemoteShell(Protocol):
    """An authenticated session on a node (SSH)."""

    def run(self, argv: Sequence[str], timeout: float = 60.0) -> str: ...

    def put(
        self, data: bytes, path: str, mode: int, owner: tuple[int, int] | None = None
    ) -> None: ...

    def close(self) -> None: ...


class Connector(Protocol):
    """Opens a :class:`RemoteShell` to a node whose host keys the provider attested."""

    def connect(
        self, host: str, host_keys: Sequence[tuple[str, str]], deadline: float
    ) -> RemoteShell: ...


class NodeBook(Protocol):
    """Node records and their events: every state change checked against the state
    machine and logged as an event (``services.lifecycle`` is its one writer)."""

    def node(self, name: str) -> NodeRecord | None: ...

    def nodes(self) -> list[NodeRecord]: ...

    def nodes_named(self, names: Sequence[str]) -> dict[str, NodeRecord]: ...

    def transition(
        self, name: str, new: NodeState, now: float, group: str = "", **changes: Any
    ) -> NodeRecord: ...

    def update(self, name: str, **changes: Any) -> None: ...

    def event(self, now: float, event: str, node: str = "", detail: str = "") -> None: ...

    def events(self, since_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]: ...


class RequestBook(Protocol):
    """The hooks' requests: the hooks write, the daemon consumes."""

    def add_request(
        self,
        kind: str,
        nodes: Sequence[str],
        jobs: Sequence[Mapping[str, Any]],
        now: float,
        uid: str = "",
    ) -> int:
        """Record a request; a second one with the same non-empty ``uid`` is the first."""
        ...

    def pending_requests(self) -> list[Request]:
        """Unfinished requests in the order they were made (``created_at``, then id)."""
        ...

    def finish_request(self, request_id: int, now: float) -> None: ...


class StageBook(Protocol):
    """Stages and outputs: the stage-in hook records them, the daemon works them; and
    the pulls of a job's data onto its nodes."""

    def add_stage(self, rec: StageRecord) -> StageRecord:
        """Record a job's stage-in; one already recorded stays, unless it failed."""
        ...

    def stage(self, job_id: int) -> StageRecord | None: ...

    def stages(self, states: Sequence[str] = ()) -> list[StageRecord]: ...

    def update_stage(
        self, job_id: int, now: float, *, expect: Sequence[str] = (), **changes: Any
    ) -> bool: ...

    def forget_stages(self, before: float) -> int:
        """Forget stages last changed before ``before``, and the pulls of every job
        with no stage left; how many stages."""
        ...

    def add_outputs(self, recs: Sequence[OutputRecord]) -> None: ...  # known ones stay

    def outputs(
        self, job_id: int | None = None, states: Sequence[str] = ()
    ) -> list[OutputRecord]: ...

    def update_output(
        self, job_id: int, name: str, now: float, *, expect: Sequence[str] = (), **changes: Any
    ) -> bool: ...

    # pulls: a job's data fetched onto a node (at its join, or asked by the prolog)
    def pulled(self, job_id: int, node: str, at: float, fetched_bytes: int) -> None: ...

    def pulled_on(self, job_id: int) -> list[str]: ...  # the nodes holding the job's data

    def ask_pull(self, job_id: int, node: str, at: float) -> None: ...

    def pulls_asked(self) -> list[tuple[int, str]]: ...

    def pull_done(self, job_id: int, node: str, failure: str = "") -> None:
        """An asked pull is over; ``failure`` says why it failed (kept for the prolog)."""
        ...

    def pull_failure(self, job_id: int, node: str) -> str: ...  # '' if none


class AddressPool(Protocol):
    """The mesh address pool: never one address for two nodes."""

    def allocate_address(self, node: str, subnet: str, now: float) -> str: ...

    def allocate_addresses(self, nodes: Sequence[str], subnet: str, now: float) -> dict[str, str]:
        """Each node's address, as ``allocate_address`` gives it, in one transaction;
        when the pool runs out, the nodes left over get none (absent from the result)."""
        ...

    def release_address(self, node: str) -> str | None: ...

    def addresses(self) -> dict[str, str]: ...


class GroupBook(Protocol):
    """Node groups' health: failures in a row, protected mode, sizes cooling down, a
    warm pool's override."""

    def groups(self) -> dict[str, GroupHealth]: ...

    def group_launch_result(self, name: str, ok: bool) -> int: ...

    def protect_group(self, name: str, until: float, reason: str) -> None: ...

    def unprotect_group(self, name: str) -> None: ...

    def mark_unavailable(self, provider: str, size: str, until: float, code: str) -> None: ...

    def unavailable(self, now: float) -> dict[tuple[str, str], tuple[float, str]]: ...

    def warm_override(self, group: str) -> WarmOverride | None: ...

    def set_warm_override(self, group: str, override: WarmOverride | None) -> None: ...


class LaunchBook(Protocol):
    """Launches in flight and what they made: batches (fixed before their call, so a
    crash repeats it), per-job placement groups, interruption notices seen, resumes
    replaced, the installation's id."""

    def installation(self, make: Callable[[], str]) -> str:
        """The installation's id; ``make()``'s, kept, the first time."""
        ...

    def begin_batch(self, batch: Batch) -> None: ...

    def batch(self, token: str) -> Batch | None: ...

    def end_batch(self, token: str) -> None: ...

    def placements(self) -> dict[str, Placement]: ...  # by name

    def set_placement(self, placement: Placement) -> None: ...

    def forget_placement(self, name: str) -> None: ...

    def notice_seen(self, instance_id: str, node: str, action: str, at: float) -> bool:
        """Record an interruption notice; False if it was seen already."""
        ...

    def replaced(self, node: str) -> tuple[float, float] | None:
        """When the node's resume was asked first and again, if it was replaced."""
        ...

    def set_replaced(self, node: str, first: float, again: float) -> None: ...


class Leadership(Protocol):
    """Who acts: the acting daemon's heartbeat and the standbys it has."""

    def beat(self, now: float, info: Mapping[str, Any]) -> None: ...

    def heartbeat(self) -> dict[str, Any] | None: ...

    def follower(self, node_id: str, info: Mapping[str, Any] | None) -> None: ...  # None: gone

    def followers(self) -> dict[str, dict[str, Any]]: ...


class PassBook(Protocol):
    """What the periodic passes leave for the next pass and for ``status``: the last
    reconcile pass, the instances suspected orphans (since when), the last policy pass."""

    def last_pass(self) -> dict[str, Any] | None: ...

    def record_pass(self, summary: Mapping[str, Any]) -> None: ...

    def suspects(self) -> dict[str, float]: ...

    def set_suspects(self, suspects: Mapping[str, float]) -> None: ...

    def policy_report(self) -> dict[str, Any] | None: ...

    def set_policy_report(self, doc: Mapping[str, Any]) -> None: ...


class NodeStore(
    NodeBook,
    RequestBook,
    StageBook,
    AddressPool,
    GroupBook,
    LaunchBook,
    Leadership,
    PassBook,
    Protocol,
):
    """The daemon's durable memory, every part of it in one database: a write inside
    ``atomically`` spans parts. Every write is atomic and durable before it returns: a
    request a hook recorded survives a crash of either side."""

    def atomically(self) -> AbstractContextManager[None]:
        """Every write inside is one transaction: all of it lands, or none if the block
        raises; other threads see none of it until the block ends."""
        ...

    def check_writable(self, now: float) -> None:
        """A write that changes nothing read: StoreError while the database takes none."""
        ...


class LeaderElection(Protocol):
    """Which daemon of an HA pair acts. A leader that cannot confirm it still holds
    the election stops acting at once."""

    @property
    def node_id(self) -> str: ...

    def try_acquire(self) -> bool: ...  # never raises: False when unreachable

    def held(self) -> bool: ...  # checked against the source of truth

    def leader_info(self) -> str: ...  # who leads now ('' if unknown)

    def release(self) -> None: ...


class Metrics(Protocol):
    """What the services report; the Prometheus adapter turns it into series."""

    def launched(self, group: str, provider: str, size: str) -> None: ...

    def failed(self, group: str, code: str) -> None: ...

    def cloud_call(self, provider: str, call: str, seconds: float, error: str | None) -> None: ...

    def api_tokens(self, account: str, api: str, tokens: float) -> None: ...  # budget left

    def api_throttled(self, provider: str, api: str) -> None: ...  # a throttled answer

    def leading(self, leading: bool) -> None: ...

    def heartbeat(self, at: float) -> None: ...

    def reconcile_pass(self, seconds: float, ended: float) -> None: ...

    def reconcile_action(self, kind: str, code: str) -> None: ...

    def phase_error(self, phase: str) -> None: ...

    def contained(self, where: str, code: str) -> None: ...  # a loop boundary stopped an error

    def fleet(self, view: FleetStatus) -> None: ...  # nodes by state, spend, protected mode

    def cap(self, group: str, room: int) -> None: ...  # a capped group's room left

    def resume_over_cap(self, group: str) -> None: ...  # a resume refused at the cap

    def step(self, step: str, seconds: float) -> None: ...  # a launch/bootstrap step that succeeded

    def joined(self, group: str, seconds: float) -> None: ...  # resume request -> slurmd started

    def findings(
        self,
        orphans: Mapping[str, int],
        stale_peers: int,
        leaked_addresses: int,
        oldest_resume: Mapping[str, float],
    ) -> None: ...

    def slurm_node_activity(self, counts: Mapping[tuple[str, str], int]) -> None: ...

    def ledger_ingested(self, at: float) -> None: ...

    def spent(self, totals: Mapping[tuple[str, str], float]) -> None: ...  # (account, group)

    def budgets(
        self, budgets: Mapping[str, tuple[float, float, float]], period_end: float
    ) -> None: ...

    def gpus(
        self,
        by_group: Mapping[str, GroupGpus],
        per_gpu: Mapping[str, Sequence[GpuSample]] | None,
    ) -> None: ...

    # a dataset moved (direction: in, pull, out) or a move that failed (bytes 0)
    def transfer(
        self, direction: str, store: str, ok: bool, bytes_sent: int, seconds: float
    ) -> None: ...

    # nodes held for their jobs' outputs, and the least time left before one's deadline
    # (math.inf: none held); a stage-out recorded as lost
    def outputs_held(self, nodes: int, seconds_left: float) -> None: ...

    def output_lost(self) -> None: ...

    def serve(self, listen: str) -> None: ...


class Ledger(Protocol):
    """Append-only cost records: instance events (the provisioner writes them) and
    transfers (staging writes them); each recorded once, however often it is written."""

    def instance_event(self, ev: InstanceEvent) -> None: ...

    def instance_events(self, evs: Sequence[InstanceEvent]) -> None:
        """Several events in one write (a launch's batch): all recorded, or none."""
        ...

    def transfer(self, t: Transfer) -> None: ...


class StorageLedger(Protocol):
    """Where ``stage gc`` books storage: read the last booking, book the next period
    (directly, never spooled: a period is read and booked against the database)."""

    def storage_booked(self, store: str) -> dict[str, float]: ...

    def storage(self, s: StorageCharge) -> None: ...


class SpooledLedger(Ledger, Protocol):
    """A ledger that never blocks: writes wait in a durable spool while the database is
    away, and are replayed in order."""

    def replay(self) -> int: ...

    def pending(self) -> int: ...


class AccountingLedger(Ledger, Protocol):
    """The SQL ledger as chargeback and the reconcile loop read and write it."""

    def upgrade(self) -> tuple[str | None, str | None]: ...

    def open_instances(self) -> dict[str, str]: ...  # instance id -> node

    def ingest_cursor(self) -> datetime | None: ...

    def record_jobs(self, jobs: Sequence[JobUsage], window: tuple[datetime, datetime]) -> int: ...

    def closed_unallocated(self, before: datetime) -> list[ClosedInstance]: ...

    def jobs_between(self, start: datetime, end: datetime) -> list[JobUsage]: ...

    def gpu_usage(self, rows: Sequence[GpuUsage]) -> int: ...

    def write_allocations(self, allocations: Sequence[Allocation]) -> int: ...

    def set_budget(self, account: str, amount_micros: int, period: str = "month") -> None: ...

    def budgets(self) -> dict[str, tuple[int, str, datetime]]: ...

    def spent(self, start: date, end: date) -> dict[str, int]: ...

    def spend_since(self, after: int) -> tuple[int, dict[tuple[str, str], int]]: ...


class Accounting(Protocol):
    """Slurm accounting: finished jobs, and budgets as association limits."""

    def finished_jobs(
        self, start: datetime, end: datetime, partitions: Sequence[str]
    ) -> list[JobUsage]: ...

    def usage(self, account: str) -> AssocUsage: ...

    def has_account(self, account: str) -> bool: ...

    def set_billing_limit(self, account: str, minutes: int | None) -> None: ...


class ObjectStore(Protocol):
    """One bucket of object storage (adapters/storage: libcloud's storage drivers). Keys
    are object names in the bucket (``core.staging.Layout``); failures raise
    ``core.staging.StorageError`` with the store's own code. Safe to call from several
    threads at once."""

    name: str  # the config's store name
    upload_headers: Mapping[str, str]  # what a PUT to a grant must send besides the body

    def has(self, key: str) -> bool: ...  # one request

    # a small object whole (manifests, pointers); None: not there; StorageError past limit
    def read(self, key: str, limit: int) -> bytes | None: ...

    # ``size`` bytes of ``body`` as ``key``, ``pace(n)`` called before each n bytes sent
    # (a bandwidth limit); returns the bytes sent; the store's digest is checked
    def write(
        self, key: str, body: BinaryIO, size: int, pace: Callable[[int], None] | None = None
    ) -> int: ...

    def write_bytes(self, key: str, body: bytes) -> int: ...

    # a URL for one method on one object (GET: read it; PUT: write it), valid
    # ``seconds``; made locally, no request
    def grant(self, key: str, seconds: int, method: str = "GET") -> str: ...

    # an object of any size, each chunk handed to ``sink`` as it comes; its size, None
    # if it is not there
    def read_into(self, key: str, sink: Callable[[bytes], None]) -> int | None: ...

    # (key, size, last modified as unix time, math.inf if not said), in key order
    def keys(self, prefix: str) -> Iterator[tuple[str, int, float]]: ...

    def delete(self, key: str) -> None: ...  # gone already: no error


class ServedStore(Protocol):
    """A store the daemon serves itself (a mesh store): up while it leads."""

    @property
    def up(self) -> bool: ...

    def start(self) -> None: ...  # OSError: cannot serve now (the address is not here)

    def close(self) -> None: ...


class OutputHome(Protocol):
    """Where a job's outputs land on-prem (adapters/storage/home.py), as the job's user:
    a work directory beside the destination, then swapped in whole."""

    def begin(self, home: str) -> str: ...  # a new, empty work directory beside ``home``

    def open_file(self, work: str, path: str, executable: bool) -> BinaryIO: ...

    def finish(self, work: str, home: str) -> bool: ...  # True: one atomic exchange

    def abandon(self, work: str) -> None: ...


class DatasetTree(Protocol):
    """The site's side of a stage: a dataset's files as the reading user sees them
    (adapters/storage/tree.py). Errors: ``core.staging.StagingError`` (and
    ``SensitiveData`` for a marked directory)."""

    def resolve(self, src: str) -> str: ...  # every symlink and '..' resolved

    # ``path`` with every symlink followed as far as it exists (a kept path's other
    # spelling; never an error)
    def real(self, path: str) -> str: ...

    # (path inside the dataset, size, executable) of each regular file, sorted
    def files(self, real_src: str) -> list[tuple[str, int, bool]]: ...

    def digest(self, real_src: str, path: str, size: int) -> str: ...  # SHA-256, one read

    # (sample size, its size zlib-compressed): whether compressing the file pays
    def sample(self, real_src: str, path: str) -> tuple[int, int]: ...

    # the bytes to store (compressed when ``encoding`` says) and their count; the file is
    # read again and must still have ``sha256``, else StagingError (it changed)
    def body(
        self, real_src: str, path: str, sha256: str, encoding: str
    ) -> AbstractContextManager[tuple[BinaryIO, int]]: ...
