"""What the GCE emulator's tests share: the emulator on loopback (keeping its exchanges),
libcloud's GCE driver as slurm-burst builds it for it, a launch's spec, and the check of
every request and answer against Compute's own discovery document (``compute.v1.json``,
shipped by google-api-python-client)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.gceemu import GceEmulator, write_key_file

from slurm_burst.config import ProviderConfig
from slurm_burst.core.cloud import LaunchSpec
from slurm_burst.wiring.clouds import cloud_driver

ZONE = "us-central1-a"
IMAGE = "debian-12-bookworm-v20261001"


def _discovery() -> dict[str, Any]:
    import googleapiclient  # type: ignore[import-untyped]

    path = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
    return dict(json.loads((path / "compute.v1.json").read_text()))


DISCOVERY = _discovery()
SCHEMAS: dict[str, Any] = DISCOVERY["schemas"]


def conforms(value: Any, schema: dict[str, Any], where: str, out: list[str]) -> None:
    """What in ``value`` the discovery document's ``schema`` does not allow, into ``out``:
    unknown fields, and values of another type (int64 and uint64 travel as strings; a
    JSON null is a field left unset, as Google's APIs read it)."""
    if value is None:
        return
    if "$ref" in schema:
        schema = SCHEMAS[schema["$ref"]]
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            out.append(f"{where}: {type(value).__name__}, not an object")
            return
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                conforms(v, props[k], f"{where}.{k}", out)
            elif extra is not None:
                conforms(v, extra, f"{where}[{k}]", out)
            else:
                out.append(f"{where}.{k}: not a field of {schema.get('id', 'the object')}")
    elif kind == "array":
        if not isinstance(value, list):
            out.append(f"{where}: {type(value).__name__}, not an array")
            return
        for i, v in enumerate(value):
            conforms(v, schema["items"], f"{where}[{i}]", out)
    elif kind == "string":
        if not isinstance(value, str):
            out.append(f"{where}: {value!r} is not a string ({schema.get('format', '')})")
        elif "enum" in schema and value not in schema["enum"]:
            out.append(f"{where}: {value!r} is none of {schema['enum'][:8]}")
    elif kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            out.append(f"{where}: {value!r} is not an integer")
    elif kind == "boolean":
        if not isinstance(value, bool):
            out.append(f"{where}: {value!r} is not a boolean")
    elif kind == "number" and not isinstance(value, (int, float)):
        out.append(f"{where}: {value!r} is not a number")


def schema_of_kind(kind: str) -> str:
    """Compute's ``kind`` names its schema: compute#instanceList -> InstanceList."""
    name = kind.split("#", 1)[1]
    return name[0].upper() + name[1:]


REQUESTS = {"instances": "Instance", "bulkInsert": "BulkInsertInstanceResource",
            "setLabels": "InstancesSetLabelsRequest",
            "resourcePolicies": "ResourcePolicy"}  # fmt: skip


def check_exchanges(emu: GceEmulator) -> int:
    """Every request body and answer the emulator kept, against the discovery document."""
    problems: list[str] = []
    for method, path, body in emu.requests:
        if body is not None:
            schema = REQUESTS[path.rstrip("/").rsplit("/", 1)[-1]]
            conforms(body, {"$ref": schema}, f"{method} {path}", problems)
    for what, answer in emu.answers:
        conforms(answer, {"$ref": schema_of_kind(answer["kind"])}, f"answer to {what}", problems)
    assert problems == [], "\n".join(problems[:20])
    return len(emu.requests) + len(emu.answers)


@pytest.fixture()
def emu() -> Iterator[GceEmulator]:
    e = GceEmulator()
    e.keep_exchanges = True
    e.start()
    yield e
    e.stop()


@pytest.fixture()
def driver(emu: GceEmulator, tmp_path: Path) -> Any:
    return make_driver(emu, tmp_path, zone=ZONE)


def make_driver(emu: GceEmulator, tmp_path: Path, zone: str = "", region: str = "") -> Any:
    """libcloud's GCE driver as slurm-burst builds it for a profile in a ``zone`` or a
    ``region``: a service account key (made here, 0600) and the emulator as the
    profile's ``endpoint``: the token is exchanged there."""
    sa = tmp_path / "sa.json"
    if not sa.exists():
        write_key_file(sa)
    os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(sa)
    try:
        prov = ProviderConfig(name="gcp", driver="gce", zone=zone, region=region, options={
            "endpoint": f"http://127.0.0.1:{emu.port}",
            "credential_file": str(tmp_path / "token-cache.json"),
        })  # fmt: skip
        return cloud_driver(prov)
    finally:
        del os.environ["GOOGLE_APPLICATION_CREDENTIALS"]


def batch_spec(names: tuple[str, ...], token: str, least: int = 0, size: str = "n2-standard-2"
           ) -> LaunchSpec:  # fmt: skip
    return LaunchSpec(node=names[0], cluster="lab", group="gce", size=size, image=IMAGE,
                      token=token, ssh_public_key="ssh-ed25519 AAAAC3Nz burst",
                      user_data="#!/bin/sh\n", count=len(names), min_count=least,
                      names=names, spot=True)  # fmt: skip


# The daemon on the GCE emulator: the EC2 tests' config with a GCE profile and an
# on-demand group ("cpu") in place of the EC2 ones (the scale benchmark's too) ...
GCE_PROFILE = """
[providers.gcp]
driver = "gce"
region = "us-central1"
zone = "us-central1-a"
credentials = {{ key_env = "SB_TEST_GCE_ACCOUNT", secret_env = "SB_TEST_GCE_KEY_FILE" }}

[providers.gcp.options]
project = "burst-lab"
endpoint = "http://127.0.0.1:{port}"
credential_file = "{tmp}/token"

[node_groups.cpu]
pattern = "gce-{{n}}"
count = {count}
partition = "burst-gce"
providers = ["gcp"]
sizes = ["n2-standard-2"]
image = "slurm-burst-node-v1"
cpus = 2
memory_mb = 3500
price_per_hour = {{ "n2-standard-2" = 0.0971 }}

"""
# ... and a Spot group that falls back to it, one compact placement policy per job
SPOT_GROUP = """
[node_groups.spot]
pattern = "spot-{{n}}"
count = 8
partition = "burst-spot"
providers = ["gcp"]
sizes = ["n2-standard-2"]
image = "slurm-burst-node-v1"
cpus = 2
memory_mb = 3500
spot = true
spot_fallback = "cpu"
spot_fallback_after = {wait}
placement = "compact"
price_per_hour = {{ "n2-standard-2" = 0.0971 }}

"""


def gce_text(tmp: Path, port: int, cluster: str, count: int = 8, extra: str = "") -> str:
    """The EC2 tests' config text with :data:`GCE_PROFILE` (``count`` nodes in its group)
    and ``extra`` in place of the EC2 profile and group, for the GCE emulator at
    ``port``; its service account key made under ``tmp``, the credentials' variables
    set in this process."""
    from tests.integration.ec2config import with_profile

    key = tmp / "sa.json"
    if not key.exists():
        write_key_file(key)
    os.environ["SB_TEST_GCE_ACCOUNT"] = "slurm-burst@burst-lab.iam.gserviceaccount.com"
    os.environ["SB_TEST_GCE_KEY_FILE"] = str(key)
    profile = GCE_PROFILE.format(port=port, tmp=tmp, count=count)
    return with_profile(cluster, tmp, port, profile + extra)


def gce_config(tmp: Path, port: int, wait: float = 30.0, cluster: str = "") -> Any:
    """The daemon's config on the GCE emulator at ``port``, with the Spot group."""
    import time

    from tests.integration.ec2config import spot_config

    (tmp / "slurm").mkdir(exist_ok=True)
    return spot_config(tmp, gce_text(tmp, port, cluster or f"g{time.time_ns() % 10**9}",
                                     extra=SPOT_GROUP.format(wait=wait)))  # fmt: skip
