"""A provider is one module: the registry finds each, a plugin's or any other libcloud
driver is described too, looking one up imports no cloud library, and no other module of
the product tests for a provider's name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurm_burst.adapters.cloud import providers
from slurm_burst.adapters.cloud.registry import built_in, host_key_sources, provider

PRODUCT = Path(providers.__file__).parents[3]  # slurm_burst/
BUILT_IN = ("azure_arm", "dummy", "ec2", "gce", "openstack")
# libcloud's own names for them (libcloud.compute.types.Provider), compared against a
# driver's ``type``
LIBCLOUD_CONSTANTS = {"EC2", "GCE", "AZURE_ARM", "OPENSTACK", "DUMMY"}


def test_every_module_of_the_package_is_a_provider_named_as_its_file() -> None:
    found = built_in()
    assert sorted(found) == list(BUILT_IN)
    for name, described in found.items():
        assert type(described).__module__ == f"{providers.__name__}.{name}"
        assert provider(name) is described


def test_each_cloud_offers_a_host_key_source_its_first_the_default() -> None:
    assert host_key_sources("gce") == ("guest-attributes", "serial-port")
    assert provider("gce").default_host_key_source == "guest-attributes"
    assert provider("azure_arm").default_host_key_source == "boot-diagnostics"
    for name in ("ec2", "openstack"):
        assert provider(name).default_host_key_source == "console"
    assert host_key_sources("vsphere") == () and host_key_sources("dummy") == ()


def test_an_unknown_driver_is_the_generic_one() -> None:
    other = provider("vsphere")
    assert type(other) is providers.Provider and other.name == "vsphere"
    assert other.launch_batch == 1 and not (other.spot or other.placements or other.lists_fleet)
    assert other.api_table() is None and other.needs_credentials


def test_what_each_provider_offers() -> None:
    ec2, gce, azure, openstack = (provider(n) for n in ("ec2", "gce", "azure_arm", "openstack"))
    assert ec2.launch_batch == 500 and ec2.lists_fleet and ec2.tag_filter
    assert ec2.spot and gce.spot and azure.spot and not openstack.spot
    assert (ec2.placements, gce.placements, azure.placements) == (
        ("cluster",), ("compact",), ("infiniband", "proximity"))  # fmt: skip
    assert not openstack.placements
    assert [p.interruption_notices[0] for p in (ec2, gce, azure)] == [
        "--imds", "--gce-metadata", "--azure-metadata"]  # fmt: skip
    assert not openstack.interruption_notices
    assert ec2.imports_key_pair and openstack.imports_key_pair and not gce.imports_key_pair
    table = ec2.api_table()
    assert table is not None and table.limit(ec2.api_names["launch"]).burst == 5
    assert ec2.api_names["host_keys"] == "GetConsoleOutput"


def test_looking_providers_up_imports_no_cloud_library() -> None:
    """The hooks check the config, which asks the registry: libcloud stays unloaded."""
    code = (
        "import sys\n"
        "from slurm_burst.adapters.cloud.registry import built_in, provider\n"
        "assert built_in() and provider('ec2').host_key_sources\n"
        "assert provider('gce').group_problems is not None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('libcloud', 'requests', 'paramiko', 'sqlalchemy')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _mentions(path: Path, root: Path = PRODUCT.parent) -> list[str]:
    """Where ``path`` names a built-in provider: a string that is exactly its name, or
    libcloud's constant for it (``Provider.EC2``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and node.value in BUILT_IN:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in LIBCLOUD_CONSTANTS:
            found.append(f"{path.relative_to(root)}:{node.lineno}: .{node.attr}")
    return found


def test_no_module_but_its_own_tests_for_a_providers_name() -> None:
    """What a provider is lives in its module: a branch on its name elsewhere (an
    ``if driver == "ec2"``, a table keyed by it) is the spread this layout ended."""
    here = PRODUCT / "adapters" / "cloud" / "providers"
    own = {here / f"{n}.py" for n in BUILT_IN} | {
        p
        for n in BUILT_IN
        for p in (here / n).rglob("*.py")  # a provider as a package
    }
    elsewhere = [m for p in sorted(PRODUCT.rglob("*.py")) if p not in own for m in _mentions(p)]
    assert elsewhere == []


def test_the_scan_finds_a_branch_on_a_name(tmp_path: Path) -> None:
    """The rule above can fail: the same scan flags each form of the spread."""
    (tmp_path / "x.py").write_text(
        "def f(kind, d):\n"
        "    if kind == 'gce':\n"
        "        return 1\n"
        "    return {'azure_arm': 2}.get(kind) or d.type == Provider.EC2\n"
    )
    found = _mentions(tmp_path / "x.py", tmp_path)
    assert sorted(found) == ["x.py:2: 'gce'", "x.py:4: 'azure_arm'", "x.py:4: .EC2"]


def test_a_gce_profile_needs_a_zone_or_a_region_and_a_region_is_not_taken_for_a_zone() -> None:
    from slurm_burst.adapters.cloud.providers.gce import PROVIDER, is_zone
    from slurm_burst.config import ProviderConfig

    def problems(zone: str = "", region: str = "") -> list[str]:
        prov = ProviderConfig(name="gcp", driver="gce", zone=zone, region=region)
        return [f for f, _ in PROVIDER.profile_problems(prov)]

    assert problems() == ["zone"]
    assert problems(region="us-central1") == problems(zone="us-central1-a") == []
    assert is_zone("europe-west4-b") and not is_zone("europe-west4") and not is_zone("")


def test_gce_placement_names_and_what_config_check_says_of_compact_placement() -> None:
    from slurm_burst.adapters.cloud.providers.gce import COMPACT_MOST, policy_name, series
    from slurm_burst.config.model import NodeGroup, ProviderConfig

    assert policy_name("Lab_1-0a1b-pg-ff") == "lab-1-0a1b-pg-ff"
    assert policy_name("9lives") == "sb-9lives" and len(policy_name("a" * 80)) == 63
    assert policy_name("x" * 62 + "-y") == "x" * 62  # never ends in '-'
    assert [series(t) for t in ("n2-standard-2", "c2d-highcpu-8", "A2-highgpu-1g")] == [
        "n2", "c2d", "a2"]  # fmt: skip
    gce = provider("gce")
    shape: dict[str, Any] = {"name": "g", "pattern": "g-{n}", "partition": "p",
                             "providers": ["gcp"], "image": "i", "cpus": 2, "memory_mb": 1000,
                             "placement": "compact"}  # fmt: skip
    placed = NodeGroup(**shape, count=COMPACT_MOST + 1, sizes=("n2-standard-2", "e2-standard-4"))
    (key, series_said), (_, size_said) = gce.group_warnings(placed)
    assert key == "placement" and series_said.startswith("size(s) e2-standard-4:")
    assert "at most 150 instances" in size_said and "151 nodes" in size_said
    small = NodeGroup(**shape, count=8, sizes=("n2-standard-2",))
    assert gce.group_warnings(small) == [] and provider("ec2").group_warnings(placed) == []
    options = {"preemptible": "yes", "ex_service_accounts": []}
    prov = ProviderConfig(name="gcp", driver="gce", zone="us-central1-a", launch_options=options)
    found = dict(gce.profile_problems(prov))
    assert set(found) == {"launch_options.preemptible", "launch_options.ex_service_accounts"}


def test_what_config_check_asks_of_an_azure_profile() -> None:
    from slurm_burst.adapters.cloud.providers.azure_arm import PROVIDER
    from slurm_burst.config import ProviderConfig

    def problems(**kw: Any) -> list[str]:
        base: dict[str, Any] = {"name": "az", "driver": "azure_arm", "region": "eastus",
                                "resource_group": "rg", "network": "vnet"}  # fmt: skip
        prov = ProviderConfig(**(base | kw))
        return [f for f, _ in PROVIDER.profile_problems(prov)]

    assert problems() == [] and problems(zone="2") == [] and problems(zone="eastus") == []
    assert problems(region="", resource_group="") == ["resource_group", "region"]
    assert problems(zone="4") == ["zone"]
    assert problems(launch_options={"priority": "Spot"}) == ["launch_options.priority"]
    assert problems(options={"endpoint": "http://arm.example"}) == ["options.endpoint"]
    assert problems(options={"endpoint": "https://127.0.0.1:4597", "ca_file": "ca.pem"}) == [
        "options.ca_file"]  # fmt: skip
    store = {"boot_diagnostics_storage": "https://acct.blob.core.windows.net/"}
    assert problems(options=store) == ["options.boot_diagnostics_sas_env"]
    assert problems(options=store | {"boot_diagnostics_sas_env": "SAS"}) == []
    assert problems(options=store | {"boot_diagnostics_sas_env": "not a name"}) == [
        "options.boot_diagnostics_sas_env"]  # fmt: skip
    assert problems(options={"admin_user": "root"}) == ["options.admin_user"]
    assert problems(options={"admin_user": "slurm"}) == []


def test_one_arm_budget_per_principal_and_endpoint_whatever_the_region() -> None:
    from slurm_burst.config import Credentials, ProviderConfig

    azure = provider("azure_arm")
    one = Credentials(file="/etc/slurm-burst/azure.toml")

    def scope(**kw: Any) -> tuple[str, ...]:
        return azure.budget_scope(ProviderConfig(name="az", driver="azure_arm", **kw))

    east, west = scope(region="eastus", credentials=one), scope(region="westeurope",
                                                                credentials=one)  # fmt: skip
    assert east == west
    other = Credentials(file="/etc/slurm-burst/azure-2.toml")
    assert scope(region="eastus", credentials=other) != east
    table = azure.api_table()
    assert table is not None and (table.limit("reads").burst, table.limit("writes").refill) == (
        250, 10)  # fmt: skip
    assert table.limit("launch").refill == 0  # our calls are paced by their requests
