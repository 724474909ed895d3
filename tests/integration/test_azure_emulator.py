"""slurm-burst's Azure provider against the lab's Azure emulator over HTTP: launches as
scale-outs of one Flexible scale set per group and size, the fleet view, host keys from
boot diagnostics, deletes by name, ARM's limits read from every answer and honoured
(429 and Retry-After), and every request and answer checked against
``azure-mgmt-compute``'s models (tests/integration/azuretools.py)."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import pytest
from slurm_burst_lab.azureemu import AzureEmulator
from slurm_burst_lab.azurevms import scale_key

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.cloud.providers.azure_arm import sets
from slurm_burst.core.cloud import CLUSTER_TAG, TOKEN_TAG, CapacityError, QuotaError
from tests.integration.azuretools import (
    GROUP,
    batch_spec,
    check_exchanges,
    make_cloud,
)

NAMES = ("az-1", "az-2", "az-3")


def _set_name(size: str = "Standard_D2s_v5", group: str = "cpu") -> str:
    return f"{sets.set_base('lab', group, size)}-1"


def test_a_launch_is_one_put_of_the_groups_flexible_set_and_its_vms_come_back_paired(
    azure_emu: AzureEmulator,
) -> None:
    cloud = make_cloud(azure_emu, zone="2")
    made = cloud.launch_many(batch_spec(NAMES, "tok-1"))
    assert [i.launch_index for i in made] == [0, 1, 2]
    assert all(i.id.startswith(f"{_set_name()}_") and len(i.id) == len(_set_name()) + 9
               for i in made)  # fmt: skip
    assert all(i.state == "running" and i.private_ips for i in made)
    assert {i.tags[TOKEN_TAG] for i in made} == {"tok-1"}
    puts = [(m, p, b) for m, p, b in azure_emu.requests if m == "PUT"]
    assert len(puts) == 1
    body = puts[0][2]
    assert body["sku"] == {"name": "Standard_D2s_v5", "tier": "Standard", "capacity": 3}
    assert body["zones"] == ["2"] and body["location"] == "eastus"
    props = body["properties"]
    assert props["orchestrationMode"] == "Flexible" and props["platformFaultDomainCount"] == 1
    profile = props["virtualMachineProfile"]
    assert base64.b64decode(profile["osProfile"]["customData"]).decode().startswith("#!/bin/sh")
    assert profile["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAAC3Nz burst"}
    ]
    nic = profile["networkProfile"]["networkInterfaceConfigurations"][0]["properties"]
    assert nic["deleteOption"] == "Delete"
    assert nic["ipConfigurations"][0]["properties"]["subnet"]["id"].endswith(
        f"/resourceGroups/{GROUP}/providers/Microsoft.Network/virtualNetworks/hpc-vnet/"
        "subnets/burst"
    )
    assert profile["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert profile["storageProfile"]["osDisk"]["diskSizeGB"] == 64
    assert profile["diagnosticsProfile"] == {"bootDiagnostics": {"enabled": True}}
    assert body["tags"][CLUSTER_TAG] == "lab" and TOKEN_TAG not in body["tags"]
    assert body["tags"][sets.SCALEOUT_TAG].startswith("tok-1 ")
    assert "tok-1" not in str(profile)  # the model is the set's, not the launch's
    # a second launch: the same set, scaled out by its own count; the first's VMs kept
    more = cloud.launch_many(batch_spec(("az-4", "az-5"), "tok-2"))
    assert {i.id for i in more}.isdisjoint({i.id for i in made})
    assert azure_emu.arm.sets[(GROUP.lower(), _set_name())]["sku"]["capacity"] == 5
    assert azure_emu.calls["vmss.put"] == 2 and azure_emu.calls["vm.get"] == 0
    answers: list[tuple[str, Any]] = [("set", azure_emu.arm._set_doc(s))
                                      for s in azure_emu.arm.sets.values()]  # fmt: skip
    answers += [("vm", azure_emu.arm._vm_doc(v, True)) for v in azure_emu.arm.vms.values()]
    answers.append(("diag", azure_emu.arm._boot_diagnostics(GROUP.lower(), made[0].id, {},
                                                             "http://x")))  # fmt: skip
    assert check_exchanges(azure_emu, answers) >= 9


def test_a_repeat_of_a_launch_sends_no_second_scale_out_and_finds_what_the_first_made(
    azure_emu: AzureEmulator,
) -> None:
    cloud = make_cloud(azure_emu)
    first = cloud.launch_many(batch_spec(NAMES, "tok-r"))
    inner = cloud.inner
    assert isinstance(inner, LibcloudCloud)
    sets.book(inner).inflight.clear()  # as after a restart: nothing in memory
    inner._remembered.clear()
    again = cloud.launch_many(batch_spec(NAMES, "tok-r"))
    assert [i.id for i in again] == [i.id for i in first]
    assert azure_emu.calls["vmss.put"] == 1 and len(azure_emu.arm.vms) == 3
    assert cloud.find("tok-r", "lab") == []  # the launcher repeats the launch instead


def test_a_scale_out_short_of_the_least_deletes_what_it_made_by_name_and_says_why(
    azure_emu: AzureEmulator,
) -> None:
    cloud = make_cloud(azure_emu)
    cloud.launch_many(batch_spec(("keep-1",), "tok-k"))
    azure_emu.arm.limit("Standard_D2s_v5", 2)
    with pytest.raises(CapacityError) as err:
        cloud.launch_many(batch_spec(NAMES, "tok-p"))
    assert err.value.code == "AllocationFailed"
    left = [v["name"] for v in azure_emu.arm.vms.values()]
    assert len(left) == 1 and azure_emu.calls["vm.delete"] == 2  # the two made, by name
    assert azure_emu.calls.get("vmss.deleteInstances", 0) == 0
    # fewer than asked but enough (a batch whose least is one node): kept
    azure_emu.arm.limit("Standard_D2s_v5", 2)
    got = cloud.launch_many(batch_spec(NAMES, "tok-q", least=1))
    assert len(got) == 2 and len(azure_emu.arm.vms) == 3


def test_a_quota_refuses_the_scale_out_at_once_as_a_quota_error(
    azure_emu: AzureEmulator,
) -> None:
    azure_emu.arm.limit("Standard_D2s_v5", 1, "OperationNotAllowed")
    with pytest.raises(QuotaError):
        make_cloud(azure_emu).launch_many(batch_spec(NAMES, "tok-q"))
    assert azure_emu.arm.vms == {}


def test_the_fleet_view_reads_each_set_in_pages_with_power_states_and_nics_only_when_new(
    azure_emu: AzureEmulator,
) -> None:
    cloud = make_cloud(azure_emu)
    cloud.launch_many(batch_spec(NAMES, "tok-f"))
    cloud.launch_many(batch_spec(("g-1", "g-2"), "tok-g", size="Standard_D4s_v5"))
    azure_emu.calls.clear()
    fleet = cloud.list_fleet("lab")
    assert len(fleet) == 5 and all(i.state == "running" and i.private_ips for i in fleet)
    assert {i.size for i in fleet} == {"Standard_D2s_v5", "Standard_D4s_v5"}
    assert azure_emu.calls["vmss.list"] == 1
    assert azure_emu.calls["vm.list"] == 3  # two pages of the first set, one of the other
    assert azure_emu.calls.get("nic.list", 0) == 0  # the launches learnt every address
    assert azure_emu.calls.get("vm.get", 0) == 0
    azure_emu.arm.vms[next(iter(azure_emu.arm.vms))]["id"] += "-renamed"  # one not known
    assert len(cloud.list_fleet("lab")) == 5
    assert azure_emu.calls["nic.list"] == 3  # then five NICs, two a page
    assert cloud.list_fleet("another") == []


def test_vms_of_a_launch_in_flight_carry_its_token_so_the_reconcile_pass_leaves_them(
    azure_emu: AzureEmulator,
) -> None:
    azure_emu.arm.op_delay = 1.5
    cloud = make_cloud(azure_emu)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(cloud.launch_many(batch_spec(NAMES, "tok-i"))))
    t.start()
    deadline = time.monotonic() + 10
    while not azure_emu.arm.vms and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = cloud.list_fleet("lab")
    t.join(30)
    assert len(seen) == 3 and {i.tags.get(TOKEN_TAG) for i in seen} == {"tok-i"}
    assert {i.state for i in seen} == {"pending"}
    assert TOKEN_TAG not in cloud.list_fleet("lab")[0].tags
    assert len(done[0]) == 3


def test_host_keys_come_from_the_boot_diagnostics_serial_log(azure_emu: AzureEmulator) -> None:
    cloud = make_cloud(azure_emu)
    vm = cloud.launch_many(batch_spec(("az-1",), "tok-h"))[0]
    vm_id = next(v["properties"]["vmId"] for v in azure_emu.arm.vms.values())
    assert cloud.host_keys(vm.id) == [("ssh-ed25519", scale_key(vm_id))]
    assert cloud.host_keys(vm.id) == [("ssh-ed25519", scale_key(vm_id))]
    assert azure_emu.calls["vm.retrieveBootDiagnosticsData"] == 1  # its address kept
    assert azure_emu.calls["blob.get"] == 2


def test_with_the_sites_storage_account_host_keys_cost_no_arm_call(
    azure_emu: AzureEmulator,
) -> None:
    """Boot diagnostics in the site's storage account: the listing's instance views say
    where each log is, and the read is one blob GET with the account's read-only SAS."""
    from slurm_burst_lab.azureemu import STORAGE_SAS

    from slurm_burst.core.cloud import CloudError

    cloud = make_cloud(azure_emu, storage=STORAGE_SAS)
    vm = cloud.launch_many(batch_spec(("az-1",), "tok-s"))[0]
    put = next(b for m, _, b in azure_emu.requests if m == "PUT")
    diag = put["properties"]["virtualMachineProfile"]["diagnosticsProfile"]["bootDiagnostics"]
    assert diag == {"enabled": True, "storageUri": f"http://127.0.0.1:{azure_emu.port}/"}
    vm_id = next(v["properties"]["vmId"] for v in azure_emu.arm.vms.values())
    assert cloud.host_keys(vm.id) == [("ssh-ed25519", scale_key(vm_id))]
    assert azure_emu.calls.get("vm.retrieveBootDiagnosticsData", 0) == 0
    assert azure_emu.calls["storage.get"] == 1
    wrong = make_cloud(azure_emu, storage="sv=2022-11-02&sig=not-the-accounts")
    wrong.list_fleet("lab")
    with pytest.raises(CloudError, match="refused the serial log read") as err:
        wrong.host_keys(vm.id)
    assert "sig=" not in str(err.value)


def test_a_release_deletes_exactly_that_vm_with_its_nic_and_disk(
    azure_emu: AzureEmulator,
) -> None:
    cloud = make_cloud(azure_emu)
    made = cloud.launch_many(batch_spec(NAMES, "tok-d"))
    cloud.terminate(made[1].id)
    assert sorted(v["name"] for v in azure_emu.arm.vms.values()) == sorted([made[0].id, made[2].id])
    assert len(azure_emu.arm.nics) == 2 and len(azure_emu.arm.disks) == 2
    assert azure_emu.arm.sets[(GROUP.lower(), _set_name())]["sku"]["capacity"] == 2
    cloud.terminate(made[1].id)  # gone already: nothing to do
    cloud.tag(made[0].id, {"slurm-burst-node": "az-1", "Name": "az-1"})  # for people
    assert azure_emu.arm.vms[(GROUP.lower(), made[0].id.lower())]["tags"]["Name"] == "az-1"


def test_an_empty_set_is_deleted_by_the_fleet_pass_once_its_last_launch_is_old(
    azure_emu: AzureEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = make_cloud(azure_emu)
    made = cloud.launch_many(batch_spec(("az-1",), "tok-e"))
    cloud.terminate(made[0].id)
    cloud.list_fleet("lab")
    assert len(azure_emu.arm.sets) == 1  # its last launch is recent
    from slurm_burst.adapters.cloud.providers import azure_arm

    monkeypatch.setattr(azure_arm, "EMPTY_AFTER", 0.0)
    cloud.list_fleet("lab")
    assert azure_emu.arm.sets == {} and azure_emu.calls["vmss.delete"] == 1


def test_what_arm_says_is_left_caps_the_budget_and_throttles_are_waited_out_not_failed(
    azure_emu: AzureEmulator,
) -> None:
    """Another tool spent the subscription's writes: the remaining header says so and
    our budget follows it at once; the next scale-out's 429 (Retry-After) is waited out
    and repeated, so the launch succeeds, the throttle cut the writes' rate, and it
    never reached the launcher as an error."""
    from slurm_burst_lab.armlimits import ArmLimits
    from slurm_burst_lab.azureemu import CLIENT, SUBSCRIPTION

    azure_emu.limits = ArmLimits(0.05)  # writes: 10, refilled at 0.5 a second
    cloud = make_cloud(azure_emu)
    for _ in range(9):  # the other tool
        azure_emu.limits.take(SUBSCRIPTION, CLIENT, "writes", time.time())
    cloud.launch_many(batch_spec(("t-1",), "tok-t1"))
    assert cloud.budget.levels()["writes"] < 1.0  # was 200: ARM said 0 were left
    started = time.monotonic()
    made = cloud.launch_many(batch_spec(("t-2",), "tok-t2"))
    assert len(made) == 1 and len(azure_emu.arm.vms) == 2
    assert azure_emu.limits.throttled["writes"] >= 1
    assert time.monotonic() - started >= 1.0  # Retry-After was honoured
    assert azure_emu.calls["vmss.put"] == 2


def test_an_injected_429_names_its_wait_and_a_call_that_may_not_wait_is_told_later(
    azure_emu: AzureEmulator,
) -> None:
    from slurm_burst.core.cloud import Busy, ThrottledError

    cloud = make_cloud(azure_emu)
    vm = cloud.launch_many(batch_spec(("h-1",), "tok-h"))[0]
    azure_emu.inject("vm.retrieveBootDiagnosticsData", 429, "SubscriptionRequestsThrottled")
    with pytest.raises(ThrottledError) as err:
        cloud.host_keys(vm.id)  # a booting node's read: never sleeps in the caller
    assert err.value.after >= 1.0 and not isinstance(err.value, Busy)
    keys: list[tuple[str, str]] = []
    for _ in range(50):  # as the attestation comes back: when its budget says
        try:
            keys = cloud.host_keys(vm.id)
            break
        except Busy as later:
            time.sleep(min(later.after, 1.0))
    assert keys


def test_a_next_link_to_another_host_is_refused_not_followed(azure_emu: AzureEmulator) -> None:
    cloud = make_cloud(azure_emu)
    assert isinstance(cloud.inner, LibcloudCloud)
    arm = sets.Arm(cloud.inner)
    with pytest.raises(ValueError, match="another host"):
        arm.own_link("https://evil.example/subscriptions/x?$skiptoken=2")
    assert arm.own_link(f"http://127.0.0.1:{azure_emu.port}/a/b?x=%27y%27&$skiptoken=2") == (
        "/a/b",
        {"x": "'y'", "$skiptoken": "2"},
    )


def test_over_tls_the_profiles_ca_is_trusted_and_nothing_else(tmp_path: Any) -> None:
    """The lab serves Azure over TLS with a CA of its own (slurm_burst_lab.labca): the
    profile's ``ca_file`` trusts it for ARM, the token and the storage account's blobs;
    without it the same endpoint is refused, not trusted."""
    from slurm_burst_lab.azureemu import STORAGE_SAS
    from slurm_burst_lab.labca import ensure

    from slurm_burst.core.cloud import CloudError

    ca, cert, key = ensure(tmp_path / "ca")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    emu = AzureEmulator(keys_after=0.0)
    emu.start(tls=(str(cert), str(key)))
    try:
        assert emu.base.startswith("https://")
        cloud = make_cloud(emu, storage=STORAGE_SAS, ca_file=str(ca))
        vm = cloud.launch_many(batch_spec(("tls-1",), "tok-tls"))[0]
        assert cloud.host_keys(vm.id)
        with pytest.raises(CloudError, match=r"(?i)certificate"):
            make_cloud(emu).launch_many(batch_spec(("tls-2",), "tok-tls2"))
    finally:
        emu.stop()


IB = "Standard_ND96asr_v4"  # RDMA: its InfiniBand needs a Uniform set


def test_an_infiniband_job_gets_a_uniform_set_of_its_own_deleted_once_its_vms_are_gone(
    azure_emu: AzureEmulator,
) -> None:
    """placement = "infiniband": the job's Uniform set (one placement group, no
    overprovisioning) made by its launch with its capacity, its VMs named by instance id
    and addressed by the set's own NICs, listed with the launch's token, each deleted
    through the set; the set deleted by the reconcile pass once empty, not before."""
    from dataclasses import replace

    from slurm_burst_lab.azureemu import STORAGE_SAS

    from slurm_burst.adapters.cloud.providers.azure_arm import PROVIDER
    from slurm_burst.core.cloud import InUseError, NotFoundError

    cloud = make_cloud(azure_emu, storage=STORAGE_SAS)
    spec = replace(batch_spec(("ib-1", "ib-2"), "tok-ib", size=IB, group="gpu"),
                   placement_group="burstlab-pg-0123456789abcdef")  # fmt: skip
    cloud.create_placement(spec.placement_group)  # nothing: the launch makes the set
    made = cloud.launch_many(spec)
    name = sets.job_set(spec.placement_group)
    assert [i.id for i in made] == [f"{name}_0", f"{name}_1"] and all(i.private_ips for i in made)
    put = next(b for m, _, b in azure_emu.requests if m == "PUT")
    props = put["properties"]
    assert (props["orchestrationMode"], props["singlePlacementGroup"], props["overprovision"]) == (
        "Uniform", True, False)  # fmt: skip
    assert put["sku"] == {"name": IB, "tier": "Standard", "capacity": 2}
    assert check_exchanges(azure_emu, []) == 1
    assert cloud.launch_many(spec) == made and azure_emu.calls["vmss.put"] == 1  # a repeat
    fleet = cloud.list_fleet("lab")
    assert {i.id for i in fleet} == {i.id for i in made}
    assert {i.tags[TOKEN_TAG] for i in fleet} == {"tok-ib"}
    assert cloud.host_keys(made[0].id)  # its serial log, named by its instance view
    cloud.terminate(made[0].id)
    assert azure_emu.calls["vmssvm.delete"] == 1 and azure_emu.calls.get("vm.delete", 0) == 0
    with pytest.raises(InUseError):
        cloud.delete_placement(spec.placement_group)
    cloud.terminate(made[1].id)
    cloud.delete_placement(spec.placement_group)
    assert azure_emu.arm.sets == {}
    cloud.delete_placement(spec.placement_group)  # gone: no error (the provider says
    with pytest.raises(NotFoundError):  # so, and the cloud takes it as done)
        PROVIDER.delete_placement(cloud.inner, spec.placement_group)  # type: ignore[arg-type]


def test_an_infiniband_job_short_of_its_nodes_is_not_launched_at_all(
    azure_emu: AzureEmulator,
) -> None:
    from dataclasses import replace

    azure_emu.arm.limit(IB, 1)
    spec = replace(batch_spec(("ib-1", "ib-2"), "tok-ib2", size=IB, group="gpu"),
                   placement_group="burstlab-pg-fedcba9876543210")  # fmt: skip
    with pytest.raises(CapacityError) as err:
        make_cloud(azure_emu).launch_many(spec)
    assert err.value.code == "AllocationFailed"
    assert azure_emu.arm.sets == {} and azure_emu.arm.vms == {}  # one fabric or none


def test_which_sizes_need_infiniband_and_what_config_check_warns() -> None:
    from slurm_burst.adapters.cloud.providers.azure_arm import PROVIDER, uniform
    from slurm_burst.config import NodeGroup

    assert all(uniform.needs_infiniband(s) for s in (
        IB, "Standard_HB120rs_v3", "Standard_NC24rs_v3", "Standard_H16r",
        "Standard_ND96isr_H100_v5", "Standard_HB176-96rs_v4"))  # fmt: skip
    assert not any(uniform.needs_infiniband(s) for s in (
        "Standard_D2s_v5", "Standard_NC24ads_A100_v4", "Standard_F2s_v2",
        "Standard_NC4as_T4_v3"))  # fmt: skip

    def warned(sizes: tuple[str, ...], placement: str = "") -> list[str]:
        group = NodeGroup(name="g", pattern="g-{n}", count=2, partition="p", providers=("az",),
                          sizes=sizes, image="a:b:c:d", placement=placement, cpus=96,
                          memory_mb=900000)  # fmt: skip
        return [m for _, m in PROVIDER.group_warnings(group)]

    assert 'placement = "infiniband"' in warned((IB,))[0]
    assert warned((IB,), "infiniband") == [] and warned(("Standard_D2s_v5",)) == []
    assert "no InfiniBand" in warned(("Standard_D2s_v5",), "infiniband")[0]
    assert warned(("Standard_D2s_v5",), "proximity") == []  # one datacenter: what it is for
    assert 'placement = "infiniband"' in warned((IB,), "proximity")[0]  # not one fabric


def test_the_emulators_vms_have_every_field_of_libclouds_recorded_vm(
    azure_emu: AzureEmulator,
) -> None:
    """libcloud's recorded Azure VM listing (its test fixture, tests/data/providers):
    every field a VM has there (but the optional additionalCapabilities), the emulator's
    VMs have, in the same types."""
    import json
    from pathlib import Path

    fixture = Path(__file__).parents[1] / "data" / "providers" / "azure"
    recorded = json.loads((fixture / "_subscriptions_99999999_providers_Microsoft_Compute_"
                           "virtualMachines.json").read_text())["value"][0]  # fmt: skip
    make_cloud(azure_emu).launch_many(batch_spec(("f-1",), "tok-f"))
    ours = azure_emu.arm._vm_doc(next(iter(azure_emu.arm.vms.values())), False)
    assert set(recorded) <= set(ours), set(recorded) - set(ours)
    wanted = set(recorded["properties"]) - {"additionalCapabilities"}
    assert wanted <= set(ours["properties"]), wanted - set(ours["properties"])
    for key in wanted:
        assert type(ours["properties"][key]) is type(recorded["properties"][key]), key
    nic = ours["properties"]["networkProfile"]["networkInterfaces"][0]
    assert nic["id"].split("/")[-2:][0] == "networkInterfaces"
