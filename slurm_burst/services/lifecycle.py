"""The one writer of node records.

A node's life is ``core.nodestate``'s machine: requested, launching, booting,
bootstrapping, joined, terminating, terminated (or failed on the way). Each method
here is one step of it, named for what happened; the daemon, the launcher, the
provisioner, the reconciler and the registrations ask for a step and never write a
node record themselves (``tests/unit/test_lifecycle.py`` fails if one does). The
store checks every state change against the machine and logs it as an event; a
step that sets no state (a node's mesh key, its jobs) is still a step of this class,
so that what a record may hold at each state is decided here alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from slurm_burst.core.cloud import Instance
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import Clock, NodeStore

MESSAGE_MAX = 500  # characters of an error kept on the record (the event keeps its code)


class Lifecycle:
    def __init__(self, store: NodeStore, clock: Clock) -> None:
        self.store = store  # of it, only its node records (NodeBook) are written here
        self.clock = clock

    # -- what Slurm asks (the daemon's requests) ------------------------------------
    def asked_up(
        self, name: str, group: str, was: NodeRecord | None, requested_at: float, jobs: str
    ) -> NodeRecord:
        """A resume of a node that is down (``was``: its record, if it had one): asked
        for with a new launch sequence, its last error cleared."""
        return self.store.transition(
            name,
            NodeState.REQUESTED,
            self.clock.now(),
            group=group,
            want=Want.UP,
            launch_seq=(was.launch_seq + 1) if was else 1,
            requested_at=requested_at,
            jobs=jobs,
            error="",
            message="",
        )

    def asked_again(self, rec: NodeRecord) -> float:
        """A torn-down node still wanted up, asked for anew (a new launch token); when."""
        now = self.clock.now()
        self.store.transition(
            rec.name,
            NodeState.REQUESTED,
            now,
            launch_seq=rec.launch_seq + 1,
            requested_at=now,
            error="",
            message="",
        )
        return now

    def wanted(self, name: str, want: Want, jobs: str | None = None) -> None:
        """Slurm wants the node up (serving ``jobs``) or down; its worker acts on it."""
        changes: dict[str, object] = {"want": want}
        if jobs is not None:
            changes["jobs"] = jobs
        self.store.update(name, **changes)

    def serving(self, name: str, jobs: str) -> None:
        """The jobs a node up (or on its way) serves, as Slurm gave them."""
        self.store.update(name, jobs=jobs)

    def first_seen_down(self, name: str, group: str) -> None:
        """A suspend of a node never recorded: known from now on, terminated."""
        self.store.transition(name, NodeState.TERMINATED, self.clock.now(), group=group)

    def released(self, name: str, code: str, message: str) -> None:
        """A node let go because another node of its job failed: wanted down, and why."""
        self.store.update(name, want=Want.DOWN, error=code, message=message[:MESSAGE_MAX])
        self.store.event(self.clock.now(), "node.released", name, message[:MESSAGE_MAX])

    # -- the launch ------------------------------------------------------------------
    def launching(
        self, rec: NodeRecord, *, token: str, provider: str, size: str, market: str,
        placement: str,
    ) -> NodeRecord:  # fmt: skip
        """The node's next launch call is fixed (token, provider, size, market,
        placement) before it is made: a requested node starts launching, a launching
        one (the next size, a recovered crash) takes the new call's values."""
        fix = {"token": token, "provider": provider, "size": size, "market": market,
               "placement": placement}  # fmt: skip
        if rec.state == NodeState.REQUESTED:
            return self.store.transition(rec.name, NodeState.LAUNCHING, self.clock.now(), **fix)
        if any(getattr(rec, k) != v for k, v in fix.items()):
            self.store.update(rec.name, **fix)
            return rec._replace(token=token, provider=provider, size=size, market=market,
                                placement=placement)  # fmt: skip
        return rec

    def booting(self, pairs: Sequence[tuple[NodeRecord, Instance]]) -> None:
        """Nodes given their instances, in one transaction."""
        now = self.clock.now()
        with self.store.atomically():
            for rec, inst in pairs:
                self.store.transition(
                    rec.name, NodeState.BOOTING, now, instance_id=inst.id, ip=inst.address
                )

    def bootstrapping(self, name: str, ip: str, host_keys: Sequence[tuple[str, str]]) -> None:
        """The instance runs and its host keys are attested: bootstrap over SSH."""
        keys = json.dumps([list(k) for k in host_keys])
        self.store.transition(name, NodeState.BOOTSTRAPPING, self.clock.now(), ip=ip,
                              host_keys=keys)  # fmt: skip

    def meshed(self, name: str, wg_pubkey: str, mesh_addr: str) -> None:
        """The node's WireGuard key (made on it) and its address in the mesh."""
        self.store.update(name, wg_pubkey=wg_pubkey, mesh_addr=mesh_addr)

    def joined(self, name: str) -> None:
        """slurmd started on the node; it has not registered yet."""
        self.store.transition(name, NodeState.JOINED, self.clock.now(), registered_at=0.0)

    def registered(self, name: str, at: float) -> None:
        """slurmctld has the node's registration: it may run jobs."""
        self.store.update(name, registered_at=at)

    # -- the end ------------------------------------------------------------------------
    def errored(self, name: str, code: str, message: str) -> None:
        """Why the node's instance is let go (it is replaced, or its spot capacity did
        not come), kept on the record before the teardown that follows."""
        self.store.update(name, error=code, message=message[:MESSAGE_MAX])

    def failed(self, name: str, code: str, message: str) -> NodeRecord:
        """A step failed: the node is wanted down and its record says why."""
        return self.store.transition(
            name,
            NodeState.FAILED,
            self.clock.now(),
            error=code,
            message=message[:MESSAGE_MAX],
            want=Want.DOWN,
        )

    def terminating(self, rec: NodeRecord, replacing: bool) -> NodeRecord:
        """The node's instance is being let go; ``replacing``: its want stays (up,
        unless a suspend came meanwhile), for a new instance."""
        if rec.state == NodeState.TERMINATING:
            return rec
        wants = {} if replacing else {"want": Want.DOWN}
        return self.store.transition(rec.name, NodeState.TERMINATING, self.clock.now(), **wants)

    def terminated(self, name: str) -> None:
        """Everything of the instance is gone: nothing of it stays on the record."""
        self.store.transition(
            name,
            NodeState.TERMINATED,
            self.clock.now(),
            wg_pubkey="",
            mesh_addr="",
            ip="",
            host_keys="[]",
        )
