"""The reconcile planner: one snapshot of the world and the clock in, a list of actions out.

Each pass the daemon observes Slurm, the clouds, the WireGuard hub, the ledger and
its own state database, and hands the snapshot to :func:`plan`. Pure: no I/O, no
clock of its own, so every rule below is a table-driven test.

A source that could not be read this pass is ``None`` in the snapshot, and every
rule that needs it is skipped (a Slurm outage must never look like "every node is
gone"). The rules, each logged as an event with the node and a code:

``Orphan``            a cloud instance tagged with our cluster that no live node
                      record owns (no record, a record in a dead state, or a record
                      owning another instance: a duplicate) is terminated once it has
                      been suspect for ``orphan_grace`` seconds.
``ResumeTimeout``     a node asked up for longer than Slurm's ResumeTimeout and still
                      not joined: marked DOWN with ``(Code:ResumeTimeout)`` so Slurm
                      requeues its jobs, then torn down and powered down.
``InstanceVanished``  a node bootstrapping or joined whose instance the provider no
                      longer lists as alive (spot reclaim, manual delete): the same.
``SlurmdNotRegistered`` a node joined (slurmd started over the mesh) that Slurm still
                      shows powering up ``register_timeout`` seconds later: slurmd
                      cannot reach slurmctld. Failed like ResumeTimeout, but sooner
                      and with the cause named.
``GpuUnhealthy``      a node joined that its HealthCheckProgram (the GPU check) drained,
                      once its jobs are done (drained and idle): torn down and powered
                      down, so the node's next resume gets another instance.
``SlurmPoweredDown``  a node we hold up while Slurm shows it powered down and not
                      powering up (a lost suspend, a slurmctld restart): torn down.
``StalePeer``         a hub peer whose key no live node holds, on two passes running.
``LeakedAddress``     a mesh address held by a node that is terminated, on two passes.
``LedgerOpen``        a ledger instance with no end whose instance is gone and that
                      no node holds: its ledger row is closed.
``HookRefusal``       a node a resume hook set DOWN because nobody could serve the
                      request (``DaemonDown``: the daemon was not running;
                      ``RequestNotRecorded``: neither the state database nor the spool
                      took it), which no live record now serves: returned to service
                      (resume, then power_down_force), so an outage of a minute does
                      not leave a burst partition DOWN. The executor first proves the
                      state database takes writes again.
``InstanceMismatch``  a joined node whose InstanceId in Slurm (its slurmd's
                      ``--instance-id``, 23.11+) is not the instance we launched for it,
                      on two passes running: reported once (an event), nothing changed.
``Protected``         a node group with ``protect_after`` failed launches in a row:
                      its nodes are set unavailable in Slurm; ``Unprotected`` after
                      ``protect_cooldown`` (or ``slurm-burst group enable``).

Garbage is acted on only after it was seen on an earlier pass too (``suspects``
carries first-seen times from pass to pass), so a resource created between two
reads of a pass is never mistaken for a leak. The daemon reads its own records
last for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from slurm_burst.core.cloud import NODE_TAG, TOKEN_TAG, Instance
from slurm_burst.core.mesh import Peer
from slurm_burst.core.nodestate import LIVE, RESUMING, NodeState, Want
from slurm_burst.core.records import GroupHealth
from slurm_burst.core.slurm import SlurmNode

DEAD_INSTANCE = frozenset({"terminated", "stopped", "error"})
GPU_DRAIN = "(Code:GpuUnhealthy)"  # the reason the node's HealthCheckProgram drains with


class Tracked(Protocol):
    """What the planner reads of a node record (the state database's row)."""

    @property
    def name(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def state(self) -> NodeState: ...
    @property
    def want(self) -> Want: ...
    @property
    def provider(self) -> str: ...
    @property
    def size(self) -> str: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def wg_pubkey(self) -> str: ...
    @property
    def requested_at(self) -> float: ...
    @property
    def state_since(self) -> float: ...
    @property
    def placement(self) -> str: ...


@dataclass(frozen=True)
class Policy:
    orphan_grace: float = 120.0
    resume_timeout: float = 600.0
    protect_after: int = 10
    protect_cooldown: float = 1800.0
    lost_resume_grace: float = 60.0
    register_timeout: float = 180.0


@dataclass(frozen=True)
class Snapshot:
    now: float
    records: Mapping[str, Tracked]
    slurm_nodes: Mapping[str, SlurmNode] | None = None  # burst nodes only
    slurm_all: Sequence[SlurmNode] = ()  # every node Slurm holds (a removed group's too)
    instances: Mapping[str, Sequence[Instance]] | None = None  # by provider; absent = unread
    peers: Sequence[Peer] | None = None
    addresses: Mapping[str, str] | None = None  # node -> mesh address
    ledger_open: Mapping[str, str] | None = None  # instance id -> node
    groups: Mapping[str, GroupHealth] = field(default_factory=dict)
    suspects: Mapping[str, float] = field(default_factory=dict)  # key -> first seen


@dataclass(frozen=True)
class Action:
    """One thing to do. ``kind`` names the executor; ``code`` goes into events/reasons."""

    kind: str  # terminate | fail_node | teardown | remove_peer | release_address | ...
    code: str
    node: str = ""
    target: str = ""  # instance id, peer key, address, group name
    provider: str = ""
    message: str = ""


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    suspects: dict[str, float]  # carried to the next pass


def plan(snap: Snapshot, policy: Policy) -> Plan:
    actions: list[Action] = []
    suspects: dict[str, float] = {}

    def suspect(key: str) -> float:
        """Seconds ``key`` has been suspect (0 on the pass it is first seen)."""
        first = snap.suspects.get(key, snap.now)
        suspects[key] = first
        return snap.now - first

    actions += _orphans(snap, policy, suspect)
    actions += _stuck_nodes(snap, policy, suspect)
    actions += _mesh(snap, suspect)
    actions += _ledger(snap)
    actions += _groups(snap, policy)
    actions += _refused(snap)
    actions += _instance_ids(snap, suspect, suspects)
    return Plan(tuple(actions), suspects)


def _instance_ids(
    snap: Snapshot, suspect: _Suspect, suspects: dict[str, float]
) -> Iterable[Action]:
    """A joined node whose slurmd told Slurm another instance than ours (23.11+): said
    once, on the second pass that sees it (a new instance's slurmd may not have
    registered yet on the first). Nothing is changed: which is right is for a person."""
    if snap.slurm_nodes is None:
        return
    for name, rec in snap.records.items():
        node = snap.slurm_nodes.get(name)
        if rec.state != NodeState.JOINED or node is None or not node.instance_id:
            continue
        if node.instance_id == rec.instance_id:
            continue
        key = f"instance-id:{name}:{node.instance_id}"
        said = f"{key}:said"
        if said in snap.suspects:
            suspects[said] = snap.suspects[said]
            suspect(key)
            continue
        if suspect(key) > 0:
            suspects[said] = snap.now
            yield Action(
                "report",
                "InstanceMismatch",
                name,
                target=node.instance_id,
                message=f"Slurm's InstanceId is {node.instance_id}, the node's instance "
                f"is {rec.instance_id or 'none'}",
            )


# The reasons a resume hook sets nodes DOWN with when it cannot hand the request on.
HOOK_REFUSALS = ("(Code:DaemonDown)", "(Code:RequestNotRecorded)")


def _refused(snap: Snapshot) -> Iterable[Action]:
    if snap.slurm_nodes is None:
        return
    for node in snap.slurm_nodes.values():
        if node.state != "down" or not any(code in node.reason for code in HOOK_REFUSALS):
            continue
        rec = snap.records.get(node.name)
        if rec is not None and rec.want == Want.UP and rec.state in LIVE:
            continue  # a spooled or repeated request is serving it after all
        yield Action(
            "return_to_service",
            "HookRefusal",
            node.name,
            message=f"set DOWN by a hook: {node.reason[:200]}",
        )


def _owner(snap: Snapshot, inst: Instance, holders: Mapping[str, Tracked]) -> Tracked | None:
    """The live record that owns ``inst``: the one holding its id, else (a launch whose
    answer is not recorded yet) the one its node tag names."""
    rec = holders.get(inst.id)
    if rec is not None:
        return rec
    rec = snap.records.get(inst.tags.get(NODE_TAG, "") or inst.name)
    if rec is None or rec.state not in LIVE:
        return None
    if rec.instance_id and rec.instance_id != inst.id:
        return None  # a second instance for the node: a duplicate
    if not rec.instance_id and rec.state not in (
        NodeState.LAUNCHING,
        NodeState.FAILED,
        NodeState.TERMINATING,
    ):
        return None
    return rec


def _orphans(snap: Snapshot, policy: Policy, suspect: _Suspect) -> Iterable[Action]:
    if snap.instances is None:
        return
    holders = {r.instance_id: r for r in snap.records.values() if r.instance_id and r.state in LIVE}
    # a launch still waiting for its answer: what it made carries its token (Azure's
    # scale-out names its VMs itself; they are listed before the launch returns)
    launching = {r.token for r in snap.records.values()
                 if r.state == NodeState.LAUNCHING and r.token}  # fmt: skip
    for provider, instances in snap.instances.items():
        for inst in instances:
            if inst.state in DEAD_INSTANCE or _owner(snap, inst, holders) is not None:
                continue
            if inst.tags.get(TOKEN_TAG, "") in launching:
                continue
            if suspect(f"instance:{provider}:{inst.id}") >= policy.orphan_grace:
                node = inst.tags.get(NODE_TAG, "") or inst.name
                yield Action(
                    "terminate",
                    "Orphan",
                    node,
                    inst.id,
                    provider,
                    f"instance {inst.id} ({inst.state}) has no live node",
                )


def _stuck_nodes(snap: Snapshot, policy: Policy, suspect: _Suspect) -> Iterable[Action]:
    listed: dict[str, dict[str, Instance]] | None = None
    if snap.instances is not None:
        listed = {p: {i.id: i for i in insts} for p, insts in snap.instances.items()}
    for rec in snap.records.values():
        if rec.want != Want.UP:
            continue
        waited = resuming_for(rec, snap.now)
        if waited is not None and waited > policy.resume_timeout:
            yield Action(
                "fail_node",
                "ResumeTimeout",
                rec.name,
                rec.instance_id,
                rec.provider,
                f"not joined {waited:.0f} s after the resume (ResumeTimeout "
                f"{policy.resume_timeout:g} s, state {rec.state})",
            )
            continue
        if (
            rec.state in (NodeState.BOOTSTRAPPING, NodeState.JOINED)
            and rec.instance_id
            and listed is not None
            and rec.provider in listed
        ):
            inst = listed[rec.provider].get(rec.instance_id)
            if inst is None or inst.state in DEAD_INSTANCE:
                yield Action(
                    "fail_node",
                    "InstanceVanished",
                    rec.name,
                    rec.instance_id,
                    rec.provider,
                    f"instance {rec.instance_id} is {inst.state if inst else 'gone'}",
                )
                continue
        node = snap.slurm_nodes.get(rec.name) if snap.slurm_nodes is not None else None
        if node is None and snap.slurm_nodes is not None and rec.state in LIVE:
            # slurmctld no longer has the node (a dynamic node deleted by hand, a
            # slurm.conf without it): no job can reach its instance. Two passes: a read
            # may race a create
            if rec.state != NodeState.TERMINATING and suspect(f"slurm-gone:{rec.name}") > 0:
                yield Action(
                    "teardown",
                    "SlurmNodeGone",
                    rec.name,
                    rec.instance_id,
                    rec.provider,
                    "slurmctld no longer has the node (deleted, or not in slurm.conf)",
                )
            continue
        if rec.state != NodeState.JOINED or node is None:
            continue
        if node.powering_up and snap.now - rec.state_since > policy.register_timeout:
            yield Action(
                "fail_node",
                "SlurmdNotRegistered",
                rec.name,
                rec.instance_id,
                rec.provider,
                f"slurmd started {snap.now - rec.state_since:.0f} s ago and has not "
                f"registered with slurmctld (register_timeout {policy.register_timeout:g} s)",
            )
        elif GPU_DRAIN in node.reason and "DRAIN" in node.flags and node.state == "idle":
            yield Action(
                "fail_node",
                "GpuUnhealthy",
                rec.name,
                rec.instance_id,
                rec.provider,
                f"drained by its GPU health check, now idle: {node.reason}",
            )
        elif node.powered_down and not node.powering_up:
            yield Action(
                "teardown",
                "SlurmPoweredDown",
                rec.name,
                rec.instance_id,
                rec.provider,
                "Slurm shows the node powered down",
            )
    if snap.slurm_nodes is None:
        return
    for node in snap.slurm_nodes.values():
        if not node.powering_up:
            continue
        held = snap.records.get(node.name)
        lost = held is None or (held.want == Want.DOWN and held.state == NodeState.TERMINATED)
        # counted from when the daemon first saw it, not from the record's last change:
        # Slurm marks a node powering up a moment before its resume hook records it
        if lost and suspect(f"resume-lost:{node.name}") >= policy.lost_resume_grace:
            yield Action(
                "fail_node",
                "ResumeLost",
                node.name,
                message="Slurm is powering the node up but no resume reached the daemon",
            )


def _mesh(snap: Snapshot, suspect: _Suspect) -> Iterable[Action]:
    live_keys = {r.wg_pubkey for r in snap.records.values() if r.wg_pubkey and r.state in LIVE}
    if snap.peers is not None:
        for peer in snap.peers:
            if peer.public_key in live_keys:
                continue
            if suspect(f"peer:{peer.public_key}") > 0:
                yield Action(
                    "remove_peer",
                    "StalePeer",
                    peer.comment,
                    peer.public_key,
                    message=f"hub peer {','.join(peer.allowed_ips)} has no live node",
                )
    if snap.addresses is not None:
        for node, addr in snap.addresses.items():
            rec = snap.records.get(node)
            if rec is not None and rec.state in LIVE:
                continue
            if rec is not None and rec.state == NodeState.REQUESTED:
                continue
            if suspect(f"address:{node}:{addr}") > 0:
                yield Action(
                    "release_address",
                    "LeakedAddress",
                    node,
                    addr,
                    message=f"mesh address {addr} held by a node that is not live",
                )


def _ledger(snap: Snapshot) -> Iterable[Action]:
    if snap.ledger_open is None or snap.instances is None:
        return
    alive = {
        i.id for insts in snap.instances.values() for i in insts if i.state not in DEAD_INSTANCE
    }
    held = {r.instance_id for r in snap.records.values() if r.instance_id and r.state in LIVE}
    for instance_id, node in snap.ledger_open.items():
        if instance_id not in alive and instance_id not in held:
            yield Action(
                "close_ledger",
                "LedgerOpen",
                node,
                instance_id,
                message=f"instance {instance_id} is gone; its ledger row is closed",
            )


def _groups(snap: Snapshot, policy: Policy) -> Iterable[Action]:
    for g in snap.groups.values():
        if g.protected_until and g.protected_until <= snap.now:
            yield Action("unprotect", "Unprotected", target=g.name, message="cooldown over")
        elif not g.protected_until and g.failures >= policy.protect_after:
            yield Action(
                "protect",
                "Protected",
                target=g.name,
                message=f"{g.failures} failed launches in a row",
            )


class _Suspect(Protocol):
    def __call__(self, key: str) -> float: ...


class Findings(NamedTuple):
    """What a pass found wrong, before any grace period acts on it (for the metrics)."""

    orphans: dict[str, int]  # provider -> instances no live node owns
    stale_peers: int
    leaked_addresses: int
    oldest_resume: dict[str, float]  # group -> age (s) of its oldest node not yet joined


def findings(
    suspects: Mapping[str, float],
    records: Iterable[Tracked],
    now: float,
    groups: Iterable[str],
    providers: Iterable[str],
) -> Findings:
    """Count a plan's suspects by kind, and age each group's oldest pending resume."""
    orphans = dict.fromkeys(providers, 0)
    peers = addresses = 0
    for key in suspects:
        kind, _, rest = key.partition(":")
        if kind == "instance":
            provider = rest.partition(":")[0]
            orphans[provider] = orphans.get(provider, 0) + 1
        elif kind == "peer":
            peers += 1
        elif kind == "address":
            addresses += 1
    oldest = dict.fromkeys(groups, 0.0)
    for r in records:
        age = resuming_for(r, now)
        if age is not None:
            oldest[r.group] = max(oldest.get(r.group, 0.0), age, 0.0)
    return Findings(orphans, peers, addresses, oldest)


def resuming_for(rec: Tracked, now: float) -> float | None:
    """Seconds since the resume of a node that is wanted up and has not joined yet
    (ResumeTimeout counts from there); None for any other node."""
    if rec.want != Want.UP or rec.state not in RESUMING or rec.state == NodeState.JOINED:
        return None
    return now - (rec.requested_at or rec.state_since)


def summarize(records: Iterable[Tracked]) -> dict[str, dict[str, int]]:
    """Nodes by group and state, for status and metrics."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        by_state = out.setdefault(r.group, {})
        by_state[str(r.state)] = by_state.get(str(r.state), 0) + 1
    return out
