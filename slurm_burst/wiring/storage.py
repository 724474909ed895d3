"""Staged data: the object stores, the mesh stores the daemon serves, the stager of
``slurm-burst stage``, what transfers and storage cost, what the site keeps home.

A store's own client library (Azure's, Google's) is imported where that store is
built, and matplotlib where a plot is drawn: a site pays only for what it uses."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_burst.adapters.asuser import run_as as child_as
from slurm_burst.adapters.cloud.credentials import resolve_store
from slurm_burst.adapters.nodeapi import LIMITS as NODE_API
from slurm_burst.adapters.storage.home import LocalHome
from slurm_burst.adapters.storage.mesh import LIMITS as MESH_STORE
from slurm_burst.adapters.storage.mesh import MeshStore, MeshStoreServer, load_key
from slurm_burst.adapters.storage.s3 import S3Store
from slurm_burst.adapters.storage.tree import LocalTree, symlinks_in
from slurm_burst.config import Config
from slurm_burst.config.model import StoreConfig
from slurm_burst.core.mesh import hub_address
from slurm_burst.core.simulate import Comparison
from slurm_burst.core.staging import KeptHome, StorageUnavailable, path_spellings
from slurm_burst.core.tuning import Point
from slurm_burst.ports import Clock, Ledger, Metrics, ObjectStore
from slurm_burst.services.staging import Progress, Stager, StagingSettings
from slurm_burst.services.transfers import StorePrices, TransferBook
from slurm_burst.trusted import Writers
from slurm_burst.wiring.light import clock


def object_store(cfg: Config, name: str) -> ObjectStore:
    """The store ``name`` of ``[stores]`` (StorageUnavailable if there is none)."""
    st = cfg.stores.get(name)
    if st is None:
        known = ", ".join(sorted(cfg.stores)) or "none configured"
        raise StorageUnavailable(f"no store {name!r} in [stores] ({known})")
    if st.driver == "mesh":  # the daemon serves it; its key is root's, made at the start
        host, port = mesh_store_address(cfg, st)
        secret = load_key(mesh_store_key(cfg, name), create=False, writers=state_writers(cfg))
        return MeshStore(st.name, host=host, port=port, secret=secret)
    if st.driver == "azure_blobs":
        from slurm_burst.adapters.storage.azure import AzureBlobStore

        return AzureBlobStore(st.name, container=st.bucket, keys=resolve_store(st),
                              endpoint=st.endpoint, secure=st.secure)  # fmt: skip
    if st.driver == "google_storage":  # an HMAC key; grants: V4 signed URLs
        from slurm_burst.adapters.storage.gcs import GcsStore

        return GcsStore(st.name, bucket=st.bucket, keys=resolve_store(st),
                        endpoint=st.endpoint, secure=st.secure)  # fmt: skip
    return S3Store(
        st.name, bucket=st.bucket, region=st.region, keys=resolve_store(st),
        endpoint=st.endpoint, secure=st.secure,
    )  # fmt: skip


MESH_STORE_PORT = 8479  # a mesh store's port where its endpoint names none


def mesh_store_address(cfg: Config, st: StoreConfig) -> tuple[str, int]:
    """Where the daemon serves a mesh store: its endpoint, or the hub's mesh address."""
    if st.endpoint:
        host, _, port = st.endpoint.rpartition(":")
        return host, int(port)

    return hub_address(cfg.mesh.subnet), MESH_STORE_PORT


def state_writers(cfg: Config) -> Writers:
    """Who may own what the daemon keeps in its state directory (root, us) and change
    the directories it is in (SlurmUser's group too: state_dir is 0770 in it)."""

    return Writers.us(group=cfg.daemon.group)


def descriptor_budget(cfg: Config) -> int:
    """The connections the daemon's HTTP servers may hold open at once, all together:
    their descriptor budget (adapters.served.Limits), to keep well under LimitNOFILE."""

    stores = sum(st.driver == "mesh" for st in cfg.stores.values())
    return NODE_API.connections + stores * MESH_STORE.connections


def mesh_store_key(cfg: Config, name: str) -> Path:
    return Path(cfg.daemon.state_dir) / f"mesh-store-{name}.key"


def mesh_store_servers(cfg: Config) -> list[MeshStoreServer]:
    """The daemon's servers of the mesh stores (each one's grant key made if missing)."""
    out = []
    for name, st in sorted(cfg.stores.items()):
        if st.driver == "mesh":
            key = load_key(mesh_store_key(cfg, name), create=True, writers=state_writers(cfg))
            out.append(MeshStoreServer(st.directory, key, mesh_store_address(cfg, st)))
    return out


def kept_home(cfg: Config) -> KeptHome:
    """What the site keeps on-prem: staging's paths, and the on-prem-only accounts and QOS
    of the burst policy."""

    accounts, qos = cfg.policy.onprem_only()
    return KeptHome(
        paths=cfg.staging.onprem_only_paths, accounts=frozenset(accounts), qos=frozenset(qos)
    )


def kept_paths(cfg: Config) -> tuple[str, ...]:
    """Every spelling on this host of staging.onprem_only_paths (configured, resolved,
    and through the symlinks that lead to them), for the rendered burst_buffer.lua."""

    out = [s for p in cfg.staging.onprem_only_paths
           for s in path_spellings(p, os.path.realpath, symlinks_in)]  # fmt: skip
    return tuple(dict.fromkeys(out))


def run_as(user: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` in a child that is ``user`` (adapters/asuser.py)."""
    return child_as(user, fn)


def stager(cfg: Config, store: str = "", progress: Progress | None = None) -> Stager:
    """The stager of ``slurm-burst stage`` on ``store`` (default: staging.store)."""
    s = cfg.staging
    name = store or s.store
    if not name:
        raise StorageUnavailable("no store named: give --store, or set staging.store")
    objects = object_store(cfg, name)  # StorageUnavailable when [stores] has no such store
    settings = StagingSettings(
        prefix=cfg.stores[name].prefix,
        transfers=s.transfers,
        bandwidth=s.bandwidth_mbit * 1e6 / 8,
        compress=s.compress,
        grant_seconds=s.grant_seconds,
    )
    return Stager(
        settings=settings, store=objects, tree=LocalTree(s.marker),
        clock=clock(), kept=kept_home(cfg), progress=progress, home=LocalHome(),
    )  # fmt: skip


def transfer_book(
    cfg: Config, store: str, clock: Clock, ledger: Ledger | None, metrics: Metrics | None = None
) -> TransferBook:
    """What staging's transfers cost, into ``ledger`` (the store's prices)."""
    return TransferBook(cfg.cluster.name, prices(store, cfg.stores[store]), clock, ledger, metrics)


def prices(name: str, st: StoreConfig) -> StorePrices:
    """A store's prices, as staging's book and the burst policy count them."""
    return StorePrices(
        store=name, provider=st.providers[0] if len(st.providers) == 1 else "",
        upload_per_gb=st.upload_per_gb, download_per_gb=st.download_per_gb,
        egress_per_gb=st.egress_per_gb, storage_per_gb_month=st.storage_per_gb_month,
    )  # fmt: skip


def plot_simulation(rows: list[Comparison], title: str, directory: str) -> list[str]:
    """The simulator's plots (matplotlib, imported here: only ``simulate --plot`` needs it)."""
    from slurm_burst.adapters.plots import plot

    return plot(rows, title, directory)


def plot_tuning(points: Sequence[Point], target: float, title: str, directory: str) -> list[str]:
    """The tuning's frontier plot (matplotlib, imported here: only ``--plot`` needs it)."""
    from slurm_burst.adapters.plots import plot_frontier

    return plot_frontier(points, target, title, directory)
