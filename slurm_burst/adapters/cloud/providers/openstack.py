"""OpenStack through libcloud's ``openstack`` driver (Nova 2.x, Keystone v3): a key pair
imported once, boot from a volume for a disk size, host keys from the console log
(docs/providers.md)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.cloud.providers import Provider

if TYPE_CHECKING:
    from libcloud.compute.base import NodeSize

    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.config.model import ProviderConfig
    from slurm_burst.core.cloud import LaunchSpec


class OpenStack(Provider):
    name = "openstack"
    imports_key_pair = True
    host_key_sources = MappingProxyType({"console": "slurm_burst.adapters.cloud.attest:Console"})
    host_key_reads_per_second = 5.0
    standard_env = MappingProxyType({
        "key": "OS_USERNAME",
        "secret": "OS_PASSWORD",
        "ex_force_auth_url": "OS_AUTH_URL",
        "ex_tenant_name": "OS_PROJECT_NAME",
    })  # fmt: skip
    file_extras = ("ex_force_auth_url", "ex_tenant_name", "ex_domain_name", "ex_force_auth_token")

    def construct(
        self, cls: Any, prov: ProviderConfig, kwargs: dict[str, Any], key: str, secret: str
    ) -> Any:
        kwargs.setdefault("api_version", "2.0")  # Nova 2.x; Neutron and Glance for the rest
        kwargs.setdefault("ex_force_auth_version", "3.x_password")
        if prov.region:
            kwargs.setdefault("ex_force_service_region", prov.region)
        return cls(key, secret, **kwargs)

    def launch_args(
        self, driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tags: Mapping[str, str]
    ) -> dict[str, Any]:
        from slurm_burst.adapters.cloud.profiles import user_data_args

        types: Any = importlib.import_module("libcloud.compute.drivers.openstack")  # untyped
        kw = user_data_args(driver, spec, size, tags)
        if p.key_name:
            kw["ex_keyname"] = p.key_name
        if p.network:
            kw["networks"] = [types.OpenStackNetwork(n, n, None, driver)
                              for n in p.network.split(",") if n.strip()]  # fmt: skip
        if p.security_groups:
            kw["ex_security_groups"] = [types.OpenStackSecurityGroup(None, None, g, "", driver)
                                        for g in p.security_groups]  # fmt: skip
        if p.zone:
            kw["ex_availability_zone"] = p.zone
        if spec.disk_gb:  # boot from a volume of that size, made from the image
            kw["ex_blockdevicemappings"] = [{
                "boot_index": 0, "uuid": spec.image, "source_type": "image",
                "destination_type": "volume", "volume_size": spec.disk_gb,
                "delete_on_termination": True,
            }]  # fmt: skip
        return kw


PROVIDER = OpenStack()
