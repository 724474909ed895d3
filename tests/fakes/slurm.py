"""Slurm's controller in memory: nodes, jobs, and what ``scontrol update`` does to them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from slurm_burst.core.slurm import (
    SchedulerError,
    SlurmJob,
    SlurmNode,
    SlurmPartition,
    check_names,
    check_update,
)


class FakeScheduler:
    """The Scheduler port. Every ``update_nodes`` call is kept in ``updates``.

    States follow ``scontrol update``: ``drain`` adds DRAIN with the reason, ``resume``
    lifts DRAIN and DOWN, ``down`` sets DOWN with the reason, ``power_down_force`` puts
    a cloud node back to powered down (idle~), ``power_up`` marks it powering up and
    ``power_down`` powering down. ``refuse`` fails every update it returns
    a message for.
    """

    def __init__(self, nodes: Sequence[SlurmNode] = (), jobs: Sequence[SlurmJob] = ()) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._jobs = list(jobs)
        self.updates: list[dict[str, Any]] = []
        self.refuse: Callable[[Sequence[str], dict[str, Any]], str | None] | None = None
        self.registered_calls = 0
        self.gpus: dict[int, dict[str, tuple[int, ...]]] = {}  # job -> node -> GPU indices
        self.job_gpus_calls: list[list[int]] = []
        self.scripts: dict[int, str] = {}  # job -> its batch script
        self.signals: list[tuple[int, str, bool]] = []  # (job, signal, batch only) sent
        self.requeued: list[int] = []
        self.dynamic: set[str] = set()  # nodes made by create_nodes (deletable)
        self.created: list[tuple[list[str], dict[str, str]]] = []  # each create_nodes call
        self.deleted: list[list[str]] = []  # each delete_nodes call
        # a created node's partitions by its last feature (its NodeSet's); default: all
        self.dynamic_partitions: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    @classmethod
    def cloud_nodes(cls, names: Sequence[str], partition: str = "burst") -> FakeScheduler:
        """Cloud nodes powered down, as Slurm starts them."""
        sched = cls()
        sched.add_cloud_nodes(names, partition)
        return sched

    def add_cloud_nodes(self, names: Sequence[str], partition: str) -> None:
        with self._lock:
            for n in names:
                self._nodes[n] = SlurmNode(
                    n, "idle", frozenset({"CLOUD", "POWERED_DOWN"}), (partition,), addr=n
                )

    def nodes(self) -> list[SlurmNode]:
        with self._lock:
            return list(self._nodes.values())

    def registered(self, names: Sequence[str]) -> set[str]:
        with self._lock:
            self.registered_calls += 1
            return {n for n in names if n in self._nodes and self._nodes[n].registered}

    def jobs(self, partitions: Sequence[str] | None = None) -> list[SlurmJob]:
        return [j for j in self._jobs if not partitions or j.partition in partitions]

    def job_counts(self, partitions: Sequence[str] | None = None) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for j in self.jobs(partitions):
            out[(j.partition, j.state)] = out.get((j.partition, j.state), 0) + 1
        return out

    def partitions(self) -> list[SlurmPartition]:
        parts = sorted({p for n in self._nodes.values() for p in n.partitions})
        return [SlurmPartition(p, "", "UP", "UNLIMITED") for p in parts]

    def job_gpus(self, job_ids: Sequence[int]) -> dict[int, dict[str, tuple[int, ...]]]:
        self.job_gpus_calls.append(list(job_ids))
        return {j: dict(self.gpus[j]) for j in job_ids if j in self.gpus}

    def ping(self) -> bool:
        return True

    # -- JobControl ------------------------------------------------------------------
    def jobs_on(self, node: str, states: str = "RUNNING") -> list[int]:
        from slurm_burst.core.hostlist import expand

        wanted = None if states == "all" else set(states.split(","))
        return sorted(j.job_id for j in self._jobs
                      if (wanted is None or j.state in wanted)
                      and j.nodes and node in expand(j.nodes))  # fmt: skip

    def batch_script(self, job_id: int) -> str:
        return self.scripts.get(job_id, "")

    def signal_job(self, job_id: int, signal: str, batch_only: bool) -> None:
        with self._lock:
            self.signals.append((job_id, signal, batch_only))

    def requeue(self, job_ids: Sequence[int]) -> None:
        with self._lock:
            self.requeued.extend(job_ids)
            self._jobs = [j if j.job_id not in job_ids else replace(j, state="PENDING", nodes="")
                          for j in self._jobs]  # fmt: skip

    def update_nodes(
        self,
        names: Sequence[str],
        *,
        state: str | None = None,
        reason: str | None = None,
        addrs: Sequence[str] | None = None,
        hostnames: Sequence[str] | None = None,
        comment: str | None = None,
        instance: tuple[str, str, str] | None = None,
    ) -> None:
        check_update(names, state, reason, addrs, hostnames, comment, instance)
        with self._lock:
            said: dict[str, object] = {"comment": comment} if comment is not None else {}
            if instance is not None:
                said["instance"] = instance
            self.updates.append(
                {"nodes": list(names), "state": state, "reason": reason, "addrs": addrs, **said}
            )
            change = {"state": state, "reason": reason, "addrs": addrs, "hostnames": hostnames}
            refused = self.refuse(names, change) if self.refuse is not None else None
            if refused is not None:
                raise SchedulerError(f"scontrol update: {refused}")
            unknown = [n for n in names if n not in self._nodes]
            if unknown:
                raise SchedulerError(f"scontrol update: Invalid node name specified {unknown[0]}")
            for i, name in enumerate(names):
                self._nodes[name] = _update(
                    self._nodes[name],
                    state,
                    reason,
                    addrs[i] if addrs is not None else None,
                    hostnames[i] if hostnames is not None else None,
                )

    def create_nodes(self, names: Sequence[str], settings: Sequence[tuple[str, object]]) -> None:
        """As slurmctld's create_nodes: State=CLOUD only; a name that exists fails the
        call (the names before it are made, as Slurm's loop leaves them)."""
        check_names(names)
        given = {k: str(v) for k, v in settings}
        with self._lock:
            self.created.append((list(names), given))
            if given.get("State", "").upper() != "CLOUD":
                raise SchedulerError(
                    "scontrol create: Only State=FUTURE, CLOUD, or EXTERNAL allowed"
                )
            parts = tuple(sorted({p for n in self._nodes.values() for p in n.partitions}))
            features = tuple(given.get("Features", "").split(",")) if given.get("Features") else ()
            for name in names:
                if name in self._nodes:
                    raise SchedulerError(f"scontrol create: Duplicate node name {name}")
                self._nodes[name] = SlurmNode(
                    name, "idle", frozenset({"CLOUD", "POWERED_DOWN", "DYNAMIC_NORM"}),
                    self.dynamic_partitions.get(features[-1], parts) if features else parts,
                    features=features, addr=name,
                )  # fmt: skip
                self.dynamic.add(name)

    def delete_nodes(self, names: Sequence[str]) -> None:
        """As slurmctld's delete_nodes: each dynamic node without a job or reservation
        goes; the others are named in the error."""
        check_names(names)
        with self._lock:
            self.deleted.append(list(names))
            refused = []
            for name in names:
                n = self._nodes.get(name)
                busy = n is not None and (
                    n.state in ("allocated", "mixed", "completing")
                    or bool(n.flags & {"RESERVED", "COMPLETING"})
                )
                if n is None or name not in self.dynamic or busy:
                    refused.append(name)
                    continue
                del self._nodes[name]
                self.dynamic.discard(name)
            if refused:
                raise SchedulerError(f"scontrol delete: failed to delete nodes {','.join(refused)}")

    def slurmd_registered(self, names: Sequence[str]) -> None:
        """What slurmctld does when the nodes' slurmd register: powered up, idle."""
        with self._lock:
            for name in names:
                n = self._nodes[name]
                self._nodes[name] = n._replace(state="idle", flags=n.flags - {"POWERING_UP"})

    # -- what tests look at --------------------------------------------------------
    def node(self, name: str) -> SlurmNode:
        return self._nodes[name]

    def states_set(self, name: str) -> list[str]:
        return [u["state"] for u in self.updates if name in u["nodes"] and u["state"]]


def _update(
    n: SlurmNode, state: str | None, reason: str | None, addr: str | None, hostname: str | None
) -> SlurmNode:
    flags = set(n.flags)
    base = n.state
    if state == "drain":
        flags.add("DRAIN")
    elif state == "resume":
        flags.discard("DRAIN")
        base = "idle" if base == "down" else base
        reason = ""
    elif state == "down":
        base = "down"
    elif state == "power_down_force":
        flags -= {"POWERING_UP", "DRAIN"}
        flags.add("POWERED_DOWN")
        base, reason = "idle", ""
    elif state == "power_up":  # Slurm resumes it: powering up until it registers
        flags.discard("POWERED_DOWN")
        flags.add("POWERING_UP")
    elif state == "power_down":  # Slurm suspends it (SuspendProgram), then powered down
        flags.add("POWERING_DOWN")
    elif state is not None:
        raise SchedulerError(f"scontrol update: state {state} not modelled by the fake")
    return n._replace(
        state=base,
        flags=frozenset(flags),
        reason=n.reason if reason is None else reason,
        addr=n.addr if addr is None else addr,
        hostname=n.hostname if hostname is None else hostname,
    )
