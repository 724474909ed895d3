"""The daemon's state store in memory."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from slurm_burst.core.nodestate import NodeState, Want, check_transition
from slurm_burst.core.records import (
    NODE_FIELDS,
    DuplicateRequest,
    GroupHealth,
    NodeRecord,
    OutputRecord,
    PoolExhausted,
    Request,
    StageRecord,
    StoreError,
)


class MemoryStore:
    """The NodeStore port: the SQLite store's rules (checked transitions, one event per
    transition, an address never held twice) without the file."""

    _DATA = (
        "_nodes",
        "_meta",
        "_requests",
        "_groups",
        "_unavailable",
        "_events",
        "_addresses",
        "_stages",
        "_outputs",
    )

    def __init__(self) -> None:
        self._nodes: dict[str, NodeRecord] = {}
        self._meta: dict[str, Any] = {}
        self._requests: list[tuple[Request, float | None]] = []
        self._uids: dict[str, int] = {}
        self._groups: dict[str, GroupHealth] = {}
        self._unavailable: dict[tuple[str, str], tuple[float, str]] = {}
        self._events: list[dict[str, Any]] = []
        self._addresses: dict[str, str] = {}  # node -> address
        self._stages: dict[int, StageRecord] = {}
        self._outputs: dict[tuple[int, str], OutputRecord] = {}
        self._lock = threading.RLock()

    @contextmanager
    def atomically(self) -> Iterator[None]:
        """Hold the lock for the block; on an exception put every field back as it was."""
        with self._lock:
            saved = {k: copy.deepcopy(getattr(self, k)) for k in self._DATA}
            try:
                yield
            except BaseException:
                for k, v in saved.items():
                    setattr(self, k, v)
                raise

    # -- heartbeat and meta ----------------------------------------------------------
    def beat(self, now: float, info: Mapping[str, Any]) -> None:
        self.meta_set("heartbeat", {"at": now, **info})

    def heartbeat(self) -> dict[str, Any] | None:
        beat = self.meta_get("heartbeat")
        return None if beat is None else dict(beat)

    def meta_get(self, key: str) -> Any:
        with self._lock:
            return copy.deepcopy(self._meta.get(key))

    def meta_items(self, prefix: str) -> dict[str, Any]:
        with self._lock:
            return {k: copy.deepcopy(v) for k, v in self._meta.items() if k.startswith(prefix)}

    def meta_set(self, key: str, value: Any) -> None:
        with self._lock:
            self._meta[key] = copy.deepcopy(value)

    def meta_delete(self, key: str) -> None:
        with self._lock:
            self._meta.pop(key, None)

    # -- groups and sizes ------------------------------------------------------------------
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

    # -- requests ----------------------------------------------------------------------------
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

    # -- nodes --------------------------------------------------------------------------------
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
            return len(gone)

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

    # -- the mesh address pool -------------------------------------------------------------------
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
