"""The daemon's state store in memory: one fake per part of the port (node records,
requests, stages and outputs, the address pool, group health, launches, leadership,
passes), each passing its part's contract (tests/contracts/store.py), and
:class:`MemoryStore`, all of them behind one lock as the SQLite store is."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from slurm_burst.core.nodestate import NodeState, Want, check_transition
from slurm_burst.core.records import (
    NODE_FIELDS,
    Batch,
    DuplicateRequest,
    GroupHealth,
    NodeRecord,
    OutputRecord,
    Placement,
    PoolExhausted,
    Request,
    StageRecord,
    StoreError,
    WarmOverride,
)


class _Part:
    _DATA: tuple[str, ...] = ()  # what ``atomically`` puts back when its block raises

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._lock = lock or threading.RLock()


class MemoryNodes(_Part):
    """Node records: checked transitions, one event per transition."""

    _DATA: tuple[str, ...] = ("_nodes", "_events")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._nodes: dict[str, NodeRecord] = {}
        self._events: list[dict[str, Any]] = []

    def node(self, name: str) -> NodeRecord | None:
        with self._lock:
            return self._nodes.get(name)

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            return [self._nodes[n] for n in sorted(self._nodes)]

    def nodes_named(self, names: Sequence[str]) -> dict[str, NodeRecord]:
        with self._lock:
            return {n: self._nodes[n] for n in names if n in self._nodes}

    def transition(
        self, name: str, new: NodeState, now: float, group: str = "", **changes: Any
    ) -> NodeRecord:
        bad = set(changes) - NODE_FIELDS
        if bad:
            raise ValueError(f"unknown node fields {sorted(bad)}")
        with self._lock:
            old = self._nodes.get(name)
            check_transition(old.state if old else None, new)
            if old is None:
                old = NodeRecord(name, group, new, Want(changes.pop("want", Want.DOWN)))
                old = old._replace(state_since=now)
            values = {**changes, "state": new}
            if old.state != new:
                values["state_since"] = now
            if "want" in values:
                values["want"] = Want(values["want"])
            rec = old._replace(**values)
            self._nodes[name] = rec
            self._events.append(
                {
                    "id": len(self._events) + 1,
                    "at": now,
                    "node": name,
                    "event": f"node.{new}",
                    "detail": changes.get("error", ""),
                }
            )
            return rec

    def update(self, name: str, **changes: Any) -> None:
        bad = set(changes) - NODE_FIELDS
        if bad or "state" in changes:
            raise ValueError(f"update cannot set {sorted(bad | ({'state'} & set(changes)))}")
        with self._lock:
            rec = self._nodes.get(name)
            if rec is None or not changes:
                return
            if "want" in changes:
                changes["want"] = Want(changes["want"])
            self._nodes[name] = rec._replace(**changes)

    def event(self, now: float, event: str, node: str = "", detail: str = "") -> None:
        with self._lock:
            self._events.append(
                {
                    "id": len(self._events) + 1,
                    "at": now,
                    "node": node,
                    "event": event,
                    "detail": detail,
                }
            )

    def events(self, since_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._events if e["id"] > since_id][:limit]


class MemoryRequests(_Part):
    _DATA: tuple[str, ...] = ("_requests", "_uids")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._requests: list[tuple[Request, float | None]] = []
        self._uids: dict[str, int] = {}

    def add_request(
        self,
        kind: str,
        nodes: Sequence[str],
        jobs: Sequence[Mapping[str, Any]],
        now: float,
        uid: str = "",
    ) -> int:
        if kind not in ("resume", "suspend", "resume-fail"):
            raise StoreError(f"unknown request kind {kind!r}")
        with self._lock:
            req = Request(len(self._requests) + 1, kind, tuple(nodes), [dict(j) for j in jobs], now)
            if uid and uid in self._uids:
                had = self._requests[self._uids[uid] - 1][0]
                if (had.kind, had.nodes, had.jobs) != (req.kind, req.nodes, req.jobs):
                    raise DuplicateRequest(f"request uid {uid} already names request {had.id}")
                return had.id
            self._requests.append((req, None))
            if uid:
                self._uids[uid] = req.id
            return req.id

    def pending_requests(self) -> list[Request]:
        with self._lock:
            pending = [r for r, done in self._requests if done is None]
            return sorted(pending, key=lambda r: (r.created_at, r.id))

    def finish_request(self, request_id: int, now: float) -> None:
        with self._lock:
            self._requests = [
                (r, now if r.id == request_id else done) for r, done in self._requests
            ]


class MemoryStages(_Part):
    _DATA: tuple[str, ...] = ("_stages", "_outputs", "_pulled", "_asked", "_pull_failed")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._stages: dict[int, StageRecord] = {}
        self._outputs: dict[tuple[int, str], OutputRecord] = {}
        self._pulled: dict[tuple[int, str], tuple[float, int]] = {}
        self._asked: dict[tuple[int, str], float] = {}
        self._pull_failed: dict[tuple[int, str], str] = {}

    def add_stage(self, rec: StageRecord) -> StageRecord:
        with self._lock:
            old = self._stages.get(rec.job_id)
            if old is not None and old.state != "failed":
                return old
            if old is not None:
                rec = dataclasses.replace(rec, created_at=old.created_at)
            self._stages[rec.job_id] = rec
            return rec

    def stage(self, job_id: int) -> StageRecord | None:
        return self._stages.get(int(job_id))

    def stages(self, states: Sequence[str] = ()) -> list[StageRecord]:
        with self._lock:
            return [s for _, s in sorted(self._stages.items()) if not states or s.state in states]

    def update_stage(
        self, job_id: int, now: float, *, expect: Sequence[str] = (), **changes: Any
    ) -> bool:
        if set(changes) - {"state", "message", "datasets"}:
            raise ValueError(f"not a stage field: {sorted(changes)}")
        with self._lock:
            old = self._stages.get(int(job_id))
            if old is None or (expect and old.state not in expect):
                return False
            self._stages[int(job_id)] = dataclasses.replace(old, updated_at=now, **changes)
            return True

    def add_outputs(self, recs: Sequence[OutputRecord]) -> None:
        with self._lock:
            for r in recs:
                self._outputs.setdefault((r.job_id, r.name), r)

    def outputs(self, job_id: int | None = None, states: Sequence[str] = ()) -> list[OutputRecord]:
        with self._lock:
            return [
                r for _, r in sorted(self._outputs.items())
                if (job_id is None or r.job_id == job_id) and (not states or r.state in states)
            ]  # fmt: skip

    def update_output(
        self, job_id: int, name: str, now: float, *, expect: Sequence[str] = (), **changes: Any
    ) -> bool:
        if set(changes) - {"sync", "state", "node", "manifest", "files", "bytes", "synced_at",
                           "message"}:  # fmt: skip
            raise ValueError(f"not an output field: {sorted(changes)}")
        with self._lock:
            old = self._outputs.get((int(job_id), name))
            if old is None or (expect and old.state not in expect):
                return False
            self._outputs[(int(job_id), name)] = dataclasses.replace(old, updated_at=now, **changes)
            return True

    def forget_stages(self, before: float) -> int:
        with self._lock:
            gone = [j for j, s in self._stages.items() if s.updated_at < before]
            for j in gone:
                del self._stages[j]
            for key, out in list(self._outputs.items()):
                if out.updated_at < before and out.state in ("sealed", "lost"):
                    del self._outputs[key]
            for facts in (self._pulled, self._asked, self._pull_failed):
                for job, node in list(facts):
                    if job not in self._stages:
                        del facts[(job, node)]
            return len(gone)

    def pulled(self, job_id: int, node: str, at: float, fetched_bytes: int) -> None:
        with self._lock:
            self._pulled[(int(job_id), node)] = (at, fetched_bytes)

    def pulled_on(self, job_id: int) -> list[str]:
        with self._lock:
            return sorted(n for j, n in self._pulled if j == int(job_id))

    def ask_pull(self, job_id: int, node: str, at: float) -> None:
        with self._lock:
            self._asked[(int(job_id), node)] = at

    def pulls_asked(self) -> list[tuple[int, str]]:
        with self._lock:
            return sorted(self._asked)

    def pull_done(self, job_id: int, node: str, failure: str = "") -> None:
        with self._lock:
            if failure:
                self._pull_failed[(int(job_id), node)] = failure
            self._asked.pop((int(job_id), node), None)

    def pull_failure(self, job_id: int, node: str) -> str:
        with self._lock:
            return self._pull_failed.get((int(job_id), node), "")


class MemoryAddresses(_Part):
    """The mesh address pool: an address never held twice."""

    _DATA: tuple[str, ...] = ("_addresses",)

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._addresses: dict[str, str] = {}  # node -> address

    def allocate_address(self, node: str, subnet: str, now: float) -> str:
        with self._lock:
            if node in self._addresses:
                return self._addresses[node]
            used = set(self._addresses.values())
            hosts = ipaddress.ip_network(subnet).hosts()
            next(hosts)  # the hub's
            for host in hosts:
                if str(host) not in used:
                    self._addresses[node] = str(host)
                    return str(host)
        raise PoolExhausted(f"mesh subnet {subnet} has no free address left")

    def allocate_addresses(self, nodes: Sequence[str], subnet: str, now: float) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._lock:
            for node in nodes:
                try:
                    out[node] = self.allocate_address(node, subnet, now)
                except PoolExhausted:
                    break
        return out

    def release_address(self, node: str) -> str | None:
        with self._lock:
            return self._addresses.pop(node, None)

    def addresses(self) -> dict[str, str]:
        with self._lock:
            return dict(self._addresses)


class MemoryGroups(_Part):
    _DATA: tuple[str, ...] = ("_groups", "_unavailable", "_warm")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._groups: dict[str, GroupHealth] = {}
        self._unavailable: dict[tuple[str, str], tuple[float, str]] = {}
        self._warm: dict[str, WarmOverride] = {}

    def groups(self) -> dict[str, GroupHealth]:
        with self._lock:
            return dict(self._groups)

    def group_launch_result(self, name: str, ok: bool) -> int:
        with self._lock:
            g = self._groups.get(name, GroupHealth(name))
            g = GroupHealth(name, 0 if ok else g.failures + 1, g.protected_until, g.reason)
            self._groups[name] = g
            return g.failures

    def protect_group(self, name: str, until: float, reason: str) -> None:
        with self._lock:
            g = self._groups.get(name, GroupHealth(name))
            self._groups[name] = GroupHealth(name, g.failures, until, reason)

    def unprotect_group(self, name: str) -> None:
        with self._lock:
            if name in self._groups:
                self._groups[name] = GroupHealth(name)

    def mark_unavailable(self, provider: str, size: str, until: float, code: str) -> None:
        with self._lock:
            self._unavailable[(provider, size)] = (until, code)

    def unavailable(self, now: float) -> dict[tuple[str, str], tuple[float, str]]:
        with self._lock:
            return {k: v for k, v in self._unavailable.items() if v[0] > now}

    def warm_override(self, group: str) -> WarmOverride | None:
        with self._lock:
            return self._warm.get(group)

    def set_warm_override(self, group: str, override: WarmOverride | None) -> None:
        with self._lock:
            if override is None:
                self._warm.pop(group, None)
            else:
                self._warm[group] = override


class MemoryLaunches(_Part):
    _DATA: tuple[str, ...] = ("_installation", "_batches", "_placements", "_notices", "_replaced")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._installation = ""
        self._batches: dict[str, Batch] = {}
        self._placements: dict[str, Placement] = {}
        self._notices: dict[str, tuple[str, str, float]] = {}
        self._replaced: dict[str, tuple[float, float]] = {}

    def installation(self, make: Callable[[], str]) -> str:
        with self._lock:
            if not self._installation:
                self._installation = make()
            return self._installation

    def begin_batch(self, batch: Batch) -> None:
        with self._lock:
            self._batches[batch.token] = batch

    def batch(self, token: str) -> Batch | None:
        with self._lock:
            return self._batches.get(token)

    def end_batch(self, token: str) -> None:
        with self._lock:
            self._batches.pop(token, None)

    def placements(self) -> dict[str, Placement]:
        with self._lock:
            return dict(self._placements)

    def set_placement(self, placement: Placement) -> None:
        with self._lock:
            self._placements[placement.name] = placement

    def forget_placement(self, name: str) -> None:
        with self._lock:
            self._placements.pop(name, None)

    def notice_seen(self, instance_id: str, node: str, action: str, at: float) -> bool:
        with self._lock:
            if instance_id in self._notices:
                return False
            self._notices[instance_id] = (node, action, at)
            return True

    def replaced(self, node: str) -> tuple[float, float] | None:
        with self._lock:
            return self._replaced.get(node)

    def set_replaced(self, node: str, first: float, again: float) -> None:
        with self._lock:
            self._replaced[node] = (first, again)


class MemoryLeadership(_Part):
    _DATA: tuple[str, ...] = ("_heartbeat", "_followers")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._heartbeat: dict[str, Any] | None = None
        self._followers: dict[str, dict[str, Any]] = {}

    def beat(self, now: float, info: Mapping[str, Any]) -> None:
        with self._lock:
            self._heartbeat = copy.deepcopy({"at": now, **info})

    def heartbeat(self) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self._heartbeat)

    def follower(self, node_id: str, info: Mapping[str, Any] | None) -> None:
        with self._lock:
            if info is None:
                self._followers.pop(node_id, None)
            else:
                self._followers[node_id] = copy.deepcopy(dict(info))

    def followers(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return copy.deepcopy(self._followers)


class MemoryPasses(_Part):
    _DATA: tuple[str, ...] = ("_last_pass", "_suspects", "_policy")

    def __init__(self, lock: threading.RLock | None = None) -> None:
        super().__init__(lock)
        self._last_pass: dict[str, Any] | None = None
        self._suspects: dict[str, float] = {}
        self._policy: dict[str, Any] | None = None

    def last_pass(self) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self._last_pass)

    def record_pass(self, summary: Mapping[str, Any]) -> None:
        with self._lock:
            self._last_pass = copy.deepcopy(dict(summary))

    def suspects(self) -> dict[str, float]:
        with self._lock:
            return dict(self._suspects)

    def set_suspects(self, suspects: Mapping[str, float]) -> None:
        with self._lock:
            self._suspects = dict(suspects)

    def policy_report(self) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self._policy)

    def set_policy_report(self, doc: Mapping[str, Any]) -> None:
        with self._lock:
            self._policy = copy.deepcopy(dict(doc))


class MemoryStore(
    MemoryNodes,
    MemoryRequests,
    MemoryStages,
    MemoryAddresses,
    MemoryGroups,
    MemoryLaunches,
    MemoryLeadership,
    MemoryPasses,
):
    """The whole NodeStore port: every part behind one lock, as the SQLite store's one
    database is; ``atomically`` spans parts."""

    def __init__(self) -> None:
        super().__init__(threading.RLock())  # each part's, in turn (cooperative)

    def check_writable(self, now: float) -> None:
        """Always writable (tests that need it not are on the SQLite store)."""

    @contextmanager
    def atomically(self) -> Iterator[None]:
        """Hold the lock for the block; on an exception put every field back as it was."""
        with self._lock:
            fields = [k for part in type(self).__mro__ for k in vars(part).get("_DATA", ())]
            saved = {k: copy.deepcopy(getattr(self, k)) for k in fields}
            try:
                yield
            except BaseException:
                for k, v in saved.items():
                    setattr(self, k, v)
                raise
