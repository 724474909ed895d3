"""The ports: what services need from the outside world, as Protocols.

Adapters implement them; services receive them through their constructors
(see ``slurm_burst.wiring``). Nothing in ``core`` or the services imports an
adapter's libraries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from slurm_burst.core.cloud import Instance, LaunchSpec
from slurm_burst.core.mesh import Peer
from slurm_burst.core.slurm import SlurmJob, SlurmNode, SlurmPartition


class Scheduler(Protocol):
    """Slurm, as the daemon sees it."""

    def nodes(self) -> list[SlurmNode]: ...

    def jobs(self, partitions: Sequence[str] | None = None) -> list[SlurmJob]: ...

    def job_counts(self, partitions: Sequence[str] | None = None) -> dict[tuple[str, str], int]: ...

    def partitions(self) -> list[SlurmPartition]: ...

    def ping(self) -> bool: ...

    def update_nodes(
        self,
        names: Sequence[str],
        *,
        state: str | None = None,
        reason: str | None = None,
        addrs: Sequence[str] | None = None,
        hostnames: Sequence[str] | None = None,
    ) -> None: ...


class Cloud(Protocol):
    """One provider profile (a libcloud driver with its region and credentials)."""

    name: str
    batch_max: int  # instances one launch call may make (1: no batching)

    def launch(self, spec: LaunchSpec) -> Instance: ...

    def launch_many(self, spec: LaunchSpec) -> list[Instance]: ...  # spec.count, all or none

    def find(self, token: str, cluster: str) -> list[Instance]: ...  # what a token launched

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None: ...

    def get(self, instance_id: str) -> Instance | None: ...

    def list_instances(self, cluster: str) -> list[Instance]: ...

    def terminate(self, instance_id: str) -> None: ...

    def host_keys(self, instance_id: str) -> list[tuple[str, str]]: ...


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
    def connect(
        self, host: str, host_keys: Sequence[tuple[str, str]], deadline: float
    ) -> RemoteShell: ...


class Ledger(Protocol):
    """Append-only cost records (the SQL ledger)."""

    def instance_event(
        self,
        *,
        node: str,
        instance_id: str,
        provider: str,
        size: str,
        price_per_hour: float,
        event: str,
        at: float,
        detail: str = "",
        group: str = "",
        partition: str = "",
        cpus: int = 0,
        gpus: int = 0,
        price_source: str = "",
        price_version: str = "",
    ) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
