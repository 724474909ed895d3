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
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_burst import wiring
from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.config import ProviderConfig, load_config
from slurm_burst.core.cloud import (
    CapacityError,
    CloudError,
    LaunchSpec,
    QuotaError,
    ThrottledError,
)
from tests.conftest import LAB_CONFIG

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
        found = [b for m, u, b in self.sent if m == method and re.search(pattern, u.split("?")[0])]
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

    from slurm_burst.adapters.cloud.profiles import Placement, create_kwargs
    from slurm_burst.lab.faults import FaultyDriver

    class PassThrough:  # a driver whose create_node takes **kwargs (as the fault wrapper)
        type = "other"

        def create_node(self, **kwargs: Any) -> None: ...

    size = NodeSize("s", "s", 1, 1, 1, 0.0, driver=None)  # type: ignore[arg-type]
    for kind, driver in (("nscloud", object()), ("other", FaultyDriver(PassThrough(), "/x"))):
        kw = create_kwargs(kind, driver, spec("n-1", "s", "img"), Placement(), size)
        assert kw["auth"].pubkey == PUB, kind
        assert kw["ex_userdata"] == USER_DATA, kind
        assert kw["ex_metadata"]["slurm-burst-node"] == "n-1", kind


# -- GCE ---------------------------------------------------------------------------------

GCE_API = "https://www.googleapis.com/compute/v1/"
DEBIAN = GCE_API + "projects/debian-cloud/global/images/debian-12-bookworm-v20261001"


class GceRouter:
    """Answers each request with the fixture named after its path (libcloud's way)."""

    def __init__(self, http: Http, overrides: dict[tuple[str, str], tuple[int, str]]) -> None:
        self.overrides = overrides
        self.sent = http.sent
        for method in ("GET", "POST", "DELETE"):
            http.mock.add_callback(method, re.compile(GCE_API + ".*"), callback=self.answer)

    def answer(self, req: Any) -> tuple[int, dict[str, str], str]:
        path = re.sub(r"^projects/project_name/", "", req.url.split("?")[0][len(GCE_API) :])
        raw = req.body.decode() if isinstance(req.body, bytes) else req.body
        self.sent.append((req.method, req.url, json.loads(raw) if raw else None))
        status, name = self.overrides.get((req.method, path), (200, ""))
        if not name:
            suffix = {"POST": "_post", "DELETE": "_delete"}.get(req.method, "")
            name = path.replace("/", "_") + suffix + ".json"
        f = FIXTURES / "gce" / name
        if not f.exists():
            print("GCE fixture missing:", req.method, path, name)
            return 404, {}, json.dumps({"error": {"code": 404, "message": f"no {name}",
                                                  "errors": [{"reason": "notFound"}]}})  # fmt: skip
        return status, {"Content-Type": "application/json"}, f.read_text()


@pytest.fixture
def gce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    sa = tmp_path / "sa.json"
    sa.write_text(json.dumps({"type": "service_account", "project_id": "project_name",
                              "client_email": "burst@project_name.iam.gserviceaccount.com",
                              "private_key": key.decode()}))  # fmt: skip
    sa.chmod(0o600)
    token = tmp_path / "token.json"  # a cached OAuth token: no token request is made
    token.write_text(json.dumps({"access_token": "ya29.test", "token_type": "Bearer",
                                 "expire_time": "2099-01-01T00:00:00Z"}))  # fmt: skip
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(sa))
    prov = ProviderConfig(name="gcp", driver="gce", zone="us-central1-a",
                          options={"credential_file": str(token)},
                          security_groups=("slurm-node",))  # fmt: skip

    def make(http: Http, overrides: dict[tuple[str, str], tuple[int, str]] | None = None) -> Any:
        from slurm_burst.adapters.cloud.profiles import Placement

        GceRouter(http, overrides or {})
        return LibcloudCloud("gcp", wiring.cloud_driver(prov),
                             Placement(zone="us-central1-a", security_groups=("slurm-node",),
                                       ssh_user="slurm"))  # fmt: skip

    return make


def test_gce_launch_sends_machine_type_gpus_preemptible_labels_and_startup_script(
    http: Http, gce: Any
) -> None:
    cloud = gce(http)
    inst = cloud.launch(spec("node-name", "n1-standard-1", DEBIAN, gpus=1,
                             accelerator="nvidia-tesla-t4", spot=True, disk_gb=50))  # fmt: skip
    assert inst.name == "node-name"
    body = http.body("POST", r"zones/us-central1-a/instances$")
    assert body["machineType"].endswith("/zones/us-central1-a/machineTypes/n1-standard-1")
    assert body["guestAccelerators"] == [{"acceleratorType": GCE_API + "projects/proj"
                                          "ect_name/zones/us-central1-a/acceleratorTypes/"
                                          "nvidia-tesla-t4", "acceleratorCount": 1}]  # fmt: skip
    assert body["scheduling"] == {
        "preemptible": True,
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["labels"] == {
        "slurm-burst-cluster": "c1",
        "slurm-burst-group": "gpu",
        "slurm-burst-node": "node-name",
        "slurm-burst-token": "c1-node-name-1-0",
        "cost-center": "hpc-42",  # GCE labels: lower case, no spaces
    }
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert items == {"startup-script": USER_DATA, "ssh-keys": f"slurm:{PUB}"}
    assert body["tags"] == {"items": ["slurm-node"]}
    disk = body["disks"][0]["initializeParams"]
    assert (disk["sourceImage"], disk["diskSizeGb"]) == (DEBIAN, 50)


def test_gce_list_by_label_and_terminate(http: Http, gce: Any) -> None:
    cloud = gce(http)
    listed = cloud.list_instances("c1")
    assert [(i.name, i.tags["slurm-burst-node"]) for i in listed] == [("node-name", "node-name")]
    cloud.terminate(listed[0].id)
    assert any(m == "DELETE" and u.endswith("instances/node-name") for m, u, _ in http.sent)


@pytest.mark.parametrize(
    ("override", "kind", "code"),
    [
        ((("POST", "zones/us-central1-a/instances"), (200, "capacity_insert.json")),
         CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED"),
        ((("POST", "zones/us-central1-a/instances"), (403, "error_quota.json")),
         QuotaError, "quotaExceeded"),
        ((("POST", "zones/us-central1-a/instances"), (403, "error_rate_limit.json")),
         ThrottledError, "rateLimitExceeded"),
    ],
    ids=["zone-exhausted", "gpu-quota", "rate-limit"],
)  # fmt: skip
def test_gce_error_shapes(http: Http, gce: Any, override: Any, kind: type, code: str) -> None:
    (method_path, answer) = override
    overrides = {method_path: answer,
                 ("GET", "zones/us-central1-a/operations/operation-capacity"):
                 (200, "capacity_operation.json")}  # fmt: skip
    cloud = gce(http, overrides)
    with pytest.raises(kind) as err:
        cloud.launch(spec("node-name", "n1-standard-1", DEBIAN))
    assert isinstance(err.value, CloudError) and err.value.code == code


# -- Azure ARM ---------------------------------------------------------------------------

AZURE_TENANT = "77777777-7777-7777-7777-777777777777"
AZURE_IMAGE = "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"


class AzureRouter:
    """Answers with the fixture named after the request path ('/', '-', '.' -> '_',
    ``_put``/``_delete`` for those methods: libcloud's convention); 404 otherwise."""

    def __init__(self, http: Http, overrides: dict[tuple[str, str], tuple[int, str]]) -> None:
        self.overrides = overrides
        self.sent = http.sent
        for method in ("GET", "POST", "PUT", "DELETE"):
            http.mock.add_callback(method, re.compile(r"https://.*"), callback=self.answer)

    def answer(self, req: Any) -> tuple[int, dict[str, str], str]:
        path = re.sub(r"^https://[^/]+", "", req.url.split("?")[0])
        raw = req.body.decode() if isinstance(req.body, bytes) else req.body
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw  # the token request is a form
        self.sent.append((req.method, req.url, data))
        base = re.sub(r"[/\-.]", "_", path)
        for (method, tail), (status, name) in self.overrides.items():
            if req.method == method and path.endswith(tail):
                return status, {"Content-Type": "application/json"}, (
                    FIXTURES / "azure" / name).read_text()  # fmt: skip
        suffix = {"PUT": "_put", "DELETE": "_delete"}.get(req.method, "")
        f = FIXTURES / "azure" / f"{base}{suffix}.json"
        if not f.exists():
            return 404, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": "NotFound", "message": f"no {f.name}"}})  # fmt: skip
        return 200, {"Content-Type": "application/json"}, f.read_text()


@pytest.fixture
def azure(monkeypatch: pytest.MonkeyPatch) -> Any:
    for var, value in {
        "AZURE_CLIENT_ID": "app-1",
        "AZURE_CLIENT_SECRET": "not-logged",
        "AZURE_TENANT_ID": AZURE_TENANT,
        "AZURE_SUBSCRIPTION_ID": "99999999",
    }.items():
        monkeypatch.setenv(var, value)
    prov = ProviderConfig(name="az", driver="azure_arm", region="eastus", zone="eastus",
                          network="hpc-vnet", subnet="burst", resource_group="000000")  # fmt: skip

    def make(http: Http, overrides: dict[tuple[str, str], tuple[int, str]] | None = None) -> Any:
        AzureRouter(http, overrides or {})
        lab = load_config(LAB_CONFIG)  # any config: a placement reads its ssh_user
        cfg = dataclasses.replace(lab, daemon=dataclasses.replace(lab.daemon, ssh_user="slurm"))
        return LibcloudCloud("az", wiring.cloud_driver(prov), wiring.placement(cfg, prov))

    return make


def test_azure_launch_sends_size_image_tags_custom_data_key_disk_and_subnet(
    http: Http, azure: Any
) -> None:
    cloud = azure(http)
    cloud.launch(spec("test-node-1", "Standard_A1", AZURE_IMAGE, disk_gb=64))
    token_request = http.body("POST", r"/oauth2/token$")
    assert "client_id=app-1" in token_request  # the secret is in the form, and only there
    nic = http.body("PUT", r"/networkInterfaces/test-node-1-nic$")
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"] == (
        "/subscriptions/99999999/resourceGroups/000000/providers/Microsoft.Network/"
        "virtualnetworks/hpc-vnet/subnets/burst"
    )
    vm = http.body("PUT", r"/virtualMachines/test-node-1$")
    props = vm["properties"]
    assert vm["location"] == "eastus"
    assert props["hardwareProfile"] == {"vmSize": "Standard_A1"}
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "0001-com-ubuntu-server-jammy",
        "sku": "22_04-lts-gen2",
        "version": "latest",
    }
    assert props["storageProfile"]["osDisk"]["diskSizeGB"] == 64
    assert "managedDisk" in props["storageProfile"]["osDisk"]
    os_profile = props["osProfile"]
    assert base64.b64decode(os_profile["customData"]).decode() == USER_DATA
    assert os_profile["adminUsername"] == "slurm"
    assert os_profile["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/slurm/.ssh/authorized_keys", "keyData": PUB}
    ]
    assert vm["tags"] == {
        "slurm-burst-cluster": "c1",
        "slurm-burst-group": "gpu",
        "slurm-burst-node": "test-node-1",
        "slurm-burst-token": "c1-test-node-1-1-0",
        "cost-center": "HPC 42",
    }
    assert "not-logged" not in json.dumps([b for m, _, b in http.sent if m != "POST"])


def test_azure_list_by_tag(http: Http, azure: Any) -> None:
    listed = azure(http).list_instances("c1")
    assert [(i.name, i.tags["slurm-burst-node"]) for i in listed] == [
        ("test-node-1", "test-node-1")
    ]


@pytest.mark.parametrize(
    ("status", "fixture", "kind", "code"),
    [
        (409, "error_allocation_failed.json", CapacityError, "AllocationFailed"),
        (409, "error_quota.json", QuotaError, "OperationNotAllowed"),
        # libcloud turns any 429 into its RateLimitReachedError, without the body's code
        (429, "error_throttled.json", ThrottledError, "HTTP429"),
    ],
    ids=["allocation-failed", "core-quota", "throttled"],
)
def test_azure_error_shapes(
    http: Http, azure: Any, status: int, fixture: str, kind: type, code: str
) -> None:
    cloud = azure(http, {("PUT", "/virtualMachines/test-node-1"): (status, fixture)})
    with pytest.raises(kind) as err:
        cloud.launch(spec("test-node-1", "Standard_A1", AZURE_IMAGE))
    assert isinstance(err.value, CloudError) and err.value.code == code


def test_azure_terminate_deletes_the_vm_its_nic_and_its_disk(http: Http, azure: Any) -> None:
    cloud = azure(http)
    vm = cloud.list_instances("c1")[0]
    cloud.terminate(vm.id)
    deleted = [u.split("?")[0].rsplit("/", 2)[-2:] for m, u, _ in http.sent if m == "DELETE"]
    assert ["virtualMachines", "test-node-1"] in deleted
    assert any(kind == "networkInterfaces" for kind, _ in deleted), deleted
    assert any(kind == "disks" for kind, _ in deleted), deleted
