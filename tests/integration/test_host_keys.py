"""Host keys read where each provider's API publishes them, in each API's real shape.

GCE (guest attributes; serial port), Azure (boot diagnostics) and OpenStack (console)
at the HTTP boundary with recorded answers (tests/data/providers/, keys filled in from
freshly generated ones); EC2 through the emulator's GetConsoleOutput, whose ``Latest``
flag depends on the instance type. The lab's tests then connect to VMs with such keys
(tests/lab/test_host_key_sources.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.ec2emu import Ec2Emulator

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.cloud.profiles import Placement
from slurm_burst.core.cloud import CloudError, LaunchSpec
from slurm_burst.core.hostkeys import SERIAL_PORT_SCRIPT
from tests.providers import (
    DEBIAN,
    NOVA,
    PUB,
    USER_DATA,
    Http,
    generate_host_keys,
    key_values,
    spec,
)

pytest.importorskip("responses", reason="needs responses (make test installs it)")
GUEST_ATTRIBUTES = "zones/us-central1-a/instances/node-name/getGuestAttributes"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    return generate_host_keys(tmp_path_factory.mktemp("hostkeys"))


def test_gce_reads_the_guest_environments_hostkeys_attributes(
    http: Http, gce: Any, keys: list[tuple[str, str]]
) -> None:
    http.values.update(key_values(keys))
    cloud = gce(http)
    inst = cloud.list_instances("c1")[0]
    assert cloud.host_keys(inst.id) == keys
    asked = [u for m, u, _ in http.sent if m == "GET" and GUEST_ATTRIBUTES in u]
    assert asked and asked[-1].endswith("queryPath=hostkeys%2F"), asked


def test_gce_guest_attributes_not_published_yet_is_not_an_error(http: Http, gce: Any) -> None:
    cloud = gce(http, {("GET", GUEST_ATTRIBUTES): (404, "error_not_found.json")})
    inst = cloud.list_instances("c1")[0]
    assert cloud.host_keys(inst.id) == []


def test_gce_guest_attributes_refused_is_the_providers_error(http: Http, gce: Any) -> None:
    cloud = gce(http, {("GET", GUEST_ATTRIBUTES): (403, "error_quota.json")})
    inst = cloud.list_instances("c1")[0]
    with pytest.raises(CloudError):
        cloud.host_keys(inst.id)


def test_gce_serial_port_profile_prints_the_block_and_reads_it(
    http: Http, gce: Any, keys: list[tuple[str, str]]
) -> None:
    http.values.update(key_values(keys))
    from slurm_burst.adapters.cloud.providers.gce import PROVIDER

    cloud = gce(http, host_keys="serial-port")
    # what a launch's instances carry (every GCE launch: a bulk insert, test_gce_market)
    items = PROVIDER.metadata(spec("node-name", "n1-standard-1", DEBIAN), cloud.placement)
    assert items == {"startup-script": USER_DATA + SERIAL_PORT_SCRIPT, "ssh-keys": f"slurm:{PUB}"}
    inst = cloud.list_instances("c1")[0]
    assert cloud.host_keys(inst.id) == keys


SERIAL_LOG = ".serialconsole.log"


def test_azure_reads_the_boot_diagnostics_serial_log_asking_for_its_address_once(
    http: Http, azure: Any, keys: list[tuple[str, str]]
) -> None:
    http.values.update(key_values(keys))
    cloud = azure(http, {("GET", SERIAL_LOG): (200, "serialconsole.log")})
    vm = cloud.list_instances("c1")[0]
    assert cloud.host_keys(vm.id) == keys
    assert cloud.host_keys(vm.id) == keys
    posts = [u for m, u, _ in http.sent if m == "POST" and "retrieveBootDiagnosticsData" in u]
    assert len(posts) == 1 and "sasUriExpirationTimeInMinutes=60" in posts[0], posts
    reads = [u for m, u, _ in http.sent if m == "GET" and SERIAL_LOG in u]
    assert len(reads) == 2 and reads[0].startswith("https://md-"), reads


def test_azure_serial_log_not_written_yet_keeps_its_address_and_an_expired_one_is_renewed(
    http: Http, azure: Any
) -> None:
    """A log not written yet (404) keeps its address: one ARM write per VM, not one per
    read (ARM allows ten writes a second); an expired address (403) is asked for again."""
    cloud = azure(http, {("GET", SERIAL_LOG): (404, "error_blob_not_found.json")})
    vm = cloud.list_instances("c1")[0]
    assert cloud.host_keys(vm.id) == [] and cloud.host_keys(vm.id) == []
    posts = [u for m, u, _ in http.sent if m == "POST" and "retrieveBootDiagnosticsData" in u]
    assert len(posts) == 1
    expired = azure(http, {("GET", SERIAL_LOG): (403, "error_blob_not_found.json")})
    assert expired.host_keys(vm.id) == [] and expired.host_keys(vm.id) == []
    posts = [u for m, u, _ in http.sent if m == "POST" and "retrieveBootDiagnosticsData" in u]
    assert len(posts) == 3


def test_openstack_reads_cloud_inits_block_from_the_console_log(
    http: Http, openstack: LibcloudCloud, keys: list[tuple[str, str]]
) -> None:
    http.values.update(key_values(keys))
    http.on("GET", rf"{NOVA}/servers/detail", "openstack/servers_detail.json")
    http.on("POST", rf"{NOVA}/servers/srv-0001/action$", "openstack/server_console.json")
    assert openstack.host_keys("srv-0001") == keys
    assert http.body("POST", r"/servers/srv-0001/action$") == {
        "os-getConsoleOutput": {"length": None}
    }


# -- EC2 -----------------------------------------------------------------------------------


def ec2_launch(emulator: Ec2Emulator, size: str, node: str) -> tuple[LibcloudCloud, str]:
    cloud = LibcloudCloud("aws", emulator.driver(), Placement())
    token = f"hk-{node}-{size}"
    inst = cloud.launch(LaunchSpec(node, "hk", "g", size, "ami-12345678", token, PUB, USER_DATA))
    return cloud, inst.id


@pytest.mark.parametrize(
    ("size", "latest"), [("t3.micro", True), ("c4.large", False)], ids=["nitro", "xen"]
)
def test_ec2_asks_for_the_latest_console_on_nitro_types_only(
    emulator: Ec2Emulator, keys: list[tuple[str, str]], size: str, latest: bool
) -> None:
    cloud, iid = ec2_launch(emulator, size, f"n-{size}")
    emulator.console[iid] = (
        "boot\n-----BEGIN SSH HOST KEY KEYS-----\n"
        + "".join(f"{t} {b} root@n\n" for t, b in keys)
        + "-----END SSH HOST KEY KEYS-----\n"
    )
    calls_before = emulator.calls["DescribeInstanceTypes"]
    assert cloud.host_keys(iid) == keys
    assert cloud.host_keys(iid) == keys
    reads = [r for r in emulator.console_reads if r["InstanceId"] == iid]
    assert [r.get("Latest") for r in reads] == (["true", "true"] if latest else [None, None])
    assert emulator.calls["DescribeInstanceTypes"] - calls_before == 1  # once per type


def test_ec2_buffered_console_is_empty_until_ec2_posts_it(
    emulator: Ec2Emulator, keys: list[tuple[str, str]]
) -> None:
    cloud, iid = ec2_launch(emulator, "c4.large", "n-lag")
    emulator.console[iid] = (
        "-----BEGIN SSH HOST KEY KEYS-----\n"
        + "".join(f"{t} {b}\n" for t, b in keys)
        + "-----END SSH HOST KEY KEYS-----\n"
    )
    emulator.buffer_lag = 3600
    try:
        assert cloud.host_keys(iid) == []
    finally:
        emulator.buffer_lag = 0
    assert cloud.host_keys(iid) == keys


def test_a_driver_without_a_host_key_source_fails_with_a_typed_error(tmp_path: Path) -> None:
    class Other:
        type = "vsphere"

        def list_nodes(self) -> list[Any]:
            return []

    cloud = LibcloudCloud("v", Other(), Placement())
    with pytest.raises(CloudError) as err:
        cloud.host_keys("vm-1")
    assert err.value.code == "NoHostKeySource"


def test_gce_attribute_values_with_their_type_and_other_namespaces(
    http: Http, gce: Any, keys: list[tuple[str, str]]
) -> None:
    """A value written as a whole key line is read; another namespace's keys are not."""
    http.values.update(key_values(keys))
    cloud = gce(http, {("GET", GUEST_ATTRIBUTES): (200, "guest_attributes_full_lines.json")})
    inst = cloud.list_instances("c1")[0]
    assert cloud.host_keys(inst.id) == [k for k in keys if k[0] == "ssh-ed25519"]


def test_azure_refuses_a_serial_log_address_that_is_not_https_and_never_prints_its_token(
    http: Http, azure: Any
) -> None:
    cloud = azure(
        http, {("POST", "/retrieveBootDiagnosticsData"): (200, "boot_diagnostics_http.json")}
    )
    vm = cloud.list_instances("c1")[0]
    with pytest.raises(CloudError) as err:
        cloud.host_keys(vm.id)
    assert "not https" in str(err.value) and "sig=" not in str(err.value)
