"""Bring one cloud node up, or take it down: the steps behind the node state machine.

:meth:`Provisioner.drive` moves a node towards what was asked of it (``want``
up or down), one persisted state at a time, and may be called again at any
point (after a crash, a duplicate resume, a suspend arriving mid-bootstrap):

- ``requested -> launching``: fix the idempotency token, then launch
  (``services.launcher``: candidates, batches, fallback). A retry with the same
  token returns the same instance, never a second one.
- ``launching -> booting``: wait for the instance to run and to print its SSH
  host key on its console (read through the provider's API: our trust anchor).
- ``booting -> bootstrapping -> joined``: over SSH, WireGuard (node key made on
  the node), a mesh address from the pool, the hub peer, munge key over SFTP,
  NodeAddr, configless slurmd. Each step is idempotent and timed in the log.
- ``* -> terminating -> terminated``: instance, hub peer, address, NodeAddr,
  ledger row closed. Whatever is already gone counts as done.

A failed step records an error code, sets the Slurm node DOWN with
``(Code:...)`` in its reason (Slurm requeues the job), tears down, and powers
the node down so Slurm may try again. One exception: a node of a burst-buffer
job whose instance fails while it comes up gets one new instance under its name
instead (:meth:`Provisioner._replace`), because Slurm never runs such a job
again once requeued.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import random
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from importlib import resources

from slurm_burst.config import Fleet, GpuConfig, NodeGroup
from slurm_burst.core.cloud import (
    SPOT_WAIT_CODE,
    Busy,
    CapacityError,
    CloudError,
    Instance,
    ThrottledError,
    backoff,
    classify,
)
from slurm_burst.core.errors import BadInput, BurstError, StepError
from slurm_burst.core.jobs import job_ids, nodes_by_job, released_with
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.mesh import MeshError, hub_address, parking_address
from slurm_burst.core.nodestate import LIVE, NodeState, TransitionError, Want, reason
from slurm_burst.core.records import NodeRecord, PoolExhausted, StoreError
from slurm_burst.core.remote import RemoteError
from slurm_burst.core.slurm import (
    SchedulerError,
    instance_comment,
    instance_extra,
    mixed_version_problem,
    records_instances,
    release_of,
)
from slurm_burst.ports import (
    Clock,
    Cloud,
    Connector,
    Ledger,
    Mesh,
    Metrics,
    NodeStore,
    RemoteShell,
    Scheduler,
)
from slurm_burst.services.fleetview import FleetView
from slurm_burst.services.images import Images
from slurm_burst.services.instancelog import InstanceLog
from slurm_burst.services.launcher import FELL_BACK, SPOT, Launcher, cooled, timed
from slurm_burst.services.lifecycle import Lifecycle
from slurm_burst.services.nodestage import NodeStaging
from slurm_burst.services.outputs import Outputs
from slurm_burst.services.runtimecheck import RuntimeCheck
from slurm_burst.services.slurmconf import dynamic_slurmd_args

log = logging.getLogger(__name__)

REMOTE_SCRIPT = "/run/slurm-burst-bootstrap.sh"
GPU_CHECK = "/etc/slurm-burst/gpucheck.py"  # the node's GPU check (bootstrap.sh, telemetry)
AGENT = "/run/slurm-burst-agent.py"  # the node agent: direct tunnels, notices (bootstrap.sh)
GPU_EXPECT = "/etc/slurm-burst/gpu-check.json"  # what the node group promises
POLL = 0.5  # seconds between looks at a booting instance (a provider without a listing)
ATTEST_RETRY = 2.0  # a console without host keys is read again after about this ...
ATTEST_POLL_MAX = 15.0  # ... doubling up to this (jittered: a rate-limited API)
SCOUT_POLL_MAX = 4.0  # a scout's reads stay this close: they time everyone's first read
CONSOLE_SAMPLES = 64  # recent running -> host keys times that time the first read
SCOUTS = 8  # with none yet, this many nodes per provider read early; the rest wait ...
PARKED_WAIT = 15.0  # ... to be woken by the first one's keys, or look again after this
THROTTLE_BACKOFF = (2.0, 30.0)  # a throttled step is looked at again (base, cap) later
HANDSHAKE_WAIT = 20.0  # seconds a new tunnel gets to complete its first handshake
# failures whose cause is on the node: its slurmd logs are logged before it is terminated
DIAGNOSED = frozenset({"SlurmdNotRegistered", "Bootstrap.slurmd-start"})
DIAGNOSE_WAIT = 10.0

# A node released because another node of its job failed (all_or_nothing = "job").
JOB_FAILED = "JobFailed"

# Failures that say nothing about the group's health: not counted towards protected mode.
NOT_LAUNCH_FAILURES = frozenset({
    "GroupProtected", "GroupAtCap", "SlurmPoweredDown", "ResumeLost",
    ThrottledError.code, Busy.code,  # the account's API budget, not the group's health
    "SpotInterruption",  # the provider took back an instance it had given
})  # fmt: skip

# Failures of one instance that a new one may well not have (and any ``Bootstrap.STEP``):
# what a burst-buffer job's node gets replaced for. Not among them: what any instance of
# the request would meet again (credentials, the config, a slurmd of another release, a
# full address pool, the hub) and a host key that does not match (an attack to look at).
INSTANCE_FAULTS = frozenset({
    "BootTimeout", "HostKeyTimeout", "InstanceVanished", "InstanceError",
    "InsufficientInstanceCapacity", "SshUnreachable", "RemoteCommand", "WireGuardKey",
    "WireGuardHandshake", "GpuUnhealthy", "StagePull",
})  # fmt: skip


@contextmanager
def _as_step(code: str, *errors: type[Exception]) -> Iterator[None]:
    """Turn ``errors`` raised inside into a failed step with ``code``."""
    try:
        yield
    except errors as exc:
        raise StepError(code, str(exc)) from exc


_SLURM_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}", re.ASCII)


@dataclass(frozen=True)
class _Facts:
    """A node's instance as Slurm is told it (``Provisioner._instance``)."""

    slurmd_args: tuple[str, ...] = ()
    comment: str | None = None  # None: the comment is left as it is
    instance: tuple[str, str, str] | None = None  # scontrol update's (id, type, extra)


class Cancelled(Exception):
    """The node's ``want`` changed while a step waited."""


class Later(Exception):
    """The node's step waits (its instance boots, its console is not out yet, our API
    budget has no token now): look at it again in ``seconds``. The worker lets go of it
    meanwhile (:meth:`Provisioner.drive` with ``blocking=False``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"again in {seconds:.2f} s")
        self.seconds = max(0.0, seconds)


class NeedsJoinSlot(Exception):
    """The node is ready to bootstrap: that takes one of the bootstrap slots."""


class Relaunch(Exception):
    """The node was asked for anew on its spot group's on-demand fallback (its spot
    capacity never came): the worker hands it on, to launch in one batch with the
    others falling back at the same time (a job's nodes wait out the same deadline)."""


@dataclass
class _Attest:
    """A running instance whose host keys are being read (kept in memory: after a
    restart the node's boot step looks again)."""

    instance_id: str
    address: str
    size: str
    running_at: float
    next_read: float | None  # None: not set yet, or parked until a scout has its keys
    reads: int = 0
    asked: float | None = None  # when the read now waiting for its turn was due


@dataclass
class Secrets:
    """Material the daemon holds; read once at start, never logged."""

    ssh_public_key: str
    munge_key: bytes


@dataclass(frozen=True, kw_only=True)
class ProvisionerSettings:
    """What the provisioner needs of the config (wiring.daemon.provisioner_settings builds it)."""

    fleet: Fleet
    controller_addr: str  # the hub routes it to the nodes when outside the mesh
    munge_socket: str
    mesh_subnet: str
    mesh_interface: str
    boot_timeout: float
    bootstrap_timeout: float
    gpu: GpuConfig
    resume_timeout: float = 0.0  # Slurm's ResumeTimeout; 0: never replace an instance
    slurm_release: str | None = None  # slurmctld's; None: slurmd's is not checked
    mesh_api_port: int = 51821  # the daemon's node API on the hub's mesh address
    mesh_node_port: int = 51820  # where a node's direct tunnels listen
    mesh_sync_interval: float = 5.0  # seconds between a node agent's reads of its peers
    # profiles whose instances hear of a reclaim -> the agent's arguments that read it
    notice_providers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    regions: Mapping[str, str] = field(default_factory=dict)  # profile -> its region


@dataclass(frozen=True, kw_only=True)
class ProvisionerPorts:
    store: NodeStore
    clouds: Mapping[str, Cloud]
    mesh: Mesh
    connector: Connector
    scheduler: Scheduler
    ledger: Ledger  # spools while the database is away: never blocks a step
    clock: Clock
    metrics: Metrics | None = None
    staging: NodeStaging | None = None  # pulls jobs' staged data as a step of the join
    outputs: Outputs | None = None  # jobs' stage-outs: a node is released once they are home
    views: Mapping[str, FleetView] = field(default_factory=dict)  # provider -> its listing
    runtime: RuntimeCheck | None = None  # groups with a runtime_manifest: checked on join
    images: Images | None = None  # groups' container images: loaded on join


@dataclass(frozen=True, kw_only=True)
class ProvisionerServices:
    """The services a node's steps ask (wiring builds each once and hands it in)."""

    launcher: Launcher  # candidates, batches, fallback
    lifecycle: Lifecycle  # the one writer of node records
    instances: InstanceLog  # the ledger's instance events
    joined: Callable[[str], None] | None = None  # slurmd started: watch it register


class Provisioner:
    def __init__(
        self,
        settings: ProvisionerSettings,
        ports: ProvisionerPorts,
        secrets: Secrets,
        services: ProvisionerServices,
        *,
        stopping: threading.Event,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.fleet = settings.fleet
        self.slurm_release = settings.slurm_release
        self.joined = services.joined or (lambda name: None)
        self.store = ports.store
        self.clouds = ports.clouds
        self.mesh = ports.mesh
        self.connector = ports.connector
        self.scheduler = ports.scheduler
        self.ledger = ports.ledger
        self.secrets = secrets
        self.clock = ports.clock
        self.stopping = stopping  # the daemon is stopping: waits end, state stays
        self.metrics = ports.metrics
        self.staging = ports.staging
        self.outputs = ports.outputs
        self.views = ports.views
        self.runtime = ports.runtime
        self.images = ports.images
        self.rand = rand
        self._attesting: dict[str, _Attest] = {}  # node -> its instance's host-key reads
        self._console_lock = threading.Lock()  # the three below, shared by the workers
        self._console_delays: dict[str, list[float]] = {}  # provider -> recent seconds
        self._scouts: dict[str, set[str]] = {}  # provider -> nodes reading before any keys
        self._parked: dict[str, set[str]] = {}  # provider -> nodes waiting for a scout
        self.wake: Callable[[Sequence[str]], None] = lambda names: None  # the workers' wake
        self._throttled: dict[str, int] = {}  # node -> throttled looks in a row
        # spot nodes a sibling of their job fell back before (node -> its launch_seq): they
        # follow it at once, so that the job's nodes are relaunched together
        self._spot_follow: dict[str, int] = {}
        self._spot_lock = threading.Lock()
        self.launcher = services.launcher
        self.lifecycle = services.lifecycle
        self.instances = services.instances
        node_files = resources.files("slurm_burst.node")
        self.script = node_files.joinpath("bootstrap.sh").read_bytes()
        self.gpucheck = node_files.joinpath("gpucheck.py").read_bytes()
        self.agent = node_files.joinpath("agent.py").read_bytes()
        self._released: list[str] = []  # nodes let go with a failed job, for the workers
        self._released_lock = threading.Lock()

    # -- the driver ---------------------------------------------------------------
    def drive(self, name: str, *, blocking: bool = True, join: bool = True) -> NodeRecord | None:
        """Advance ``name`` until it is where ``want`` says, or failed and torn down.

        ``blocking`` False (the daemon's workers): a step that must wait raises
        :class:`Later`, and one about to bootstrap without a slot (``join`` False)
        :class:`NeedsJoinSlot`; True: waits are slept here (tests, one-off callers)."""
        while True:
            try:
                return self._drive(name, join or blocking)
            except Later as later:
                if not blocking:
                    raise
                self.clock.sleep(later.seconds)
            except Relaunch:
                if not blocking:
                    raise  # else this caller launches it, on its own

    def _drive(self, name: str, join: bool) -> NodeRecord | None:
        while True:
            rec = self.store.node(name)
            if rec is None:
                return None
            if rec.want == Want.DOWN or rec.state in (NodeState.FAILED, NodeState.TERMINATING):
                if rec.state == NodeState.JOINED and rec.want == Want.DOWN and self._holding(rec):
                    if self.stopping.is_set():
                        return None  # held: the next daemon takes it up
                    continue  # looked at again: a resume meanwhile keeps the instance
                if rec.state != NodeState.TERMINATED:
                    failed = rec.state == NodeState.FAILED or rec.error == JOB_FAILED
                    self._teardown(rec)
                    if failed:
                        self.power_down_force(name)
                    continue
                return rec
            if rec.state == NodeState.JOINED:
                return rec
            if rec.state == NodeState.TERMINATED:
                self.lifecycle.asked_again(rec)
                continue
            try:
                if rec.state in (NodeState.REQUESTED, NodeState.LAUNCHING):
                    self.launcher.launch_one(rec, self._group(rec))
                elif rec.state == NodeState.BOOTING:
                    self._boot(rec)
                elif not join:
                    raise NeedsJoinSlot()
                else:
                    self._bootstrap(rec)
                self._throttled.pop(name, None)
            except Cancelled:
                if self.stopping.is_set():
                    log.info("node.paused node=%s state=%s (daemon stopping)", name, rec.state)
                    return None
                log.info("node.cancelled node=%s state=%s (want down)", name, rec.state)
            except (TransitionError, BadInput):  # a bug or a race, not this node's fault:
                raise  # the worker's boundary logs it; the node is looked at again
            except ThrottledError as exc:  # never a failure while the node has time left
                if self.stopping.is_set():
                    return None
                left = self._time_left(rec, exc)
                if left > 0:  # looked at again before the node runs out of time
                    raise Later(min(self._throttle_wait(name, exc), left)) from exc
                self._fail(rec, exc.code, str(exc))
            except BurstError as exc:  # cloud, SSH, hub, Slurm, state store, a step
                if not self._replace(rec, exc.code, str(exc)):
                    self._fail(rec, exc.code, str(exc))
            except OSError as exc:  # the controller's own disk, sockets, processes
                self._fail(rec, "InternalError", f"{type(exc).__name__}: {exc}")

    def _throttle_wait(self, name: str, exc: ThrottledError) -> float:
        if isinstance(exc, Busy):
            return exc.after
        tries = self._throttled[name] = self._throttled.get(name, 0) + 1
        return backoff(min(tries, 10), *THROTTLE_BACKOFF, self.rand())

    def _time_left(self, rec: NodeRecord, exc: ThrottledError) -> float:
        """Seconds a throttled node may still wait (<= 0: it fails): a throttled call
        fails its node only once the node is out of time, Slurm's ResumeTimeout (the
        boot timeout where none is known) less a fifth of bootstrap_timeout for the
        join still to come."""
        started = rec.requested_at or rec.state_since
        limit = self.settings.resume_timeout or self.settings.boot_timeout
        left = started + limit - self.settings.bootstrap_timeout / 5 - self.clock.now()
        if left > 0:
            log.info("node.throttled node=%s state=%s code=%s left=%.0f",
                     rec.name, rec.state, exc.code, left)  # fmt: skip
        return left

    def address_early(self, names: Sequence[str]) -> None:
        """Give newly requested nodes their mesh address, and Slurm their NodeAddr, now.

        Until a node's NodeAddr is set it is the node's name, which a cloud node's name
        seldom resolves to: every slurmctld message to a node powering up (``scontrol
        reconfigure`` sends one to each) would then spend ~10 s in getaddrinfo, holding
        up slurmctld. The mesh address fails at once until the node's peer is up (the
        hub routes unpeered addresses unreachable). One ``scontrol update`` for all;
        the bootstrap's ``nodeaddr`` step sets the same again. Best effort: a failure
        here is repeated, and reported, by that step.
        """
        try:  # a full pool gives the first ones theirs; the rest fail in bootstrap
            given = self.store.allocate_addresses(names, self.settings.mesh_subnet,
                                                  self.clock.now())  # fmt: skip
        except StoreError as exc:  # the database busy past its timeout: bootstrap does it
            log.warning("node.address_early_failed count=%d error=%s", len(names), exc)
            return
        if len(given) < len(names):
            log.warning("node.address_early_pool_full without=%d", len(names) - len(given))
        named, addrs = list(given), list(given.values())
        if not named:
            return
        try:
            self.scheduler.update_nodes(named, addrs=addrs, hostnames=named)
        except SchedulerError as exc:
            log.warning("node.nodeaddr_early_failed count=%d error=%s", len(named), exc)

    # -- steps --------------------------------------------------------------------
    def _group(self, rec: NodeRecord) -> NodeGroup:
        group = self.fleet.group_of(rec.name)
        if group is None:
            raise StepError("NotConfigured", f"{rec.name} is in no node group of the config")
        return group

    def _instance_fault(self, rec: NodeRecord, fault: str) -> None:
        """An instance the provider accepted and then put in error (OpenStack: the
        scheduler found no host). A capacity fault cools the size down, as a capacity
        error at launch does: Slurm's next resume of the node lands on the next size."""
        err = classify(fault)
        if isinstance(err, CapacityError):
            self.launcher.size_unavailable(rec.name, rec.provider, cooled(rec.size, rec.market),
                                           err)  # fmt: skip
        raise StepError(err.code if err.code != CloudError.code else "InstanceError", fault)

    def _boot(self, rec: NodeRecord) -> None:
        """Two steps, each looked at again later (:class:`Later`) while not done, holding
        no thread meanwhile: ``boot`` (launched -> running with an address: the shared
        fleet listing where the provider has one, else one describe a look) and
        ``attest`` (running -> its SSH host keys read through the provider's API: one
        read at the time the console is expected, then jittered backoff)."""
        deadline = rec.state_since + self.settings.boot_timeout
        self._check_want(rec.name)
        seen = self._attesting.get(rec.name)
        if seen is None or seen.instance_id != rec.instance_id:
            inst = self._running(rec)
            if inst is None:
                if self._spot_waited(rec):
                    raise Relaunch()
                if self.clock.now() > deadline:
                    self._stepped(rec.name, "boot", self.clock.now() - rec.state_since, ok=False)
                self._past(deadline, "BootTimeout", f"instance {rec.instance_id} not running")
                view = self.views.get(rec.provider)
                raise Later(view.next_in() + 0.1 if view else POLL)
            now = self.clock.now()
            self._stepped(rec.name, "boot", now - rec.state_since)
            seen = _Attest(rec.instance_id, inst.address, inst.size, now, None)
            self._attesting[rec.name] = seen
        now = self.clock.now()
        if seen.next_read is None:
            seen.next_read = self._first_read(rec, seen.running_at)
            if seen.next_read is None:
                raise Later(PARKED_WAIT)
        if now < seen.next_read:
            raise Later(seen.next_read - now)
        if seen.asked is None:
            seen.asked = now
        try:
            keys = self.clouds[rec.provider].host_keys(rec.instance_id, seen.size)
        except Busy as exc:  # our budget's turn comes later: no call was made
            raise Later(exc.after) from exc
        seen.reads += 1
        asked, seen.asked = seen.asked, None
        if not keys:
            if now > deadline:
                self._stepped(rec.name, "attest", now - seen.running_at, ok=False)
            self._past(
                deadline,
                "HostKeyTimeout",
                f"instance {rec.instance_id} runs but published no SSH host keys",
            )
            with self._console_lock:
                scout = rec.name in self._scouts.get(rec.provider, ())
            most = SCOUT_POLL_MAX if scout else ATTEST_POLL_MAX
            wait = min(most, ATTEST_RETRY * 2 ** (seen.reads - 1))
            seen.next_read = now + wait * (0.5 + 0.5 * self.rand())
            raise Later(seen.next_read - now)
        del self._attesting[rec.name]
        self._stepped(rec.name, "attest", now - seen.running_at)
        took = asked - seen.running_at
        # an empty read before this one, or a first one made at once: the keys came
        # in between; a later first read that found them says only "no later than
        # this" (the estimate it was made at), which teaches nothing
        tight = seen.reads > 1 or took <= ATTEST_RETRY
        self._console_seen(rec.provider, rec.name, took if tight else None)
        self.instances.record(rec, rec.instance_id, "running", now)
        self.lifecycle.bootstrapping(rec.name, seen.address, keys)

    def _spot_waited(self, rec: NodeRecord) -> bool:
        """A spot launch whose capacity has not come within its group's
        ``spot_fallback_after``: the spot size cooled down (as a refusal cools it), the
        pending instance let go, and the node asked for anew, on the fallback group's
        on-demand capacity; True if so."""
        group = self._group(rec)
        waited = self.clock.now() - rec.state_since
        with self._spot_lock:
            follows = self._spot_follow.pop(rec.name, None) == rec.launch_seq
        if rec.market != SPOT or not group.spot_fallback:
            return False
        if waited < group.spot_fallback_after and not follows:
            return False
        exc = CapacityError(
            f"spot capacity for {rec.provider}/{rec.size} did not arrive within "
            f"{group.spot_fallback_after:g} s",
            SPOT_WAIT_CODE,
        )
        self.launcher.size_unavailable(rec.name, rec.provider, cooled(rec.size, SPOT), exc)
        log.warning("node.spot_fallback node=%s waited=%.0f instance=%s fallback=%s",
                    rec.name, waited, rec.instance_id, group.spot_fallback)  # fmt: skip
        self.lifecycle.errored(rec.name, SPOT_WAIT_CODE, str(exc))
        self._teardown(self.store.node(rec.name) or rec, replacing=True)
        again = self.store.node(rec.name)
        if again is not None and again.want == Want.UP:
            self.lifecycle.asked_again(again)
        if not follows:  # the first of its job: the others, launched with it, follow now
            siblings = self._spot_siblings(rec)
            with self._spot_lock:
                self._spot_follow.update((s.name, s.launch_seq) for s in siblings)
            self.wake([s.name for s in siblings])
        return True

    def _spot_siblings(self, rec: NodeRecord) -> list[NodeRecord]:
        """The other nodes of ``rec``'s jobs in its group still booting on spot: launched
        with it, they wait for the same capacity (their clocks differ by how far apart
        their records were written, a second on a loaded controller: more than the
        relaunch's gathering, and the job would be launched in two)."""
        names = {n for nodes in nodes_by_job(rec.job_list()).values() for n in nodes}
        out = []
        for name in sorted(names - {rec.name}):
            sib = self.store.node(name)
            if (sib is not None and sib.group == rec.group and sib.market == SPOT
                    and sib.state == NodeState.BOOTING and sib.want == Want.UP):  # fmt: skip
                out.append(sib)
        return out

    def _first_read(self, rec: NodeRecord, running_at: float) -> float | None:
        """When to read a running instance's console first: once as long has passed as
        three in four of its provider's recent instances took to print their host keys
        (a read before that is almost always wasted, and costs the account's budget).
        With nothing learned yet, :data:`SCOUTS` nodes read at once and back off; the
        rest are parked (None) until the first of them has its keys."""
        with self._console_lock:
            seen = sorted(self._console_delays.get(rec.provider, ()))
            if seen:
                return running_at + seen[(3 * len(seen)) // 4]
            scouts = self._scouts.setdefault(rec.provider, set())
            if len(scouts) < SCOUTS or rec.name in scouts:
                scouts.add(rec.name)
                return self.clock.now()
            self._parked.setdefault(rec.provider, set()).add(rec.name)
            return None

    def _console_seen(self, provider: str, node: str, seconds: float | None) -> None:
        """An instance's host keys were read ``seconds`` after it ran (as due, not as
        our API budget let the read through: a queue of readers must not teach the
        next ones to wait longer); None: a first read found them, which bounds nothing
        new (the estimate it was made at stands)."""
        with self._console_lock:
            recent = self._console_delays.setdefault(provider, [])
            if seconds is not None:
                recent.append(seconds)
                del recent[:-CONSOLE_SAMPLES]
            self._scouts.get(provider, set()).discard(node)
            parked = self._parked.pop(provider, set())
        if parked:
            self.wake(sorted(parked))

    def _stepped(self, node: str, step: str, seconds: float, ok: bool = True) -> None:
        """A step that spanned several looks: logged, and observed if it succeeded, as
        :meth:`_timed` does."""
        log.info("node.step node=%s step=%s seconds=%.2f", node, step, seconds)
        if ok and self.metrics is not None:
            self.metrics.step(step, seconds)

    def _past(self, deadline: float, code: str, what: str) -> None:
        if self.clock.now() > deadline:
            raise StepError(code, f"{what} after {self.settings.boot_timeout:g} s")

    def _running(self, rec: NodeRecord) -> Instance | None:
        """The instance once it runs with an address; None while it boots."""
        view = self.views.get(rec.provider)
        inst: Instance | None
        if view is not None:
            looked = view.look(rec.instance_id, rec.state_since)
            if looked is None:
                view.watch(rec.instance_id, rec.name, rec.state_since)
                return None
            inst = None if isinstance(looked, str) else looked  # str: GONE
        else:
            inst = self.clouds[rec.provider].get(rec.instance_id)
        if inst is not None and inst.state == "error" and inst.fault:
            self._instance_fault(rec, inst.fault)
        if inst is None or inst.state in ("terminated", "error", "stopped"):
            if view is not None:
                view.unwatch(rec.instance_id)
            raise StepError(
                "InstanceVanished",
                f"instance {rec.instance_id} is {inst.state if inst else 'gone'}",
            )
        if inst.state == "running" and inst.address:
            if view is not None:
                view.unwatch(rec.instance_id)
            return inst
        if view is not None:
            view.watch(rec.instance_id, rec.name, rec.state_since)
        return None

    def _bootstrap(self, rec: NodeRecord) -> None:
        iface = self.settings.mesh_interface
        net = ipaddress.ip_network(self.settings.mesh_subnet)
        hub_ip = hub_address(self.settings.mesh_subnet)
        remaining = rec.state_since + self.settings.bootstrap_timeout - self.clock.now()
        deadline = self.clock.monotonic() + max(remaining, 5.0)
        keys = rec.host_key_list()
        with self._timed(rec.name, "ssh"):
            sh = self.connector.connect(rec.ip, keys, deadline)
        try:
            with self._timed(rec.name, "script"):
                sh.put(self.script, REMOTE_SCRIPT, 0o700)
            slurmd = self._check_slurmd_version(sh) if self.slurm_release else None
            group = self._group(rec)
            if group.gpus and group.gpu_check:
                with self._timed(rec.name, "gpu-check"):
                    self._check_gpus(sh, rec, group)
            if group.runtime_manifest and self.runtime is not None:
                with self._timed(rec.name, "runtime"):
                    self.runtime.check(sh, rec, group, self._step)
            with self._timed(rec.name, "wg-key"):
                pub = self._step(sh, "wg-key", iface).strip()
            if len(pub) != 44 or not pub.endswith("="):
                raise StepError("WireGuardKey", "the node did not return a WireGuard public key")
            with _as_step("MeshPoolFull", PoolExhausted):
                addr = self.store.allocate_address(
                    rec.name, self.settings.mesh_subnet, self.clock.now()
                )
            self.lifecycle.meshed(rec.name, pub, addr)
            with (
                self._timed(rec.name, "hub-peer"),
                _as_step("HubPeer", MeshError),
            ):
                self.mesh.add_peer(pub, addr, rec.name)
            routes = (
                []
                if ipaddress.ip_address(self.settings.controller_addr) in net
                else [f"{self.settings.controller_addr}/32"]
            )
            conf = self.mesh.node_config([str(net), *routes])
            conf_path = f"/etc/wireguard/{iface}-hub.conf"
            with self._timed(rec.name, "wg-up"):
                sh.put(conf.encode(), conf_path, 0o600)
                self._step(sh, "wg-up", iface, f"{addr}/{net.prefixlen}", conf_path, *routes)
                self._wait_handshake(rec.name, pub, deadline)
            direct = group.cloud_to_cloud == "wireguard"
            notices = self.settings.notice_providers.get(rec.provider, ()) if group.spot else ()
            if direct or notices:
                with self._timed(rec.name, "agent"):
                    self._start_agent(sh, addr, direct, notices)
            if group.images:  # before anything a job needs: no job pulls at its start
                if self.images is None:
                    raise StepError("ImagePull", "images need staging.store (config check)")
                with self._timed(rec.name, "images"):
                    self.images.load(sh, rec, group, deadline, self._step)
            with self._timed(rec.name, "munge"):
                uid, gid = (int(x) for x in self._step(sh, "munge-dirs").strip().split(":"))
                sh.put(self.secrets.munge_key, "/etc/munge/munge.key", 0o400, (uid, gid))
                self._step(sh, "munge-start", self.settings.munge_socket)
            facts = self._instance(rec, group, slurmd)
            with (
                self._timed(rec.name, "nodeaddr"),
                _as_step("NodeAddr", SchedulerError),
            ):
                self.scheduler.update_nodes(
                    [rec.name], addrs=[addr], hostnames=[rec.name], comment=facts.comment
                )
            if facts.instance is not None:  # for the record: a refusal fails no join
                try:
                    self.scheduler.update_nodes([rec.name], instance=facts.instance)
                except SchedulerError as exc:
                    log.warning("node.instance_not_recorded node=%s error=%s", rec.name, exc)
            self._check_want(rec.name)
            gpu = self.settings.gpu
            if gpu.health_check_program:  # slurmd runs it once before it registers
                checked = group.gpus and group.gpu_check
                self._step(
                    sh, "health-check", gpu.health_check_program, gpu.health_check_chain,
                    *([gpu.node_python] if checked else []),
                )  # fmt: skip
            if self.staging is not None:  # the job's data, whole and verified, before slurmd
                with self._timed(rec.name, "stage-in"):
                    self.staging.pull(sh, rec, deadline, lambda: self._check_want(rec.name))
            with self._timed(rec.name, "slurmd"):
                args = (*dynamic_slurmd_args(group), *facts.slurmd_args)
                self._step(sh, "slurmd-start", rec.name, hub_ip, *args)
        finally:
            sh.close()
        self.instances.record(rec, rec.instance_id, "joined", self.clock.now())
        self.lifecycle.joined(rec.name)
        self.joined(rec.name)
        self.store.group_launch_result(rec.group, ok=True)
        took = self.clock.now() - rec.requested_at
        if self.metrics is not None and rec.requested_at > 0:
            self.metrics.joined(rec.group, took)
        log.info("node.joined node=%s mesh_addr=%s total_seconds=%.1f", rec.name, addr, took)

    def _start_agent(
        self, sh: RemoteShell, addr: str, direct: bool, notices: tuple[str, ...]
    ) -> None:
        """The node agent (node/agent.py), over the tunnel just made: direct tunnels to
        the node's cloud peers, read from the daemon's node API; the provider's
        interruption notice (``notices``: the agent's arguments that read it), passed on
        to it."""
        s = self.settings
        args = ["--iface", s.mesh_interface,
                "--api", f"http://{hub_address(s.mesh_subnet)}:{s.mesh_api_port}"]  # fmt: skip
        if direct:
            args += ["--direct", f"{s.mesh_interface[:12]}-d", "--address", addr,
                     "--port", str(s.mesh_node_port),
                     "--interval", f"{s.mesh_sync_interval:g}"]  # fmt: skip
        args += notices
        sh.put(self.agent, AGENT, 0o644)
        self._step(sh, "agent-start", "python3", *args)

    def _instance(self, rec: NodeRecord, group: NodeGroup, slurmd: str | None) -> _Facts:
        """What Slurm is told of the node's instance: on 23.11+ its InstanceId,
        InstanceType and Extra (the provider, region, market and price), which
        ``sacctmgr show instance`` lists, both with ``scontrol update`` before slurmd
        starts and with slurmd's own flags: 26.05 takes slurmd's only from a node whose
        boot time is after slurmctld last heard from it, which a powering-up node never
        is (``validate_node_specs`` sets ``last_response`` first), and a 23.11 to 25.05
        slurmd started without them would clear them at its first registration.
        Before 23.11, the node's comment (after the spot fallback's, which it keeps).
        Nothing where slurmd's release is not checked (``slurm_release`` unset)."""
        if slurmd is None or not rec.instance_id:
            return _Facts()
        region = self.settings.regions.get(rec.provider, "")
        market = "spot" if rec.market else "on-demand"
        if records_instances(slurmd):
            if not (_SLURM_WORD.fullmatch(rec.instance_id) and _SLURM_WORD.fullmatch(rec.size)):
                return _Facts()  # scontrol reads InstanceId as a hostlist: no ',' or '['
            price = group.price_per_hour.get(rec.size)
            extra = instance_extra(rec.provider, region, market, group.name, price)
            args = ("--instance-id", rec.instance_id, "--instance-type", rec.size,
                    "--extra", extra)  # fmt: skip
            return _Facts(slurmd_args=args, instance=(rec.instance_id, rec.size, extra))
        said = instance_comment(rec.instance_id, rec.size, rec.provider, region, market)
        if self.launcher.on_fallback(rec):
            said = f"{FELL_BACK} {rec.size}; {said}"
        return _Facts(comment=said)

    def _check_slurmd_version(self, sh: RemoteShell) -> str:
        """Refuse an image whose slurmd cannot join this slurmctld (newer, or older than
        Slurm's mixed-version window) before anything else is set up on it; its release."""
        assert self.slurm_release is not None
        said = self._step(sh, "slurmd-version").strip()
        try:
            found = release_of(said)
        except ValueError as exc:
            raise StepError("SlurmdVersion", f"slurmd -V said {said[:80]!r}") from exc
        problem = mixed_version_problem(self.slurm_release, found)
        if problem:
            raise StepError(
                "SlurmdVersion", f"{problem}: use an image of Slurm {self.slurm_release}"
            )
        return found

    def _check_gpus(self, sh: RemoteShell, rec: NodeRecord, group: NodeGroup) -> None:
        """The GPU check (``node/gpucheck.py``) against what the group promises: a node
        that fails it never joins (GpuUnhealthy). It stays on the node, with its
        expectation file, as the HealthCheckProgram's check when one is configured."""
        gpu = self.settings.gpu
        expect = {
            "count": group.gpus,
            "files": group.gpu_device_files(),
            "model": group.gpu_model,
            "driver": group.gpu_driver,
            "cuda": group.gpu_cuda,
            "critical_xids": list(gpu.critical_xids),
            "chain": gpu.health_check_chain,
            "kernel_log": gpu.kernel_log,
        }
        self._step(sh, "gpu-prepare")
        sh.put(self.gpucheck, GPU_CHECK, 0o644)
        sh.put(json.dumps(expect).encode(), GPU_EXPECT, 0o644)
        said = self._step(sh, "gpu-check", gpu.node_python)
        try:
            report = read_json(said.strip().splitlines()[-1], "the GPU check's report")
            problems = [str(p) for p in report["problems"]]
            ok = report["ok"] is True and not problems
        except (ValueError, IndexError, KeyError, TypeError, RecursionError):
            raise StepError("GpuUnhealthy", f"the GPU check said {said.strip()[:200]!r}") from None
        if not ok:
            detail = "; ".join(problems) or "unhealthy"
            self.store.event(self.clock.now(), "node.gpu_unhealthy", rec.name, detail)
            raise StepError("GpuUnhealthy", detail)
        log.info(
            "node.gpu_check_ok node=%s gpus=%d driver=%s seconds=%s",
            rec.name, len(report.get("gpus", ())), report.get("driver"), report.get("seconds"),
        )  # fmt: skip

    def _timed(self, node: str, step: str) -> AbstractContextManager[None]:
        """``step`` of ``node`` timed: logged, and observed in the metrics if it succeeds."""
        return timed(self.clock, node, step, self.metrics)

    def _step(self, sh: RemoteShell, step: str, *args: str) -> str:
        """Run one step of the node's bootstrap script: a failed command is
        ``Bootstrap.STEP``; a lost session keeps its own code (SshUnreachable...)."""
        try:
            return sh.run(["sh", REMOTE_SCRIPT, step, *args], timeout=60)
        except RemoteError as exc:
            code = f"Bootstrap.{step}" if exc.code == "RemoteCommand" else exc.code
            raise StepError(code, str(exc)) from exc

    def _diagnose(self, rec: NodeRecord) -> None:
        """Log what the node says about its slurmd before it is terminated (its logs go
        with it): the one chance to see why it never registered. Best effort, bounded."""
        try:
            sh = self.connector.connect(
                rec.ip, rec.host_key_list(), self.clock.monotonic() + DIAGNOSE_WAIT
            )
            try:
                said = sh.run(["sh", REMOTE_SCRIPT, "diagnose", rec.name], timeout=DIAGNOSE_WAIT)
            finally:
                sh.close()
        except RemoteError as exc:  # the node may be gone: that is worth saying, not failing
            log.warning("node.diagnose_failed node=%s error=%s", rec.name, exc)
            return
        log.warning("node.diagnosis node=%s code=%s\n%s", rec.name, rec.error, said.strip())

    def _wait_handshake(self, name: str, pub: str, deadline: float) -> None:
        limit = min(deadline, self.clock.monotonic() + HANDSHAKE_WAIT)
        while self.clock.monotonic() < limit:
            if any(p.public_key == pub and p.latest_handshake for p in self.mesh.peers()):
                return
            self.clock.sleep(0.2)
        raise StepError("WireGuardHandshake", f"{name}: no WireGuard handshake with the hub")

    # -- teardown -----------------------------------------------------------------
    def _holding(self, rec: NodeRecord) -> bool:
        """A suspended node whose jobs' outputs are not home yet is held (at most
        staging.release_deadline) until they are; True if it was held."""
        if self.outputs is None or not self.outputs.holding(rec.name):
            return False
        self.outputs.hold(rec, self.stopping.is_set)
        return True

    def _teardown(self, rec: NodeRecord, replacing: bool = False) -> None:
        """Everything of the node's instance let go; ``replacing``: its want (up, unless
        a suspend came meanwhile) stays, for a new instance."""
        name = rec.name
        self._attesting.pop(name, None)
        self._throttled.pop(name, None)
        with self._console_lock:
            self._scouts.get(rec.provider, set()).discard(name)
            self._parked.get(rec.provider, set()).discard(name)
        view = self.views.get(rec.provider)
        if view is not None and rec.instance_id:
            view.unwatch(rec.instance_id)
        rec = self.lifecycle.terminating(rec, replacing)
        if rec.error in DIAGNOSED and rec.ip:
            self._diagnose(rec)
        with self._timed(name, "teardown"):
            if rec.instance_id and rec.provider:
                self.clouds[rec.provider].terminate(rec.instance_id)
            if rec.wg_pubkey:
                self.mesh.remove_peer(rec.wg_pubkey)
            released = self.store.release_address(name)  # given at the request, or bootstrap
            # our comment (the fallback's, the instance's before 23.11) goes with the instance
            cleared = "" if rec.instance_id else None
            if released or rec.mesh_addr:
                try:  # NodeAddr parked: nothing points at a released address
                    park = parking_address(self.settings.mesh_subnet)
                    self.scheduler.update_nodes([name], addrs=[park], hostnames=[name],
                                                comment=cleared)  # fmt: skip
                except SchedulerError as exc:
                    log.warning("node.nodeaddr_reset_failed node=%s error=%s", name, exc)
            elif cleared is not None:
                try:
                    self.scheduler.update_nodes([name], comment=cleared)
                except SchedulerError as exc:
                    log.warning("node.comment_failed count=1 error=%s", exc)
            if rec.instance_id:
                now = self.clock.now()
                self.instances.record(rec, rec.instance_id, "terminated", now, rec.error)
        self.lifecycle.terminated(name)

    def _fail(self, rec: NodeRecord, code: str, message: str) -> None:
        log.error(
            "node.failed node=%s state=%s code=%s error=%s", rec.name, rec.state, code, message
        )
        self.lifecycle.failed(rec.name, code, message)
        if rec.instance_id:  # the code first: reports read it back as the failure's code
            said = f"{code}: {message}" if message else code
            self.instances.record(rec, rec.instance_id, "failed", self.clock.now(), said[:512])
        # a node that joined and registered was a good launch: what fails it later (a GPU
        # that went bad, a spot reclaim) says nothing about the group's launches
        served = rec.state == NodeState.JOINED and rec.registered_at > 0
        if code not in NOT_LAUNCH_FAILURES and not served:
            failures = self.store.group_launch_result(rec.group, ok=False)
            log.info("group.failures group=%s in_a_row=%d", rec.group, failures)
        if self.metrics is not None:
            self.metrics.failed(rec.group, code)
        try:
            self.scheduler.update_nodes([rec.name], state="down", reason=reason(code, message))
        except SchedulerError as exc:
            log.warning("node.mark_down_failed node=%s error=%s", rec.name, exc)
        group = self.fleet.group_of(rec.name)
        if group is not None and group.all_or_nothing == "job":
            self._release_job_of(rec, code)

    def _replace(self, rec: NodeRecord, code: str, message: str) -> bool:
        """Give ``rec`` a new instance under its name instead of failing it; True if so.

        Only for a node one of whose jobs has a stage record (a burst-buffer job),
        whose instance ran and then failed with one of ``INSTANCE_FAULTS``, once per
        resume, and only while half of Slurm's ResumeTimeout is left (the new instance
        gets as long as the first took). Slurm then sees nothing fail: the node stays
        powering up, its job configuring. Failing the node instead would requeue the
        job, and Slurm's burst_buffer/lua never starts a requeued job whose stage-in
        thread was waiting for its nodes (docs/staging.md). The failed instance still
        counts: in the ledger, the metrics, the group's failures in a row."""
        limit = self.settings.resume_timeout
        if (
            limit <= 0
            or rec.state not in (NodeState.BOOTING, NodeState.BOOTSTRAPPING)
            or not (code in INSTANCE_FAULTS or code.startswith("Bootstrap."))
            or not any(self.store.stage(j) for j in job_ids(rec.job_list()))
        ):
            return False
        was = self.store.replaced(rec.name)
        if was is not None and was[1] == rec.requested_at:
            return False  # this is the new instance already: once per resume
        spent = self.clock.now() - (rec.requested_at or rec.state_since)
        if 2 * spent > limit:
            return False
        log.error("node.replaced node=%s state=%s code=%s seconds=%.1f error=%s",
                  rec.name, rec.state, code, spent, message)  # fmt: skip
        self.store.event(self.clock.now(), "node.replaced", rec.name, f"{code}: {message}"[:500])
        self.lifecycle.errored(rec.name, code, message)
        rec = self.store.node(rec.name) or rec
        if rec.instance_id:
            self.instances.record(rec, rec.instance_id, "failed", self.clock.now(), code)
        failures = self.store.group_launch_result(rec.group, ok=False)
        log.info("group.failures group=%s in_a_row=%d", rec.group, failures)
        if self.metrics is not None:
            self.metrics.failed(rec.group, code)
        self._teardown(rec, replacing=True)
        now = self.store.node(rec.name)
        if now is None or now.want != Want.UP:  # suspended meanwhile: it stays down
            return True
        # the new instance is billed from now, the old one until now
        again = self.lifecycle.asked_again(rec)
        self.store.set_replaced(rec.name, rec.requested_at, again)
        return True

    def _release_job_of(self, failed: NodeRecord, code: str) -> None:
        """Let go of the other nodes of ``failed``'s jobs: the job is requeued (or, if it
        cannot be, ended) by Slurm now that ``failed`` is DOWN, so they would boot and
        join for nothing. A node also serving a job that is not failing stays."""
        jobs = failed.job_list()
        nodes_of_job = nodes_by_job(jobs)
        jobs_of = {failed.name: job_ids(jobs)}
        records = {}
        for n in {n for nodes in nodes_of_job.values() for n in nodes} - {failed.name}:
            sib = self.store.node(n)
            if sib is not None:
                records[n] = sib
                jobs_of[n] = job_ids(sib.job_list())
        lost = ",".join(str(j) for j in sorted(jobs_of[failed.name]))
        for name in released_with(failed.name, jobs_of, nodes_of_job):
            sib = records[name]
            if sib.want != Want.UP or sib.state in (
                NodeState.TERMINATED, NodeState.TERMINATING, NodeState.FAILED,
            ):  # fmt: skip
                continue
            message = f"job {lost} lost {failed.name} ({code})"
            self.lifecycle.released(name, JOB_FAILED, message)
            log.warning("node.released node=%s job=%s failed=%s code=%s",
                        name, lost, failed.name, code)  # fmt: skip
            with self._released_lock:
                self._released.append(name)

    def take_released(self) -> list[str]:
        """Nodes released with a failed job since the last call: they need a worker."""
        with self._released_lock:
            out, self._released = self._released, []
        return out

    def fail(self, name: str, code: str, message: str) -> bool:
        """Fail ``name`` from outside its worker (the reconcile loop); False if nothing to fail."""
        rec = self.store.node(name)
        if rec is None or rec.state in (NodeState.TERMINATED, NodeState.FAILED):
            return False
        self._fail(rec, code, message)
        return True

    def power_down_force(self, name: str) -> None:
        """Return a node to service after a failed resume (Slurm may try it again)."""
        try:
            self.scheduler.update_nodes([name], state="power_down_force")
        except SchedulerError as exc:
            log.warning("node.power_down_force_failed node=%s error=%s", name, exc)

    # -- helpers --------------------------------------------------------------------
    def restore_peers(self) -> None:
        """Put every live node's peer on the hub (idempotent).

        After a takeover on another host the hub there has none of the leader's peers;
        the nodes' tunnels reconnect to the (floating) hub endpoint once their peers exist.
        """
        live = [r for r in self.store.nodes() if r.state in LIVE and r.wg_pubkey and r.mesh_addr]
        if not live:
            return
        try:
            present = {p.public_key for p in self.mesh.peers()}
            for r in live:
                if r.wg_pubkey not in present:
                    self.mesh.add_peer(r.wg_pubkey, r.mesh_addr, r.name)
                    log.info("daemon.peer_restored node=%s mesh_addr=%s", r.name, r.mesh_addr)
        except MeshError as exc:  # the reconcile pass reports the hub; provisioning goes on
            log.error("daemon.peer_restore_failed error=%s", exc)

    def _check_want(self, name: str) -> None:
        if self.stopping.is_set():
            raise Cancelled()
        rec = self.store.node(name)
        if rec is None or rec.want != Want.UP:
            raise Cancelled()
