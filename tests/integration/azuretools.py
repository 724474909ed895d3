"""What the Azure emulator's tests share: the emulator on loopback (keeping its
exchanges), the daemon's ``azure_arm`` cloud on it as slurm-burst builds it, a launch's
spec, and the check of every request and answer against ``azure-mgmt-compute``'s models
(Compute's REST API as Microsoft's own SDK types it)."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.azureemu import CLIENT, SECRET, SUBSCRIPTION, TENANT, AzureEmulator

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.cloud.registry import provider
from slurm_burst.config import ProviderConfig
from slurm_burst.core.cloud import LaunchSpec
from slurm_burst.core.ratelimit import ApiBudgets
from slurm_burst.services.cloudcalls import CallSettings, ManagedCloud, SharedBudget
from slurm_burst.wiring.clouds import cloud_driver

models = pytest.importorskip("azure.mgmt.compute.models", reason="make test installs it")
IMAGE = "Debian:debian-12:12-gen2:latest"
GROUP = "burst-rg"


# enums the SDK documents as a partial list (VM sizes: "use List Available Sizes")
OPEN_ENUMS = {"VirtualMachineSizeTypes"}


def _hints(cls: type) -> dict[str, Any]:
    import azure.mgmt.compute.models._models as defined

    cls()  # the SDK works out a model's fields on its first instance
    ns = dict(vars(defined))
    ns["_models"] = models
    return typing.get_type_hints(cls, ns)


def conforms(value: Any, hint: Any, where: str, out: list[str]) -> None:
    """What in ``value`` the SDK's type ``hint`` does not allow, into ``out``: fields no
    model has, values of another type, an enum's value it does not know."""
    if value is None:
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        enums = [a for a in args if isinstance(a, type) and issubclass(a, Enum)
                 and a.__name__ not in OPEN_ENUMS]  # fmt: skip
        kinds = [a for a in args if a is not type(None)]
        if enums and isinstance(value, str):
            known = {str(e.value).lower() for en in enums for e in en}
            if value.lower() not in known:
                out.append(f"{where}: {value!r} is none of {sorted(known)[:8]}")
            return
        conforms(value, kinds[0], where, out)
    elif origin is list:
        if not isinstance(value, list):
            out.append(f"{where}: {type(value).__name__}, not a list")
            return
        for i, v in enumerate(value):
            conforms(v, args[0], f"{where}[{i}]", out)
    elif origin is dict:
        if not isinstance(value, dict):
            out.append(f"{where}: {type(value).__name__}, not an object")
            return
        for k, v in value.items():
            conforms(v, args[1], f"{where}[{k}]", out)
    elif (isinstance(hint, type) and hasattr(hint, "_attr_to_rest_field")) or (
        isinstance(hint, type) and hint.__module__.startswith("azure.mgmt.compute.models")
        and not issubclass(hint, Enum)
    ):  # fmt: skip
        if not isinstance(value, dict):
            out.append(f"{where}: {type(value).__name__}, not a {hint.__name__}")
            return
        hints = _hints(hint)
        fields = {rf._rest_name: a for a, rf in hint._attr_to_rest_field.items()}
        for k, v in value.items():
            if k not in fields:
                out.append(f"{where}.{k}: not a field of {hint.__name__}")
            else:
                conforms(v, hints[fields[k]], f"{where}.{k}", out)
    elif hint is str or (isinstance(hint, type) and issubclass(hint, Enum)):
        if not isinstance(value, str):
            out.append(f"{where}: {value!r} is not a string")
    elif hint is bool:
        if not isinstance(value, bool):
            out.append(f"{where}: {value!r} is not a boolean")
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            out.append(f"{where}: {value!r} is not an integer")
    elif hint is float and not isinstance(value, int | float):
        out.append(f"{where}: {value!r} is not a number")


def check_exchanges(emu: AzureEmulator, answers: list[tuple[str, Any]]) -> int:
    """Every scale set request the emulator kept, and each answer given, against the
    SDK's models: a scale set's PUT; VMs (listed, got); boot diagnostics' addresses."""
    problems: list[str] = []
    checked = 0
    for method, path, body in emu.requests:
        if body is not None and "/virtualMachineScaleSets/" in path:
            conforms(body, models.VirtualMachineScaleSet, f"{method} {path}", problems)
            checked += 1
    for what, doc in answers:
        model = {"set": models.VirtualMachineScaleSet, "vm": models.VirtualMachine,
                 "diag": models.RetrieveBootDiagnosticsDataResult}[what]  # fmt: skip
        conforms(doc, model, f"answer {what}", problems)
        checked += 1
    assert problems == [], "\n".join(problems[:20])
    return checked


@pytest.fixture()
def azure_emu() -> Iterator[AzureEmulator]:
    e = AzureEmulator(keys_after=0.0, page=2)
    e.keep_exchanges = True
    e.start()
    yield e
    e.stop()


def make_cloud(
    emu: AzureEmulator,
    zone: str = "",
    region: str = "eastus",
    settings: CallSettings | None = None,
    storage: str = "",
    ca_file: str = "",
) -> ManagedCloud:
    """The daemon's Azure cloud on the emulator: a service principal's credentials in
    the standard variables, the emulator as the profile's ``endpoint``, the provider's
    budget (ARM's buckets) paced per request."""
    from slurm_burst.adapters.cloud.profiles import Placement

    env = {"AZURE_CLIENT_ID": CLIENT, "AZURE_CLIENT_SECRET": SECRET,
           "AZURE_TENANT_ID": TENANT, "AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
           "SB_TEST_AZURE_SAS": storage}  # fmt: skip
    options = {"endpoint": emu.base}
    if ca_file:  # the emulator serves TLS with a certificate of this CA
        options["ca_file"] = ca_file
    if storage:  # the site's storage account for boot diagnostics (its SAS: ``storage``)
        options |= {"boot_diagnostics_storage": f"{emu.base}/",
                    "boot_diagnostics_sas_env": "SB_TEST_AZURE_SAS"}  # fmt: skip
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        prov = ProviderConfig(name="az", driver="azure_arm", region=region, zone=zone,
                              resource_group=GROUP, network="hpc-vnet", subnet="burst",
                              options=options)  # fmt: skip
        driver = cloud_driver(prov)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    placement = Placement(resource_group=GROUP, network="hpc-vnet", subnet="burst",
                          region=region, zone=zone, ssh_user="slurm")  # fmt: skip
    inner = LibcloudCloud("az", driver, placement)
    budget = SharedBudget("az", ApiBudgets(provider("azure_arm").api_table()))
    return ManagedCloud(inner, settings or CallSettings(base=0.05, cap=2.0), budget=budget)


def batch_spec(names: tuple[str, ...], token: str, least: int = 0,
               size: str = "Standard_D2s_v5", group: str = "cpu") -> LaunchSpec:  # fmt: skip
    return LaunchSpec(node=names[0], cluster="lab", group=group, size=size, image=IMAGE,
                      token=token, ssh_public_key="ssh-ed25519 AAAAC3Nz burst",
                      user_data="#!/bin/sh\necho booted\n", count=len(names),
                      min_count=least, names=names, disk_gb=64)  # fmt: skip


# The daemon on the Azure emulator: the EC2 tests' config with an Azure profile (boot
# diagnostics in the lab's storage account) and an on-demand group ("cpu") in place of
# the EC2 ones (the scale benchmark's too)
AZURE_PROFILE = """
[providers.az]
driver = "azure_arm"
region = "eastus"
resource_group = "burst-rg"
network = "hpc-vnet"
subnet = "burst"

[providers.az.options]
endpoint = "http://127.0.0.1:{port}"
boot_diagnostics_storage = "http://127.0.0.1:{port}/"
boot_diagnostics_sas_env = "SB_TEST_AZURE_SAS"

[node_groups.cpu]
pattern = "az-{{n}}"
count = {count}
partition = "burst-az"
providers = ["az"]
sizes = ["Standard_D2s_v5"]
image = "Debian:debian-12:12-gen2:latest"
cpus = 2
memory_mb = 7000
price_per_hour = {{ "Standard_D2s_v5" = 0.096 }}

"""


def azure_text(tmp: Path, port: int, cluster: str, count: int = 8, extra: str = "") -> str:
    """The EC2 tests' config text with :data:`AZURE_PROFILE` (``count`` nodes in its
    group) and ``extra`` in place of the EC2 profile and group, for the Azure emulator at
    ``port``; the service principal's standard variables and the storage account's SAS
    set in this process."""
    from slurm_burst_lab.azureemu import STORAGE_SAS

    from tests.integration.ec2config import with_profile

    os.environ.update({"AZURE_CLIENT_ID": CLIENT, "AZURE_CLIENT_SECRET": SECRET,
                       "AZURE_TENANT_ID": TENANT, "AZURE_SUBSCRIPTION_ID": SUBSCRIPTION,
                       "SB_TEST_AZURE_SAS": STORAGE_SAS})  # fmt: skip
    return with_profile(cluster, tmp, port, AZURE_PROFILE.format(port=port, count=count) + extra)


# A Spot group with the on-demand group "cpu" as its fallback, a proximity placement
# group per job (the daemon's tests and the capacity benchmark)
SPOT_GROUP = """
[node_groups.spot]
pattern = "spot-{{n}}"
count = 8
partition = "burst-spot"
providers = ["az"]
sizes = ["Standard_D2s_v5"]
image = "Debian:debian-12:12-gen2:latest"
cpus = 2
memory_mb = 7000
spot = true
spot_fallback = "cpu"
spot_fallback_after = {wait}
placement = "proximity"
price_per_hour = {{ "Standard_D2s_v5" = 0.096 }}

"""


def azure_config(tmp: Path, port: int, wait: float = 30.0, cluster: str = "") -> Any:
    """The daemon's config on the Azure emulator at ``port`` (plain HTTP), with the Spot
    group."""
    import time

    from tests.integration.ec2config import spot_config

    (tmp / "slurm").mkdir(exist_ok=True)
    return spot_config(tmp, azure_text(tmp, port, cluster or f"a{time.time_ns() % 10**9}",
                                       extra=SPOT_GROUP.format(wait=wait)))  # fmt: skip
