"""OpenStack (and the listings of GCE and Azure ARM) at the HTTP boundary: no emulator runs
for them, so libcloud's own drivers send their real HTTP requests into a recorder
(``responses``) that answers with recorded provider responses (tests/data/providers/*,
in libcloud's fixture style), and the tests assert the exact requests our mapping
produces: size, image, tags, startup script or custom data, networks; then list,
terminate, and the providers' capacity, quota and throttling error shapes as our typed
errors. GCE's and Azure's launches are tested against the lab's emulators
(tests/integration/test_gce_market.py, test_gce_emulator.py, test_azure_emulator.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.core.cloud import CapacityError, CloudError, QuotaError, ThrottledError
from tests.providers import (
    NOVA,
    PUB,
    USER_DATA,
    Http,
    spec,
)

responses = pytest.importorskip("responses", reason="needs responses (make test installs it)")


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
    from slurm_burst_lab.faults import FaultyDriver

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


def test_gce_list_by_label_and_terminate(http: Http, gce: Any) -> None:
    cloud = gce(http)
    listed = cloud.list_instances("c1")
    assert [(i.name, i.tags["slurm-burst-node"]) for i in listed] == [("node-name", "node-name")]
    cloud.terminate(listed[0].id)
    assert any(m == "DELETE" and u.endswith("instances/node-name") for m, u, _ in http.sent)


def test_azure_list_by_tag(http: Http, azure: Any) -> None:
    listed = azure(http).list_instances("c1")
    assert [(i.name, i.tags["slurm-burst-node"]) for i in listed] == [
        ("test-node-1", "test-node-1")
    ]
