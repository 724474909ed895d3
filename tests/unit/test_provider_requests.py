"""GCE, Azure ARM and OpenStack at the HTTP boundary: no emulator runs here, so libcloud's
own drivers send their real HTTP requests into a recorder (``responses``) that answers
with recorded provider responses (tests/data/providers/*, in libcloud's fixture style),
and the tests assert the exact requests our mapping produces: machine type,
accelerators, preemptible/spot, labels/tags, metadata startup-script or custom data,
networks; then list, terminate, and the providers' capacity, quota and throttling
error shapes as our typed errors.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_burst import wiring
from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.config import ProviderConfig
from slurm_burst.core.cloud import (
    CapacityError,
    CloudError,
    LaunchSpec,
    QuotaError,
    ThrottledError,
)

responses = pytest.importorskip("responses", reason="needs responses (make test installs it)")

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "providers"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHlxGkzTdbVEbLbd2S4bQHnCi9pvNmx9mHgQLsUyw8sq daemon"
USER_DATA = "#!/bin/sh\necho slurm-burst: node booted\n"


class Http:
    """Every request the driver sends, answered from fixtures by (method, URL pattern)."""

    def __init__(self, mock: Any) -> None:
        self.mock = mock
        self.sent: list[tuple[str, str, Any]] = []

    def on(self, method: str, pattern: str, fixture: str | dict[str, Any] | None,
           status: int = 200, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        """Answer ``method`` on URLs matching ``pattern`` with a fixture file, a dict, or
        no body (None)."""
        text = "" if fixture is None else json.dumps(
            fixture if isinstance(fixture, dict) else json.loads((FIXTURES / fixture).read_text())
        )  # fmt: skip

        def answer(req: Any) -> tuple[int, dict[str, str], str]:
            raw = req.body.decode() if isinstance(req.body, bytes) else req.body
            try:
                data = json.loads(raw) if raw else None
            except ValueError:
                data = raw
            self.sent.append((req.method, req.url, data))
            return status, {"Content-Type": "application/json", **(headers or {})}, text

        self.mock.add_callback(method, re.compile(pattern), callback=answer)

    def body(self, method: str, pattern: str) -> Any:
        found = [b for m, u, b in self.sent if m == method and re.search(pattern, u)]
        assert found, f"no {method} {pattern} among {[(m, u) for m, u, _ in self.sent]}"
        return found[-1]


@pytest.fixture
def http() -> Iterator[Http]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield Http(mock)


def spec(node: str, size: str, image: str, **kw: Any) -> LaunchSpec:
    return LaunchSpec(
        node=node,
        cluster="c1",
        group="gpu",
        size=size,
        image=image,
        token=f"c1-{node}-1-0",
        ssh_public_key=PUB,
        user_data=USER_DATA,
        tags={"cost-center": "HPC 42"},
        **kw,
    )


# -- OpenStack ---------------------------------------------------------------------------

NOVA = "https://nova.example.org:8774/v2.1/proj1"


@pytest.fixture
def openstack(monkeypatch: pytest.MonkeyPatch) -> LibcloudCloud:
    for var, value in {
        "OS_USERNAME": "burst",
        "OS_PASSWORD": "not-logged",
        "OS_AUTH_URL": "https://keystone.example.org:5000",
        "OS_PROJECT_NAME": "hpc",
    }.items():
        monkeypatch.setenv(var, value)
    prov = ProviderConfig(
        name="onprem",
        driver="openstack",
        region="RegionOne",
        options={"ex_force_auth_token": "tok-123", "ex_force_base_url": NOVA},
        network="5c1e4a3e-0000-4000-8000-00000000a001",
        security_groups=("slurm-nodes",),
        zone="nova",
    )
    from slurm_burst.adapters.cloud.profiles import Placement

    return LibcloudCloud(
        "onprem",
        wiring.cloud_driver(prov),
        Placement(network=prov.network, security_groups=prov.security_groups, zone=prov.zone),
    )


def test_openstack_launch_sends_flavor_image_network_groups_metadata_and_user_data(
    http: Http, openstack: LibcloudCloud
) -> None:
    http.on("GET", rf"{NOVA}/flavors/detail", "openstack/flavors_detail.json")
    http.on("GET", rf"{NOVA}/os-keypairs$", {"keypairs": []})
    http.on("POST", rf"{NOVA}/os-keypairs$", "openstack/keypair_post.json")
    http.on("POST", rf"{NOVA}/servers$", "openstack/server_post.json", status=202)
    http.on("GET", rf"{NOVA}/servers/srv-0001$", "openstack/server_get.json")
    inst = openstack.launch(spec("os-gpu-1", "g1.gpu", "7c1d4f0e-img", disk_gb=80))
    assert inst.id == "srv-0001" and inst.state == "pending"
    assert http.body("POST", r"/os-keypairs$") == {
        "keypair": {"name": "slurm-burst-" + _digest(), "public_key": PUB}
    }
    server = http.body("POST", r"/servers$")["server"]
    assert server["flavorRef"] == "f-gpu-1"  # the flavor's id, found by its name
    assert server["imageRef"] == "7c1d4f0e-img"
    assert server["networks"] == [{"uuid": "5c1e4a3e-0000-4000-8000-00000000a001"}]
    assert server["security_groups"] == [{"name": "slurm-nodes"}]
    assert server["availability_zone"] == "nova"
    assert server["key_name"] == "slurm-burst-" + _digest()
    assert base64.b64decode(server["user_data"]).decode() == USER_DATA
    assert server["metadata"] == {
        "slurm-burst-cluster": "c1",
        "slurm-burst-group": "gpu",
        "slurm-burst-node": "os-gpu-1",
        "slurm-burst-token": "c1-os-gpu-1-1-0",
        "cost-center": "HPC 42",
    }
    assert server["block_device_mapping_v2"] == [
        {
            "boot_index": 0,
            "uuid": "7c1d4f0e-img",
            "source_type": "image",
            "destination_type": "volume",
            "volume_size": 80,
            "delete_on_termination": True,
        }
    ]
    assert "not-logged" not in json.dumps([b for _, _, b in http.sent])


def test_openstack_list_and_terminate(http: Http, openstack: LibcloudCloud) -> None:
    http.on("GET", rf"{NOVA}/servers/detail", "openstack/servers_detail.json")
    http.on("DELETE", rf"{NOVA}/servers/srv-0001$", None, status=204)
    listed = openstack.list_instances("c1")
    assert [(i.id, i.name, i.state) for i in listed] == [("srv-0001", "os-gpu-1", "running")]
    assert listed[0].tags["slurm-burst-node"] == "os-gpu-1"
    assert listed[0].private_ips == ("10.20.0.15",)
    openstack.terminate("srv-0001")
    assert any(m == "DELETE" for m, _, _ in http.sent)


@pytest.mark.parametrize(
    ("status", "fixture", "kind", "code"),
    [
        (403, "openstack/error_quota.json", QuotaError, "QuotaExceeded"),
        (429, "openstack/error_overlimit.json", ThrottledError, "HTTP429"),
        (500, "openstack/error_no_valid_host.json", CapacityError, "NoValidHost"),
    ],
    ids=["quota", "rate-limit", "no-valid-host"],
)
def test_openstack_error_shapes(
    http: Http,
    openstack: LibcloudCloud,
    status: int,
    fixture: str,
    kind: type[CloudError],
    code: str,
) -> None:
    http.on("GET", rf"{NOVA}/flavors/detail", "openstack/flavors_detail.json")
    http.on("GET", rf"{NOVA}/os-keypairs$", "openstack/keypairs_list.json")
    http.on("POST", rf"{NOVA}/servers$", fixture, status=status)
    with pytest.raises(kind) as err:
        openstack.launch(spec("os-gpu-2", "g1.gpu", "7c1d4f0e-img"))
    assert err.value.code == code


def _digest() -> str:
    import hashlib

    return hashlib.sha256(PUB.split()[1].encode()).hexdigest()[:16]


# -- the mapping itself ------------------------------------------------------------------


def test_the_lab_and_generic_drivers_get_the_daemons_key_user_data_and_tags() -> None:
    from libcloud.compute.base import NodeSize

    from slurm_burst.adapters.cloud.faults import FaultyDriver
    from slurm_burst.adapters.cloud.profiles import Placement, create_kwargs

    class PassThrough:  # a driver whose create_node takes **kwargs (as the fault wrapper)
        type = "other"

        def create_node(self, **kwargs: Any) -> None: ...

    size = NodeSize("s", "s", 1, 1, 1, 0.0, driver=None)  # type: ignore[arg-type]
    for kind, driver in (("nscloud", object()), ("other", FaultyDriver(PassThrough(), "/x"))):
        kw = create_kwargs(kind, driver, spec("n-1", "s", "img"), Placement(), size)
        assert kw["auth"].pubkey == PUB, kind
        assert kw["ex_userdata"] == USER_DATA, kind
        assert kw["ex_metadata"]["slurm-burst-node"] == "n-1", kind
