"""Launching instances: where a node group may launch now, in batches where the provider
allows, one by one otherwise, falling back on capacity errors.

**Candidates.** A node group lists (provider, size) pairs in fallback order
(``NodeGroup.candidates``). :meth:`Launcher.candidates` is the one place that
turns them into what may be tried now: none while the group is protected
(``GroupProtected``), and a size cooling down after a capacity error is skipped
for ``daemon.capacity_cooldown`` seconds, for every node of every group.

**Tokens.** Every launch call carries an idempotency token fixed in the state
store before the call: a retry after a crash repeats the call with the same
token (and first looks for what it made), so it never makes a second instance.
A node's token names the node, its resume count and the candidate's position; a
batch's token is derived from its nodes and is recorded with them
(``batch.TOKEN`` in the store's meta) so a restarted daemon can adopt the batch.
Both carry the state database's own random id (``installation`` in its meta): a
controller installed afresh (an empty database, the same cluster name) never repeats
an earlier installation's tokens, which a provider would answer with that one's
instances or refuse (EC2: ``IdempotentParameterMismatch``).

**Batches.** New resume requests are planned per node group once
(:meth:`Launcher.plan`): a group whose first usable candidate is on a provider
that launches many instances in one call goes to :meth:`Launcher.launch_batch`;
every other node is launched by its own worker (:meth:`Launcher.launch_one`).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import shlex
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from slurm_burst.config import Fleet, NodeGroup
from slurm_burst.core.cloud import NODE_TAG, CapacityError, CloudError, Instance, LaunchSpec
from slurm_burst.core.errors import StepError
from slurm_burst.core.hostlist import compress
from slurm_burst.core.jobs import job_ids, least_useful, share_out
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import Batch, NodeRecord, Placement
from slurm_burst.core.slurm import SchedulerError
from slurm_burst.ports import Clock, Cloud, Metrics, NodeStore, Scheduler
from slurm_burst.services.instancelog import InstanceLog
from slurm_burst.services.lifecycle import Lifecycle

log = logging.getLogger(__name__)

TAG_THREADS = 4  # parallel tag calls after a batch launch (paced by the CreateTags budget)
BATCH_THREADS = 4  # launch calls of one node group in flight at once
TOKEN_MAX = 63  # the longest launch token (GCE label values; EC2 ClientToken takes 64)


SPOT = "spot"  # NodeRecord.market of a spot launch ('' : on-demand)


@dataclass(frozen=True)
class Candidate:
    """Where a node may launch: a provider, a size and a market, with the launch
    settings (image, tags, disk) of the node group ``via`` (the node's own, or its
    spot group's on-demand fallback)."""

    seq: int  # its position in the group's fallback list (part of the launch token)
    provider: str
    size: str
    market: str = ""  # SPOT or "" (on-demand)
    via: str = ""  # the node group whose launch settings apply

    @property
    def cooled(self) -> str:
        """The size as a capacity error cools it down: spot and on-demand capacity of
        one size are separate pools (a spot refusal leaves on-demand launching)."""
        return cooled(self.size, self.market)


def cooled(size: str, market: str) -> str:
    return f"{size}/{market}" if market else size


@dataclass(frozen=True)
class LaunchPlan:
    """The new nodes of one group, and where that group may launch them now."""

    group: NodeGroup
    nodes: tuple[str, ...]
    candidates: tuple[Candidate, ...]  # empty: protected or every size cooling down


FELL_BACK = "slurm-burst: no spot capacity, on-demand"  # the node's Slurm comment


@dataclass(frozen=True, kw_only=True)
class LauncherSettings:
    fleet: Fleet
    capacity_cooldown: float  # seconds a size that ran out of capacity is skipped
    name_each_max: int = 100  # a larger launch is named at launch, not one by one


class LaunchPorts(Protocol):
    """The ports the launcher uses (the provisioner's ports have them)."""

    @property
    def store(self) -> NodeStore: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def clouds(self) -> Mapping[str, Cloud]: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def metrics(self) -> Metrics | None: ...


class Launcher:
    def __init__(
        self,
        settings: LauncherSettings,
        ports: LaunchPorts,
        ssh_public_key: str,
        instances: InstanceLog,
        lifecycle: Lifecycle,
    ) -> None:
        self.fleet = settings.fleet
        self.capacity_cooldown = settings.capacity_cooldown
        self.name_each_max = settings.name_each_max
        self.store = ports.store
        self.clouds = ports.clouds
        self.ssh_public_key = ssh_public_key
        self.clock = ports.clock
        self.scheduler = ports.scheduler
        self.instances = instances  # the ledger's instance events
        self.lifecycle = lifecycle  # the one writer of node records
        self.metrics = ports.metrics
        self._batch_locks: dict[str, threading.Lock] = {}
        self._unnamed: list[tuple[str, str, str]] = []  # (node, instance, provider) to tag
        self._tagger: threading.Thread | None = None
        self._guard = threading.Lock()
        self._installation: str | None = None

    def installation(self) -> str:
        """The state database's random id, made on first use (one per installation,
        shared by an HA pair, which shares the database)."""
        if self._installation is None:
            self._installation = self.store.installation(lambda: secrets.token_hex(4))
        return self._installation

    # -- candidates -------------------------------------------------------------------
    def candidates(
        self, group: NodeGroup, start: int = 0, keep: int | None = None
    ) -> list[Candidate]:
        """Where ``group`` may launch now, in fallback order, from position ``start``.

        Raises ``StepError(GroupProtected)`` while the group is protected, and a
        :class:`CapacityError` naming the codes when every size is cooling down.
        ``keep`` is a position tried even if it is cooling down: this node's own
        call to it may have gone through, so it is repeated (same token), not lost.
        """
        now = self.clock.now()
        health = self.store.groups().get(group.name)
        if health is not None and health.protected(now):
            raise StepError("GroupProtected", f"node group {group.name}: {health.reason}")
        cold = self.store.unavailable(now)
        every = self.every(group)
        usable = [c for c in every[start:] if (c.provider, c.cooled) not in cold or c.seq == keep]
        if not usable:
            codes = sorted(
                {cold[(c.provider, c.cooled)][1] for c in every if (c.provider, c.cooled) in cold}
            )
            raise CapacityError(
                f"every size of node group {group.name} is cooling down after "
                f"capacity errors ({', '.join(codes)})",
                codes[0] if codes else None,
            )
        return usable

    def every(self, group: NodeGroup) -> list[Candidate]:
        """Every candidate of ``group`` in fallback order: its own sizes (spot, if it is
        a spot group), then its spot fallback's (on-demand)."""
        out: list[Candidate] = []
        launch_groups = [group]
        fallback = self.fleet.node_groups.get(group.spot_fallback) if group.spot else None
        if fallback is not None:
            launch_groups.append(fallback)
        for g in launch_groups:
            market = SPOT if g.spot else ""
            out += [Candidate(len(out) + i, p, s, market, g.name)
                    for i, (p, s) in enumerate(g.candidates())]  # fmt: skip
        return out

    def position(self, group: NodeGroup, rec: NodeRecord) -> int | None:
        """Where in ``group``'s fallback list ``rec``'s last launch was; None if nowhere."""
        for c in self.every(group):
            if (c.provider, c.size, c.market) == (rec.provider, rec.size, rec.market):
                return c.seq
        return None

    def plan(self, requested: Sequence[NodeRecord]) -> list[LaunchPlan]:
        """Newly requested nodes (as the daemon has just recorded them) by group, with
        each group's candidates computed once."""
        by_group: dict[str, list[str]] = {}
        for rec in requested:
            by_group.setdefault(rec.group, []).append(rec.name)
        plans = []
        for group_name, nodes in by_group.items():
            group = self.fleet.node_groups[group_name]
            try:
                cands: tuple[Candidate, ...] = tuple(self.candidates(group))
            except (StepError, CloudError):
                cands = ()  # the per-node path raises the same error and fails the nodes
            plans.append(LaunchPlan(group, tuple(nodes), cands))
        return plans

    def batches(self, plan: LaunchPlan) -> bool:
        """Whether ``plan`` goes to :meth:`launch_batch` (its first candidate batches)."""
        return bool(plan.candidates) and self.clouds[plan.candidates[0].provider].batch_max > 1

    def spec(
        self,
        group: NodeGroup,
        node: str,
        size: str,
        token: str,
        count: int = 1,
        min_count: int = 0,
        via: str = "",
        placement_group: str = "",
    ) -> LaunchSpec:
        """What to launch for ``node`` (or for a batch of ``count`` led by it), with the
        launch settings of node group ``via`` ('' : ``group``'s own). The instance is
        tagged with the node's own group either way: that is whose node it is."""
        launch = self.fleet.node_groups.get(via, group) if via else group
        return LaunchSpec(
            node=node,
            cluster=self.fleet.cluster,
            group=group.name,
            size=size,
            image=launch.image,
            token=token,
            ssh_public_key=self.ssh_public_key,
            user_data=user_data(self.fleet.cluster, node if count == 1 else group.name),
            tags=dict(launch.tags),
            spot=launch.spot,
            spot_max_price=launch.spot_max_price,
            gpus=launch.gpus,
            accelerator=launch.accelerator or launch.gpu_type,
            disk_gb=launch.disk_gb,
            count=count,
            min_count=min_count,
            placement_group=placement_group,
            placement_kind=group.placement if placement_group else "",
            spot_wait=group.spot_fallback_after if launch.spot and group.spot_fallback else 0.0,
        )

    def batch_spec(
        self,
        group: NodeGroup,
        names: Sequence[str],
        cand: Candidate,
        token: str,
        least: int = 0,
        placement_group: str = "",
    ) -> LaunchSpec:
        """What to launch for a batch of ``names``; one of more than ``name_each_max`` is
        named at launch after its nodes (the same on a repeat: the token's parameters)."""
        spec = self.spec(group, names[0], cand.size, token, len(names), least, cand.via,
                         placement_group)  # fmt: skip
        spec = replace(spec, names=tuple(names))  # a provider may name each at launch
        if len(names) <= self.name_each_max:
            return spec
        return replace(spec, tags={"Name": launch_name(names), **spec.tags})

    # -- one node ---------------------------------------------------------------------
    def launch_one(self, rec: NodeRecord, group: NodeGroup) -> None:
        """Launch the node's instance, falling back on capacity errors; leaves it booting.

        A node left launching by a crash repeats its last call (same token, after
        looking for what that call made); a node of a batch adopts the batch.
        """
        resumed = rec.token if rec.state == NodeState.LAUNCHING else ""  # a call may be made
        if resumed:
            batch = self.store.batch(rec.token)
            if batch is not None:
                self._recover_batch(rec, group, batch)
                return
        start = 0
        if rec.state == NodeState.LAUNCHING:  # pick up where it was
            start = self.position(group, rec) or 0
        keep = start if resumed and resumed == self.token(rec, start) else None
        last: CloudError | None = None
        for cand in self.candidates(group, start, keep):
            token = self.token(rec, cand.seq)
            fix = {"token": token, "provider": cand.provider, "size": cand.size,
                   "market": cand.market, "placement": ""}  # fmt: skip
            rec = self.lifecycle.launching(rec, **fix)
            cloud = self.clouds[cand.provider]
            try:
                with timed(self.clock, rec.name, "launch", self.metrics):
                    found = cloud.find(token, self.fleet.cluster) if resumed == token else []
                    inst = (
                        found[0]
                        if found
                        else cloud.launch(
                            self.spec(group, rec.name, cand.size, token, via=cand.via)
                        )
                    )
            except CapacityError as exc:
                last = exc
                self.size_unavailable(rec.name, cand.provider, cand.cooled, exc)
                continue
            self._booting([(rec, inst)])
            return
        assert last is not None
        raise last

    def _token_prefix(self) -> str:
        """What every launch token starts with: the cluster, then the installation."""
        return f"{self.fleet.cluster[:24]}-{self.installation()}"

    def token(self, rec: NodeRecord, seq: int) -> str:
        """The idempotency token of ``rec``'s launch on candidate ``seq``: readable, or
        where that would be longer than a provider takes (63: a GCE label value), with
        the node's part hashed (never cut: two long names must not share a token)."""
        prefix = self._token_prefix()
        token = f"{prefix}-{rec.name}-{rec.launch_seq}-{seq}"
        if len(token) <= TOKEN_MAX:
            return token
        digest = hashlib.sha256(f"{rec.name}|{rec.launch_seq}|{seq}".encode()).hexdigest()
        return f"{prefix}-{digest[:24]}"

    def _booting(self, pairs: Sequence[tuple[NodeRecord, Instance]]) -> None:
        """Nodes given their instances: the ledger first (one write), then their state
        (one transaction), so that a crash between leaves the ledger ahead, never
        behind (the batch's recovery records again, once)."""
        if not pairs:
            return
        self.instances.launched(pairs)
        self.lifecycle.booting(pairs)
        if self.metrics is not None:
            for rec, _ in pairs:
                self.metrics.launched(rec.group, rec.provider, rec.size)
        fell = [rec for rec, _ in pairs if self.on_fallback(rec)]
        if fell:
            self.fell_back(fell)

    def fell_back(self, recs: Sequence[NodeRecord]) -> None:
        """Nodes of a spot group launched on their fallback's on-demand capacity: in the
        events and in the node's Slurm comment (``scontrol show node``), cleared when
        the node is released."""
        now = self.clock.now()
        for r in recs:
            self.store.event(now, "spot.fallback", r.name, f"on-demand {r.provider}/{r.size}")
        names = [r.name for r in recs]
        log.warning("node.spot_fallback_launched count=%d hostlist=%s", len(names),
                    compress(names))  # fmt: skip
        try:  # a comment: Slurm keeps a reason only on a node DOWN or drained
            self.scheduler.update_nodes(names, comment=f"{FELL_BACK} {recs[0].size}")
        except SchedulerError as exc:
            log.warning("node.comment_failed count=%d error=%s", len(names), exc)

    def on_fallback(self, rec: NodeRecord) -> bool:
        """Whether ``rec``'s launch is its spot group's on-demand fallback."""
        group = self.fleet.node_groups.get(rec.group)
        return group is not None and group.spot and not rec.market

    def size_unavailable(self, node: str, provider: str, size: str, exc: CloudError) -> None:
        """Cool ``provider/size`` down after a capacity error (every group skips it);
        ``size`` as :attr:`Candidate.cooled` names it (spot capacity apart)."""
        now = self.clock.now()
        self.store.mark_unavailable(provider, size, now + self.capacity_cooldown, exc.code)
        self.store.event(now, "size.unavailable", node, f"{provider}/{size}: {exc.code}")
        log.warning(
            "node.launch.capacity node=%s provider=%s size=%s code=%s cooldown=%g",
            node,
            provider,
            size,
            exc.code,
            self.capacity_cooldown,
        )

    # -- batches --------------------------------------------------------------------
    def launch_batch(
        self, plan: LaunchPlan, launched: Callable[[list[str]], None] = lambda names: None
    ) -> list[tuple[str, CloudError]]:
        """Launch ``plan``'s nodes with as few calls as its providers allow: chunks of
        the provider's ``batch_max``, each in one call, a group's chunks in flight
        together. A capacity error moves a chunk to the next candidate; nodes that
        reach a provider without batching stay requested for their own workers.
        ``launched`` is told each chunk's nodes that have their instances as soon as its
        call returns (they boot meanwhile: 5,000 EC2 nodes launch over many minutes of
        EC2's instance bucket, and the first must not wait for the last).

        Returns the nodes whose launch failed otherwise, with the error (the caller
        fails them).
        """
        recs = [r for r in map(self.store.node, plan.nodes) if r is not None]
        todo = [r for r in recs if r.state == NodeState.REQUESTED and r.want == Want.UP]
        failed: list[tuple[str, CloudError]] = []
        for cand in plan.candidates:
            if not todo:
                break
            n = self.clouds[cand.provider].batch_max
            if n < 2:
                break  # this provider launches one by one: the workers do it
            chunks = launch_chunks(todo, n, by_job=bool(plan.group.placement))
            with ThreadPoolExecutor(min(BATCH_THREADS, len(chunks))) as pool:
                results = list(pool.map(partial(self._chunk, plan.group, cand, launched),
                                        chunks))  # fmt: skip
            again: list[str] = []  # for the next candidate
            for chunk, result in zip(chunks, results, strict=True):
                if isinstance(result, CapacityError):
                    again += [r.name for r in chunk]
                elif isinstance(result, CloudError):
                    failed += [(r.name, result) for r in chunk]
                else:  # a partial launch: the nodes it could not serve
                    again += [r.name for r in chunk if r.name in result]
            todo = [r for r in map(self.store.node, again) if r is not None]  # launching now
        self.name_later()
        return failed

    def _chunk(
        self, group: NodeGroup, cand: Candidate, launched: Callable[[list[str]], None],
        recs: list[NodeRecord],
    ) -> CloudError | set[str]:  # fmt: skip
        """:meth:`_batch`, then ``launched`` told the nodes it served."""
        left = self._batch(group, cand, recs)
        if not isinstance(left, CloudError):
            launched([r.name for r in recs if r.name not in left])
        return left

    def _batch(
        self, group: NodeGroup, cand: Candidate, recs: list[NodeRecord]
    ) -> CloudError | set[str]:
        """Launch ``recs`` in one call: the error if it failed (nothing was made), else
        the nodes a partial launch left without an instance.

        The call asks for every node, and for at least the smallest job's nodes (one
        node where ``all_or_nothing`` is "node"): the provider makes what it has room
        for, and :func:`share_out` gives the instances to whole jobs first."""
        names = [r.name for r in recs]
        key = ",".join(f"{r.name}:{r.launch_seq}" for r in recs)
        digest = hashlib.sha256(f"{key}|{cand.seq}".encode()).hexdigest()[:16]
        token = f"{self._token_prefix()}-b{len(recs)}-{cand.seq}-{digest}"
        placed = self.placement_name(recs, cand.provider) if _placed(group, recs) else ""
        fix = {"token": token, "provider": cand.provider, "size": cand.size,
               "market": cand.market, "placement": placed}  # fmt: skip
        least = least_useful(names, _jobs_of(recs)) if group.all_or_nothing == "job" else 1
        if placed:
            least = len(names)  # one job, one placement: all of it or none
        with self.store.atomically():  # the token is fixed before the call: a crash repeats it
            self.store.begin_batch(  # with the same parameters: EC2 refuses a token reused
                Batch(token, tuple(names), cand.provider, cand.size, group.name, least,
                      cand.market, cand.via, placed)  # with others (IdempotentParameterMismatch)
            )  # fmt: skip
            made_pg = bool(placed) and self._placement_made(placed)
            if placed and not made_pg:  # known before it exists: a crash leaks nothing
                self.store.set_placement(Placement(placed, cand.provider))
            for rec in recs:  # as launch_batch read them: requested, or launching still
                self.lifecycle.launching(rec, **fix)  # (after a capacity error of the last size)
        spec = self.batch_spec(group, names, cand, token, least, placed)
        try:
            if placed and not made_pg:  # once per job and provider, whatever the sizes tried
                self._make_placement(cand.provider, placed)
            with timed(self.clock, names[0], f"launch-batch[{len(recs)}]", self.metrics):
                made = self.clouds[cand.provider].launch_many(spec)
        except CloudError as exc:
            if isinstance(exc, CapacityError):
                self.size_unavailable(names[0], cand.provider, cand.cooled, exc)
            self.store.end_batch(token)  # nothing was made
            return exc
        served = self._adopt_batch(token, made)
        if len(made) < len(recs):
            short = CapacityError(f"{len(made)} of {len(recs)} made", "PartialCapacity")
            self.size_unavailable(names[0], cand.provider, cand.cooled, short)
        return set(names) - served

    def _placement_made(self, name: str) -> bool:
        got = self.store.placements().get(name)
        return got is not None and got.made

    def _make_placement(self, provider: str, name: str) -> None:
        """Make placement group ``name`` (recorded already) and note that it is made."""
        self.clouds[provider].create_placement(name)
        self.store.set_placement(Placement(name, provider, made=True))

    def placement_name(self, recs: Sequence[NodeRecord], provider: str) -> str:
        """The placement group of one job's launch on ``provider``: the same for a repeat
        (a crash, the next size there), another for each resume of the nodes."""
        key = ",".join(sorted(f"{r.name}:{r.launch_seq}" for r in recs))
        digest = hashlib.sha256(f"{key}|{provider}".encode()).hexdigest()[:16]
        return f"{self._token_prefix()}-pg-{digest}"

    def _adopt_batch(self, token: str, made: Sequence[Instance]) -> set[str]:
        """Give the batch's nodes their instances (by launch index; whole jobs first if
        fewer were made than asked; by their node tag where each instance was named after
        its node at launch, GCE), then forget the batch. Returns the nodes served."""
        batch = self.store.batch(token)
        nodes = list(batch.nodes) if batch is not None else []
        each = len(nodes) <= self.name_each_max  # else named at launch
        held = self.store.nodes_named(nodes)
        by_node = {i.tags.get(NODE_TAG, ""): i for i in made}
        named = bool(made) and len(by_node) == len(made) and set(by_node) <= set(nodes)
        if named:  # each instance named after its node at launch (GCE): it is that node's
            nodes = [n for n in nodes if n in by_node]
            made = [by_node[n] for n in nodes]
        elif len(made) < len(nodes):
            recs = [held[n] for n in nodes if n in held]
            nodes = share_out(nodes, _jobs_of(recs), len(made))
        adopted: list[tuple[str, str, str]] = []
        pairs: list[tuple[NodeRecord, Instance]] = []
        for name, inst in zip(nodes, made, strict=False):
            rec = held.get(name)
            if rec is None or rec.state != NodeState.LAUNCHING or rec.token != token:
                continue  # suspended meanwhile: its instance is an orphan, reconciled away
            pairs.append((rec, inst))
            adopted.append((name, inst.id, rec.provider))
        self._booting(pairs)
        self.store.end_batch(token)
        if each and not named:
            with self._guard:
                self._unnamed.extend(adopted)
        return set(nodes[: len(made)])

    def name_later(self) -> None:
        """Name the batches' instances in the background: a convenience for people
        looking at the provider's console (ownership is by instance id), so never on a
        node's way to joining; the CreateTags budget paces it."""
        with self._guard:
            if self._tagger is not None and self._tagger.is_alive():
                return  # it drains what was added too
            self._tagger = threading.Thread(target=self._name_all, name="tags", daemon=True)
            self._tagger.start()

    def _name_all(self) -> None:
        while True:
            with self._guard:
                if not self._unnamed:
                    self._tagger = None
                    return
            self.name_instances()

    def name_instances(self) -> None:
        """Tag each instance of the batches launched so far with its node's name (a call
        per instance). One that fails stays unnamed: the name is for people; the node's
        own launch tags (cluster, group, token) came with the launch."""
        with self._guard:
            adopted, self._unnamed = self._unnamed, []

        def name_one(item: tuple[str, str, str]) -> None:
            node, instance_id, provider = item
            try:
                self.clouds[provider].tag(instance_id, {NODE_TAG: node, "Name": node})
            except CloudError as exc:
                log.warning(
                    "node.tag_failed node=%s instance=%s code=%s", node, instance_id, exc.code
                )

        if adopted:
            with ThreadPoolExecutor(min(TAG_THREADS, len(adopted))) as pool:
                list(pool.map(name_one, adopted))

    def _recover_batch(self, rec: NodeRecord, group: NodeGroup, batch: Batch) -> None:
        """A node left launching in a batch (the daemon died during the call): adopt what
        the call made, or repeat it with the same token."""
        with self._batch_lock(rec.token):
            again = self.store.node(rec.name)
            if again is None or again.state != NodeState.LAUNCHING or again.token != rec.token:
                return  # another worker of the batch finished it
            cloud = self.clouds[batch.provider]
            names = list(batch.nodes)
            made = cloud.find(rec.token, self.fleet.cluster)
            if len(made) != len(names):
                cand = Candidate(0, batch.provider, batch.size, batch.market, batch.via)
                placed = batch.placement
                if placed and not self._placement_made(placed):  # the crash came before it
                    self._make_placement(batch.provider, placed)
                made = cloud.launch_many(  # least 0: a batch recorded before it was kept
                    self.batch_spec(group, names, cand, rec.token, batch.least, placed)
                )
            log.info("node.batch_recovered token=%s count=%d", rec.token, len(made))
            self._adopt_batch(rec.token, made)
        self.name_later()

    def _batch_lock(self, token: str) -> threading.Lock:
        with self._guard:
            return self._batch_locks.setdefault(token, threading.Lock())


def launch_chunks(
    recs: Sequence[NodeRecord], most: int, by_job: bool = False
) -> list[list[NodeRecord]]:
    """``recs`` in launch calls of at most ``most`` nodes; ``by_job`` (placement): each
    multi-node job's nodes in calls of their own (one placement group each), the rest
    together. A node serving several jobs goes with its first."""
    if not by_job:
        return [list(recs[i : i + most]) for i in range(0, len(recs), most)]
    jobs: dict[int, list[NodeRecord]] = {}
    loose: list[NodeRecord] = []
    for r in recs:
        ids = sorted(job_ids(r.job_list()))
        if ids:
            jobs.setdefault(ids[0], []).append(r)
        else:
            loose.append(r)
    out: list[list[NodeRecord]] = []
    for members in jobs.values():
        if len(members) == 1:
            loose += members
        else:
            out += launch_chunks(members, most)
    return out + launch_chunks(loose, most)


def launch_name(names: Sequence[str]) -> str:
    """The ``Name`` of a launch's instances: its nodes as a hostlist, cut to EC2's 256
    characters a tag value (ending in '...' where cut)."""
    text = compress(list(names))
    return text if len(text) <= 255 else text[:252] + "..."


def _placed(group: NodeGroup, recs: Sequence[NodeRecord]) -> bool:
    """Whether this launch gets a placement group: the group asks for one, and the
    launch is two or more nodes of one job (:func:`launch_chunks` made it so)."""
    if not group.placement or len(recs) < 2:
        return False
    first = [sorted(job_ids(r.job_list()))[:1] for r in recs]
    return bool(first[0]) and all(f == first[0] for f in first)


def _jobs_of(recs: Sequence[NodeRecord]) -> dict[str, set[int]]:
    return {r.name: job_ids(r.job_list()) for r in recs}


@contextmanager
def timed(clock: Clock, node: str, step: str, metrics: Metrics | None = None) -> Iterator[None]:
    """Log how long ``step`` of ``node`` took (``node.step node=... seconds=...``); a step
    that succeeded is also observed in ``metrics`` (its label without the ``[batch]``)."""
    started = clock.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        seconds = clock.monotonic() - started
        log.info("node.step node=%s step=%s seconds=%.2f", node, step, seconds)
        if ok and metrics is not None:
            metrics.step(step.partition("[")[0], seconds)


def user_data(cluster: str, node: str) -> str:
    """The instance's user-data: public facts only. The SSH public key goes in the
    provider's key slot; everything secret arrives later over SSH."""
    return (
        "#!/bin/sh\n"
        f"# slurm-burst cloud node {node} of cluster {cluster}; public data only.\n"
        f"echo slurm-burst: node {shlex.quote(node)} booted, waiting for bootstrap over SSH\n"
    )
