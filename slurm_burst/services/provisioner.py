"""Bring one cloud node up, or take it down: the steps behind the node state machine.

:meth:`Provisioner.drive` moves a node towards what was asked of it (``want``
up or down), one persisted state at a time, and may be called again at any
point (after a crash, a duplicate resume, a suspend arriving mid-bootstrap):

- ``requested -> launching``: fix the idempotency token, then ``create_node``.
  A retry with the same token returns the same instance, never a second one.
- ``launching -> booting``: wait for the instance to run and to print its SSH
  host key on its console (read through the provider's API: our trust anchor).
- ``booting -> bootstrapping -> joined``: over SSH, WireGuard (node key made on
  the node), a mesh address from the pool, the hub peer, munge key over SFTP,
  NodeAddr, configless slurmd. Each step is idempotent and timed in the log.
- ``* -> terminating -> terminated``: instance, hub peer, address, NodeAddr,
  ledger row closed. Whatever is already gone counts as done.

A failed step records an error code, sets the Slurm node DOWN with
``(Code:...)`` in its reason (Slurm requeues the job), tears down, and powers
the node down so Slurm may try again.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from importlib import resources
from typing import Any

from slurm_burst.adapters.state.store import NodeRecord, Store, StoreError
from slurm_burst.config import Config, NodeGroup
from slurm_burst.core.cloud import (
    NODE_TAG,
    CapacityError,
    CloudError,
    Instance,
    LaunchSpec,
    classify,
)
from slurm_burst.core.nodestate import NodeState as S
from slurm_burst.core.nodestate import reason
from slurm_burst.core.pricing import dollars
from slurm_burst.ports import Cloud, Connector, Ledger, Mesh, RemoteShell, Scheduler

log = logging.getLogger(__name__)

REMOTE_SCRIPT = "/run/slurm-burst-bootstrap.sh"
TAG_THREADS = 16  # parallel tag calls after a batch launch
BATCH_THREADS = 4  # launch calls of one node group in flight at once
POLL = 0.5


# Failures that say nothing about the group's health: not counted towards protected mode.
NOT_LAUNCH_FAILURES = frozenset({"GroupProtected", "SlurmPoweredDown", "ResumeLost"})


class StepError(RuntimeError):
    """A provisioning step failed; ``code`` goes into the node reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Cancelled(Exception):
    """The node's ``want`` changed while a step waited."""


@dataclass
class Secrets:
    """Material the daemon holds; read once at start, never logged."""

    ssh_public_key: str
    munge_key: bytes


class Provisioner:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        clouds: dict[str, Cloud],
        mesh: Mesh,
        connector: Connector,
        scheduler: Scheduler,
        ledger: Ledger,
        secrets: Secrets,
        clock: Callable[[], float] = time.time,
        metrics: Any | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.clouds = clouds
        self.mesh = mesh
        self.connector = connector
        self.scheduler = scheduler
        self.ledger = ledger
        self.secrets = secrets
        self.now = clock
        self.metrics = metrics
        self.stopping = threading.Event()  # the daemon is stopping: waits end, state stays
        self._batch_locks: dict[str, threading.Lock] = {}
        self._unnamed: list[tuple[str, str, str]] = []  # (node, instance, provider) to tag
        self._locks_guard = threading.Lock()
        self.script = (
            resources.files("slurm_burst.adapters.ssh").joinpath("node-bootstrap.sh").read_bytes()
        )

    # -- the driver ---------------------------------------------------------------
    def drive(self, name: str) -> NodeRecord | None:
        """Advance ``name`` until it is where ``want`` says, or failed and torn down."""
        while True:
            rec = self.store.node(name)
            if rec is None:
                return None
            if rec.want == "down" or rec.state in (S.FAILED, S.TERMINATING):
                if rec.state != S.TERMINATED:
                    failed = rec.state == S.FAILED
                    self._teardown(rec)
                    if failed:
                        self.power_down_force(name)
                    continue
                return rec
            # want == up
            if rec.state == S.JOINED:
                return rec
            if rec.state == S.TERMINATED:
                self.store.transition(
                    name,
                    S.REQUESTED,
                    self.now(),
                    launch_seq=rec.launch_seq + 1,
                    requested_at=self.now(),
                    error="",
                    message="",
                )
                continue
            step = {
                S.REQUESTED: self._launch,
                S.LAUNCHING: self._launch,
                S.BOOTING: self._boot,
                S.BOOTSTRAPPING: self._bootstrap,
            }[rec.state]
            try:
                step(rec)
            except Cancelled:
                if self.stopping.is_set():
                    log.info("node.paused node=%s state=%s (daemon stopping)", name, rec.state)
                    return None
                log.info("node.cancelled node=%s state=%s (want down)", name, rec.state)
            except StepError as exc:
                self._fail(rec, exc.code, str(exc))
            except CloudError as exc:
                self._fail(rec, exc.code, str(exc))
            except (OSError, StoreError) as exc:
                self._fail(rec, "InternalError", f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                code = getattr(exc, "code", None)
                if not isinstance(code, str):
                    raise
                self._fail(rec, code, str(exc))

    # -- steps --------------------------------------------------------------------
    def _group(self, rec: NodeRecord) -> NodeGroup:
        group = self.cfg.group_of(rec.name)
        if group is None:
            raise StepError("NotConfigured", f"{rec.name} is in no node group of the config")
        return group

    def spec(
        self, group: NodeGroup, node: str, size: str, token: str, count: int = 1
    ) -> LaunchSpec:
        """What to launch for ``node`` (or for a batch of ``count`` led by it)."""
        return LaunchSpec(
            node=node,
            cluster=self.cfg.cluster.name,
            group=group.name,
            size=size,
            image=group.image,
            token=token,
            ssh_public_key=self.secrets.ssh_public_key,
            user_data=user_data(self.cfg.cluster.name, node if count == 1 else group.name),
            tags=dict(group.tags),
            spot=group.spot,
            spot_max_price=group.spot_max_price,
            gpus=group.gpus,
            accelerator=group.accelerator or group.gpu_type,
            disk_gb=group.disk_gb,
            count=count,
        )

    # -- batched launch -----------------------------------------------------------
    def launch_batch(self, names: Sequence[str]) -> None:
        """Launch the requested nodes among ``names`` with as few calls as the providers
        allow: per node group, chunks of the provider's ``batch_max`` in one call each.

        Nodes a batching provider cannot take (a provider without batching, a protected
        group, every size cooling down) stay ``requested``: their workers launch them
        one by one, with the same fallback and errors as ever.
        """
        by_group: dict[str, list[NodeRecord]] = {}
        for name in names:
            rec = self.store.node(name)
            if rec is not None and rec.state == S.REQUESTED and rec.want == "up":
                by_group.setdefault(rec.grp, []).append(rec)
        for recs in by_group.values():
            group = self._group(recs[0])
            health = self.store.groups().get(group.name)
            if health is not None and health.protected(self.now()):
                continue
            todo = list(recs)
            while todo:
                todo = self._launch_chunks(group, todo)
        self.name_instances()

    def _launch_chunks(self, group: NodeGroup, recs: list[NodeRecord]) -> list[NodeRecord]:
        """One candidate's worth of batches; return the nodes left for the next candidate."""
        every = group.candidates()
        cold = self.store.unavailable(self.now())
        for provider, size in every:
            if (provider, size) in cold:
                continue
            cloud = self.clouds[provider]
            n = max(1, int(getattr(cloud, "batch_max", 1)))
            if n < 2:
                return []  # this provider launches one by one: the workers do it
            seq = every.index((provider, size))
            chunks = [recs[i : i + n] for i in range(0, len(recs), n)]
            with ThreadPoolExecutor(min(BATCH_THREADS, len(chunks))) as pool:
                made = list(pool.map(partial(self._batch, group, provider, size, seq), chunks))
            return [r for chunk, ok in zip(chunks, made, strict=True) if not ok for r in chunk]
        return []

    def _batch(
        self, group: NodeGroup, provider: str, size: str, seq: int, recs: list[NodeRecord]
    ) -> bool:
        """Launch ``recs`` in one call; False on a capacity error (try the next size)."""
        names = [r.name for r in recs]
        key = ",".join(f"{r.name}:{r.launch_seq}" for r in recs)
        digest = hashlib.sha256(f"{key}|{seq}".encode()).hexdigest()[:16]
        token = f"{self.cfg.cluster.name[:24]}-b{len(recs)}-{seq}-{digest}"[:64]
        self.store.meta_set(
            f"batch.{token}",
            {"nodes": names, "provider": provider, "size": size, "group": group.name},
        )
        for name in names:  # the token is fixed before the call: a crash repeats it
            fix = {"token": token, "provider": provider, "size": size}
            rec = self.store.node(name)
            if rec is not None and rec.state == S.REQUESTED:
                self.store.transition(name, S.LAUNCHING, self.now(), **fix)
            else:  # launching still, after a capacity error of the previous size
                self.store.update(name, **fix)
        try:
            with self._timed(names[0], f"launch-batch[{len(recs)}]"):
                made = self.clouds[provider].launch_many(
                    self.spec(group, names[0], size, token, count=len(recs))
                )
        except CapacityError as exc:
            self._size_unavailable(names[0], provider, size, exc)
            self.store.meta_delete(f"batch.{token}")  # nothing was made: the next size
            return False
        except CloudError as exc:
            for name in names:
                rec = self.store.node(name)
                if rec is not None and rec.state == S.LAUNCHING:
                    self._fail(rec, exc.code, str(exc))
            self.store.meta_delete(f"batch.{token}")
            return True
        self._adopt_batch(token, made)
        return True

    def _adopt_batch(self, token: str, made: Sequence[Instance]) -> None:
        """Give each node of the batch its instance (by launch index), then forget the batch."""
        info = self.store.meta_get(f"batch.{token}") or {}
        names: list[str] = info.get("nodes", [])
        group = self.cfg.node_groups.get(info.get("group", ""))
        adopted: list[tuple[str, str, str]] = []
        for name, inst in zip(names, made, strict=False):
            rec = self.store.node(name)
            if rec is None or rec.state != S.LAUNCHING or rec.token != token:
                continue  # suspended meanwhile: its instance is an orphan, reconciled away
            self.store.transition(name, S.BOOTING, self.now(), instance_id=inst.id, ip=inst.address)
            adopted.append((name, inst.id, rec.provider))
            if self.metrics is not None and group is not None:
                self.metrics.launches.labels(group.name, rec.provider, rec.size).inc()
            self._ledger(rec, inst.id, "requested", rec.requested_at or self.now())
        self.store.meta_delete(f"batch.{token}")
        with self._locks_guard:
            self._unnamed.extend(adopted)

    def name_instances(self) -> None:
        """Tag each instance of the batches launched so far with its node's name (a call
        per instance, in parallel, once every batch is out). One that fails is tagged
        again by its boot step."""
        with self._locks_guard:
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

    def _recover_batch(self, rec: NodeRecord, info: dict[str, Any]) -> None:
        """A node left ``launching`` in a batch (the daemon died during the call)."""
        with self._batch_lock(rec.token):
            again = self.store.node(rec.name)
            if again is None or again.state != S.LAUNCHING or again.token != rec.token:
                return  # another worker of the batch finished it
            cloud = self.clouds[info["provider"]]
            names = info["nodes"]
            made = cloud.find(rec.token, self.cfg.cluster.name)
            if len(made) != len(names):
                group = self._group(rec)
                made = cloud.launch_many(
                    self.spec(group, names[0], info["size"], rec.token, count=len(names))
                )
            log.info("node.batch_recovered token=%s count=%d", rec.token, len(made))
            self._adopt_batch(rec.token, made)
        self.name_instances()

    def _batch_lock(self, token: str) -> threading.Lock:
        with self._locks_guard:
            return self._batch_locks.setdefault(token, threading.Lock())

    def _size_unavailable(self, node: str, provider: str, size: str, exc: CloudError) -> None:
        until = self.now() + self.cfg.daemon.capacity_cooldown
        self.store.mark_unavailable(provider, size, until, exc.code)
        self.store.event(self.now(), "size.unavailable", node, f"{provider}/{size}: {exc.code}")
        log.warning(
            "node.launch.capacity node=%s provider=%s size=%s code=%s cooldown=%g",
            node,
            provider,
            size,
            exc.code,
            self.cfg.daemon.capacity_cooldown,
        )

    def _launch(self, rec: NodeRecord) -> None:
        """Launch the node's instance, falling back on capacity errors.

        Each (provider, size) candidate has its own idempotency token, fixed in
        the state database before the call: a retry after a crash repeats the
        same call with the same token. A capacity error marks the size
        unavailable for ``daemon.capacity_cooldown`` seconds (for every node of
        every group) and moves on to the next candidate.
        """
        resumed = rec.token if rec.state == S.LAUNCHING else ""  # a call may have been made
        if resumed:
            info = self.store.meta_get(f"batch.{rec.token}")
            if info is not None:
                self._recover_batch(rec, info)
                return
        group = self._group(rec)
        health = self.store.groups().get(group.name)
        if health is not None and health.protected(self.now()):
            raise StepError("GroupProtected", f"node group {group.name}: {health.reason}")
        every = group.candidates()
        cold = self.store.unavailable(self.now())
        start = 0
        if rec.state == S.LAUNCHING and (rec.provider, rec.size) in every:
            start = every.index((rec.provider, rec.size))  # pick up where it was
        # a cooling-down size is skipped, unless this node's own call to it may have
        # gone through (its token is that call's): that call is repeated, not lost
        todo = [
            c
            for i, c in enumerate(every)
            if i >= start and (c not in cold or (i == start and resumed == self._token(rec, i)))
        ]
        if not todo:
            codes = sorted({code for _, code in cold.values()})
            raise CapacityError(
                f"every size of node group {group.name} is cooling down after "
                f"capacity errors ({', '.join(codes)})",
                codes[0] if codes else None,
            )
        last: CloudError | None = None
        for provider, size in todo:
            token = self._token(rec, every.index((provider, size)))
            if rec.state == S.REQUESTED:
                rec = self.store.transition(
                    rec.name, S.LAUNCHING, self.now(), token=token, provider=provider, size=size
                )
            elif (rec.token, rec.provider, rec.size) != (token, provider, size):
                self.store.update(rec.name, token=token, provider=provider, size=size)
                rec = self.store.node(rec.name) or rec
            retry = resumed == token  # look for what that call made before calling again
            try:
                with self._timed(rec.name, "launch"):
                    found = (
                        self.clouds[provider].find(token, self.cfg.cluster.name) if retry else []
                    )
                    inst = (
                        found[0]
                        if found
                        else self.clouds[provider].launch(self.spec(group, rec.name, size, token))
                    )
            except CapacityError as exc:
                last = exc
                self._size_unavailable(rec.name, provider, size, exc)
                continue
            if self.metrics is not None:
                self.metrics.launches.labels(group.name, provider, size).inc()
            self._ledger(rec, inst.id, "requested", rec.requested_at or self.now())
            self.store.transition(
                rec.name, S.BOOTING, self.now(), instance_id=inst.id, ip=inst.address
            )
            return
        assert last is not None
        raise last

    def _instance_fault(self, rec: NodeRecord, fault: str) -> None:
        """An instance the provider accepted and then put in error (OpenStack: the
        scheduler found no host). A capacity fault cools the size down, as a capacity
        error at launch does: Slurm's next resume of the node lands on the next size."""
        err = classify(fault)
        if isinstance(err, CapacityError):
            self._size_unavailable(rec.name, rec.provider, rec.size, err)
        raise StepError(err.code if err.code != CloudError.code else "InstanceError", fault)

    def _token(self, rec: NodeRecord, seq: int) -> str:
        """The idempotency token of ``rec``'s launch on candidate ``seq``."""
        return f"{self.cfg.cluster.name}-{rec.name}-{rec.launch_seq}-{seq}"[:64]

    def _boot(self, rec: NodeRecord) -> None:
        cloud = self.clouds[rec.provider]
        deadline = rec.state_since + self.cfg.daemon.boot_timeout
        with self._timed(rec.name, "boot"):
            while True:
                self._check_want(rec.name)
                inst = cloud.get(rec.instance_id)
                if inst is not None and inst.state == "error" and inst.fault:
                    self._instance_fault(rec, inst.fault)
                if inst is None or inst.state in ("terminated", "error", "stopped"):
                    raise StepError(
                        "InstanceVanished",
                        f"instance {rec.instance_id} is {inst.state if inst else 'gone'}",
                    )
                if inst.tags.get(NODE_TAG) != rec.name:  # a batch's instance, not yet named
                    try:
                        cloud.tag(rec.instance_id, {NODE_TAG: rec.name, "Name": rec.name})
                    except CloudError as exc:  # a convenience: ownership is by instance id
                        log.warning("node.tag_failed node=%s code=%s", rec.name, exc.code)
                    inst = inst._replace(tags={**inst.tags, NODE_TAG: rec.name})
                if inst.state == "running" and inst.address:
                    keys = cloud.host_keys(rec.instance_id)
                    if keys:
                        break
                if self.now() > deadline:
                    raise StepError(
                        "BootTimeout",
                        f"instance {rec.instance_id} not running with "
                        f"a host key after {self.cfg.daemon.boot_timeout:g} s",
                    )
                time.sleep(POLL)
        self._ledger(rec, rec.instance_id, "running", self.now())
        self.store.transition(
            rec.name, S.BOOTSTRAPPING, self.now(), ip=inst.address, host_keys=json.dumps(keys)
        )

    def _bootstrap(self, rec: NodeRecord) -> None:
        mesh_cfg = self.cfg.mesh
        iface = mesh_cfg.interface
        net = ipaddress.ip_network(mesh_cfg.subnet)
        hub_ip = str(next(net.hosts()))
        remaining = rec.state_since + self.cfg.daemon.bootstrap_timeout - self.now()
        deadline = time.monotonic() + max(remaining, 5.0)
        keys = [tuple(k) for k in json.loads(rec.host_keys)]
        with self._timed(rec.name, "ssh"):
            sh = self.connector.connect(rec.ip, keys, deadline)
        try:
            with self._timed(rec.name, "script"):
                sh.put(self.script, REMOTE_SCRIPT, 0o700)
            with self._timed(rec.name, "wg-key"):
                pub = self._step(sh, "wg-key", iface).strip()
            if len(pub) != 44 or not pub.endswith("="):
                raise StepError("WireGuardKey", "the node did not return a WireGuard public key")
            addr = self.store.allocate_address(rec.name, mesh_cfg.subnet, self.now())
            self.store.update(rec.name, wg_pubkey=pub, mesh_addr=addr)
            with self._timed(rec.name, "hub-peer"):
                self.mesh.add_peer(pub, addr, rec.name)
            routes = (
                []
                if ipaddress.ip_address(self.cfg.cluster.controller_addr) in net
                else [f"{self.cfg.cluster.controller_addr}/32"]
            )
            conf = self.mesh.node_config([str(net), *routes])
            conf_path = f"/etc/wireguard/{iface}-hub.conf"
            with self._timed(rec.name, "wg-up"):
                sh.put(conf.encode(), conf_path, 0o600)
                self._step(sh, "wg-up", iface, f"{addr}/{net.prefixlen}", conf_path, *routes)
                self._wait_handshake(rec.name, pub, deadline)
            with self._timed(rec.name, "munge"):
                uid, gid = (int(x) for x in self._step(sh, "munge-dirs").strip().split(":"))
                sh.put(self.secrets.munge_key, "/etc/munge/munge.key", 0o400, (uid, gid))
                self._step(sh, "munge-start", self.cfg.slurm.munge_socket)
            with self._timed(rec.name, "nodeaddr"):
                self.scheduler.update_nodes([rec.name], addrs=[addr], hostnames=[rec.name])
            self._check_want(rec.name)
            with self._timed(rec.name, "slurmd"):
                self._step(sh, "slurmd-start", rec.name, hub_ip)
        finally:
            sh.close()
        self._ledger(rec, rec.instance_id, "joined", self.now())
        self.store.transition(rec.name, S.JOINED, self.now())
        self.store.group_launch_result(rec.grp, ok=True)
        log.info(
            "node.joined node=%s mesh_addr=%s total_seconds=%.1f",
            rec.name,
            addr,
            self.now() - rec.requested_at,
        )

    def _step(self, sh: RemoteShell, step: str, *args: str) -> str:
        try:
            return sh.run(["sh", REMOTE_SCRIPT, step, *args], timeout=60)
        except Exception as exc:
            code = getattr(exc, "code", "RemoteCommand")
            raise StepError(
                f"Bootstrap.{step}" if code == "RemoteCommand" else code, str(exc)
            ) from exc

    def _wait_handshake(self, name: str, pub: str, deadline: float) -> None:
        limit = min(deadline, time.monotonic() + 20)
        while time.monotonic() < limit:
            if any(p.public_key == pub and p.latest_handshake for p in self.mesh.peers()):
                return
            time.sleep(0.2)
        raise StepError("WireGuardHandshake", f"{name}: no WireGuard handshake with the hub")

    # -- teardown -----------------------------------------------------------------
    def _teardown(self, rec: NodeRecord) -> None:
        name = rec.name
        if rec.state != S.TERMINATING:
            rec = self.store.transition(name, S.TERMINATING, self.now(), want="down")
        with self._timed(name, "teardown"):
            if rec.instance_id and rec.provider:
                self.clouds[rec.provider].terminate(rec.instance_id)
            if rec.wg_pubkey:
                self.mesh.remove_peer(rec.wg_pubkey)
            self.store.release_address(name)
            if rec.mesh_addr:
                try:  # NodeAddr back to the name: nothing points at a released address
                    self.scheduler.update_nodes([name], addrs=[name], hostnames=[name])
                except Exception as exc:
                    log.warning("node.nodeaddr_reset_failed node=%s error=%s", name, exc)
            if rec.instance_id:
                self._ledger(rec, rec.instance_id, "terminated", self.now(), rec.error)
        self.store.transition(
            name, S.TERMINATED, self.now(), wg_pubkey="", mesh_addr="", ip="", host_keys="[]"
        )

    def _fail(self, rec: NodeRecord, code: str, message: str) -> None:
        log.error(
            "node.failed node=%s state=%s code=%s error=%s", rec.name, rec.state, code, message
        )
        self.store.transition(
            rec.name, S.FAILED, self.now(), error=code, message=message[:500], want="down"
        )
        if rec.instance_id:
            self._ledger(rec, rec.instance_id, "failed", self.now(), code)
        if code not in NOT_LAUNCH_FAILURES:
            failures = self.store.group_launch_result(rec.grp, ok=False)
            log.info("group.failures group=%s in_a_row=%d", rec.grp, failures)
        if self.metrics is not None:
            self.metrics.failures.labels(rec.grp, code).inc()
        try:
            self.scheduler.update_nodes([rec.name], state="down", reason=reason(code, message))
        except Exception as exc:
            log.warning("node.mark_down_failed node=%s error=%s", rec.name, exc)

    def fail(self, name: str, code: str, message: str) -> bool:
        """Fail ``name`` from outside its worker (the reconcile loop); False if nothing to fail."""
        rec = self.store.node(name)
        if rec is None or rec.state in (S.TERMINATED, S.FAILED):
            return False
        self._fail(rec, code, message)
        return True

    def power_down_force(self, name: str) -> None:
        """Return a node to service after a failed resume (Slurm may try it again)."""
        try:
            self.scheduler.update_nodes([name], state="power_down_force")
        except Exception as exc:
            log.warning("node.power_down_force_failed node=%s error=%s", name, exc)

    # -- helpers --------------------------------------------------------------------
    def _check_want(self, name: str) -> None:
        if self.stopping.is_set():
            raise Cancelled()
        rec = self.store.node(name)
        if rec is None or rec.want != "up":
            raise Cancelled()

    def _ledger(
        self, rec: NodeRecord, instance_id: str, event: str, at: float, detail: str = ""
    ) -> None:
        """Record an instance event; the ledger port spools it if the database is away."""
        group = self.cfg.group_of(rec.name)
        size = rec.size or (group.size_names[0] if group else "")
        launched = datetime.fromtimestamp(rec.requested_at or at, UTC)
        gpus = group.gpus if group else 0
        price = self.cfg.rate_table.price(size, gpus, launched)
        try:
            self.ledger.instance_event(
                node=rec.name,
                instance_id=instance_id,
                provider=rec.provider,
                size=size,
                price_per_hour=float(dollars(price.micros_per_hour)) if price else 0.0,
                event=event,
                at=at,
                detail=detail,
                group=group.name if group else "",
                partition=group.partition if group else "",
                cpus=group.cpus if group else 0,
                gpus=gpus,
                price_source=price.source if price else "none",
                price_version=price.version if price else "",
            )
        except Exception as exc:  # the ledger never stops provisioning
            log.error("ledger.write_failed node=%s event=%s error=%s", rec.name, event, exc)

    @contextmanager
    def _timed(self, node: str, step: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            log.info(
                "node.step node=%s step=%s seconds=%.2f", node, step, time.monotonic() - started
            )


def user_data(cluster: str, node: str) -> str:
    """The instance's user-data: public facts only. The SSH public key goes in the
    provider's key slot; everything secret arrives later over SSH."""
    return (
        "#!/bin/sh\n"
        f"# slurm-burst cloud node {node} of cluster {cluster}; public data only.\n"
        f"echo slurm-burst: node {shlex.quote(node)} booted, waiting for bootstrap over SSH\n"
    )
