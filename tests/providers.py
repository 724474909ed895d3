"""Provider APIs at the HTTP boundary, shared by the provider tests (integration) and the
host-key tests that connect to lab VMs: libcloud's own drivers send their real HTTP
requests into a recorder (``responses``) that answers with recorded provider responses
(tests/data/providers/*, in libcloud's fixture style)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from string import Template
from typing import Any

import pytest

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.config import ProviderConfig, load_config
from slurm_burst.core.cloud import LaunchSpec
from slurm_burst.wiring import clouds
from tests.conftest import LAB_CONFIG

FIXTURES = Path(__file__).resolve().parent / "data" / "providers"
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHlxGkzTdbVEbLbd2S4bQHnCi9pvNmx9mHgQLsUyw8sq daemon"
USER_DATA = "#!/bin/sh\necho slurm-burst: node booted\n"


class Http:
    """Every request the driver sends, answered from fixtures by (method, URL pattern)."""

    def __init__(self, mock: Any) -> None:
        self.mock = mock
        self.sent: list[tuple[str, str, Any]] = []
        # $names in fixture files, filled in when answered (e.g. a VM's real host keys)
        self.values: dict[str, str] = {}

    def fixture(self, path: str | Path) -> str:
        """A fixture file's text with :attr:`values` filled in."""
        return Template((FIXTURES / path).read_text()).safe_substitute(self.values)

    def on(self, method: str, pattern: str, fixture: str | dict[str, Any] | None,
           status: int = 200, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        """Answer ``method`` on URLs matching ``pattern`` with a fixture file, a dict, or
        no body (None)."""

        def answer(req: Any) -> tuple[int, dict[str, str], str]:
            text = "" if fixture is None else json.dumps(
                fixture if isinstance(fixture, dict) else json.loads(self.fixture(fixture))
            )  # fmt: skip
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
    responses = pytest.importorskip("responses", reason="needs responses (make test installs it)")
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
        clouds.cloud_driver(prov),
        Placement(network=prov.network, security_groups=prov.security_groups, zone=prov.zone),
    )


# -- GCE ---------------------------------------------------------------------------------

GCE_API = "https://www.googleapis.com/compute/v1/"
DEBIAN = GCE_API + "projects/debian-cloud/global/images/debian-12-bookworm-v20261001"


class GceRouter:
    """Answers each request with the fixture named after its path (libcloud's way)."""

    def __init__(self, http: Http, overrides: dict[tuple[str, str], tuple[int, str]]) -> None:
        self.overrides = overrides
        self.http = http
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
        return status, {"Content-Type": "application/json"}, self.http.fixture(f)


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

    def make(http: Http, overrides: dict[tuple[str, str], tuple[int, str]] | None = None,
             host_keys: str = "") -> Any:  # fmt: skip
        from slurm_burst.adapters.cloud.profiles import Placement

        GceRouter(http, overrides or {})
        return LibcloudCloud("gcp", clouds.cloud_driver(prov),
                             Placement(zone="us-central1-a", security_groups=("slurm-node",),
                                       ssh_user="slurm", host_keys=host_keys))  # fmt: skip

    return make


# -- Azure ARM ---------------------------------------------------------------------------

AZURE_TENANT = "77777777-7777-7777-7777-777777777777"
AZURE_IMAGE = "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"


class AzureRouter:
    """Answers with the fixture named after the request path ('/', '-', '.' -> '_',
    ``_put``/``_delete`` for those methods: libcloud's convention); 404 otherwise."""

    def __init__(self, http: Http, overrides: dict[tuple[str, str], tuple[int, str]]) -> None:
        self.overrides = overrides
        self.http = http
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
                return status, {"Content-Type": "application/json"}, self.http.fixture(
                    Path("azure") / name)  # fmt: skip
        suffix = {"PUT": "_put", "DELETE": "_delete"}.get(req.method, "")
        f = FIXTURES / "azure" / f"{base}{suffix}.json"
        if not f.exists():
            return 404, {"Content-Type": "application/json"}, json.dumps(
                {"error": {"code": "NotFound", "message": f"no {f.name}"}})  # fmt: skip
        return 200, {"Content-Type": "application/json"}, self.http.fixture(f)


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
        return LibcloudCloud("az", clouds.cloud_driver(prov), clouds.placement(cfg, prov))

    return make


def key_values(keys: list[tuple[str, str]]) -> dict[str, str]:
    """Host keys as the fixtures' placeholders: ``$ssh_ed25519`` and so on."""
    return {ktype.replace("-", "_"): body for ktype, body in keys}


def generate_host_keys(where: Path) -> list[tuple[str, str]]:
    """A fresh host's three key pairs (ssh-keygen); their public halves, in fixture order."""
    import subprocess

    out = []
    for kind in ("ecdsa", "ed25519", "rsa"):
        path = where / f"ssh_host_{kind}_key"
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
        ktype, body = path.with_suffix(".pub").read_text().split()[:2]
        out.append((ktype, body))
    return out
