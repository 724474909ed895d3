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
         ["stores.x.driver: must be one of s3, google_storage, azure_blobs"]),
    ],
)  # fmt: skip
def test_each_driver_has_its_names_checked(
    base: Config, kw: dict[str, object], said: list[str]
) -> None:
    assert problems(base, **kw) == said
