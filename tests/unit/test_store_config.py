"""[stores.*] checks by driver: each provider's own naming rules, said by key."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_burst.config.load import load_config
from slurm_burst.config.model import Config, StoreConfig
from slurm_burst.config.validate_staging import staging_problems
from tests.conftest import LAB_CONFIG


@pytest.fixture(scope="module")
def base() -> Config:
    return load_config(LAB_CONFIG)


def problems(base: Config, **kw: object) -> list[str]:
    st = StoreConfig(name="x", **kw)  # type: ignore[arg-type]
    cfg = dataclasses.replace(base, stores={"x": st}, staging=dataclasses.replace(
        base.staging, store="x"))  # fmt: skip
    return [f"{p.path}: {p.message}" for p in staging_problems(cfg) if p.path.startswith("stores")]


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"bucket": "site-stage", "driver": "s3"}, []),
        ({"bucket": "site-stage", "driver": "google_storage"}, []),
        ({"bucket": "burst-staging", "driver": "azure_blobs"}, []),
        ({"bucket": "site.stage", "driver": "azure_blobs"},
         ["stores.x.bucket: must be an Azure container name (3-63 of a-z0-9-, no --)"]),
        ({"bucket": "a--b", "driver": "azure_blobs"},
         ["stores.x.bucket: must be an Azure container name (3-63 of a-z0-9-, no --)"]),
        ({"bucket": "Site", "driver": "s3"},
         ["stores.x.bucket: must be an S3 bucket name (3-63 of a-z0-9.-)"]),
        ({"bucket": "site-stage", "driver": "ftp"},
         ["stores.x.driver: must be one of s3, google_storage, azure_blobs, mesh"]),
        ({"driver": "s3"}, ["stores.x.bucket: must be an S3 bucket name (3-63 of a-z0-9.-)"]),
        ({"driver": "mesh", "directory": "/srv/burst-store"}, []),
        ({"driver": "mesh", "directory": "/srv/burst-store", "endpoint": "10.77.0.1:9000"}, []),
        ({"driver": "mesh", "directory": "srv/store"},
         ["stores.x.directory: directory='srv/store': an absolute path of letters, digits and "
          "._+@/,=:~- (no blanks or quotes), at most 4096 bytes"]),
        ({"driver": "mesh", "directory": "/srv/s", "endpoint": "192.168.1.5:9000"},
         ["stores.x.endpoint: must be ADDRESS:PORT, ADDRESS in the mesh (10.77.0.0/24): the "
          "nodes reach the store there"]),
        ({"driver": "mesh", "directory": "/srv/s", "endpoint": "10.77.0.1"},
         ["stores.x.endpoint: must be ADDRESS:PORT, ADDRESS in the mesh (10.77.0.0/24): the "
          "nodes reach the store there"]),
    ],
)  # fmt: skip
def test_each_driver_has_its_names_checked(
    base: Config, kw: dict[str, object], said: list[str]
) -> None:
    assert problems(base, **kw) == said


def test_a_mesh_store_is_served_on_the_hubs_address_with_a_key_only_root_reads(
    base: Config, tmp_path: object
) -> None:
    from pathlib import Path

    from slurm_burst.core.staging import StorageUnavailable
    from slurm_burst.wiring.storage import mesh_store_servers, object_store

    state = Path(str(tmp_path))
    st = StoreConfig(name="m", driver="mesh", directory=str(state / "store"))
    cfg = dataclasses.replace(
        base, stores={"m": st}, daemon=dataclasses.replace(base.daemon, state_dir=str(state))
    )
    with pytest.raises(StorageUnavailable, match="made by the daemon at its start"):
        object_store(cfg, "m")  # before the daemon ever ran
    [server] = mesh_store_servers(cfg)
    hub = base.mesh.subnet.split("/")[0].rsplit(".", 1)[0] + ".1"
    assert server.listen == (hub, 8479) and not server.up
    client = object_store(cfg, "m")
    assert client.grant("sb/k", 60).startswith(f"http://{hub}:8479/sb/k?")
    assert (state / "mesh-store-m.key").stat().st_mode & 0o777 == 0o600
