"""GCE's Spot VMs, compact placement policies and preemption notices, through slurm-burst's
GCE adapter and libcloud's driver against the lab's Compute Engine emulator over HTTP:
every launch is a bulk insert (a single node: a bulk insert of one) asking for Spot
(``provisioningModel = SPOT``, deleted when preempted) or the legacy preemptible model
where the profile asks; errors keep Compute's codes; a job's placement policy is made,
named by its instances, refused deletion while they live, and deleted after; and the
node agent hears of a preemption from the metadata server by waiting on it, not polling.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.gceemu import GceEmulator

from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.cloud.profiles import Placement
from slurm_burst.core.cloud import (
    CapacityError,
    CloudError,
    InUseError,
    QuotaError,
    ThrottledError,
)
from tests.conftest import wait
from tests.integration.conftest import NodeApiStub
from tests.integration.gcetools import ZONE, batch_spec, check_exchanges

pytestmark = pytest.mark.integration

PUB = "ssh-ed25519 AAAAC3Nz burst"


def _cloud(driver: Any, **extra: Any) -> LibcloudCloud:
    return LibcloudCloud("gcp", driver, Placement(zone=ZONE, security_groups=("slurm-node",),
                                                   ssh_user="slurm", extra=extra))  # fmt: skip


def test_a_single_launch_is_a_bulk_insert_of_one_with_its_gpus_spot_labels_and_script(
    emu: GceEmulator, driver: Any
) -> None:
    cloud = _cloud(driver)
    spec = replace(batch_spec(("node-name",), "c1-node-name-1-0"), names=(), gpus=1,
                   accelerator="nvidia-tesla-t4", disk_gb=50, size="a2-highgpu-1g",
                   tags={"cost-center": "HPC 42"})  # fmt: skip
    inst = cloud.launch(spec)
    assert inst.name == "node-name" and emu.calls["bulkInsert"] == 1 and not emu.calls["insert"]
    made = emu.instances[(ZONE, "node-name")]
    assert made["machineType"].endswith("/machineTypes/a2-highgpu-1g")
    assert made["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4",
                                          "acceleratorCount": 1}]  # fmt: skip
    assert made["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": False,
                                  "provisioningModel": "SPOT",
                                  "instanceTerminationAction": "DELETE"}  # fmt: skip
    assert made["labels"]["cost-center"] == "hpc-42"  # GCE labels: lower case, no spaces
    assert made["labels"]["slurm-burst-token"] == "c1-node-name-1-0"
    items = {i["key"]: i["value"] for i in made["metadata"]["items"]}
    assert items["startup-script"] == "#!/bin/sh\n" and items["ssh-keys"] == f"slurm:{PUB}"
    assert made["tags"]["items"] == ["slurm-node"]
    assert emu.disks[(ZONE, "node-name")]["sizeGb"] == "50"
    check_exchanges(emu)


def test_the_legacy_preemptible_model_only_where_the_profile_asks_for_it(
    emu: GceEmulator, driver: Any
) -> None:
    _cloud(driver, preemptible=True).launch_many(batch_spec(("p-1", "p-2"), "tok-preemptible"))
    sched = emu.instances[(ZONE, "p-1")]["scheduling"]
    assert sched["preemptible"] is True and "provisioningModel" not in sched
    _cloud(driver).launch_many(replace(batch_spec(("o-1",), "tok-on-demand"), spot=False))
    assert "scheduling" not in emu.instances[(ZONE, "o-1")] or not emu.instances[(ZONE, "o-1")][
        "scheduling"].get("provisioningModel")  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "kind", "code"),
    [(None, CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED"),
     ((403, "quotaExceeded"), QuotaError, "quotaExceeded"),
     ((403, "rateLimitExceeded"), ThrottledError, "rateLimitExceeded")],
    ids=["zone-exhausted", "gpu-quota", "rate-limit"],
)  # fmt: skip
def test_a_launchs_errors_keep_computes_codes(
    emu: GceEmulator, driver: Any, fault: tuple[int, str] | None, kind: type[CloudError], code: str
) -> None:
    if fault is None:
        emu.limit("n2-standard-2", ZONE, 0)
    else:
        emu.inject("bulkInsert", *fault)
    with pytest.raises(kind) as err:
        _cloud(driver).launch(replace(batch_spec(("e-1",), "tok-error"), names=()))
    assert err.value.code == code and not emu.instances


def test_spot_refused_is_a_capacity_error_and_withheld_spot_stays_staging(
    emu: GceEmulator, driver: Any
) -> None:
    cloud = _cloud(driver)
    emu.set_spot("refuse")
    with pytest.raises(CapacityError) as err:
        cloud.launch_many(batch_spec(("s-1", "s-2"), "tok-spot-refused"))
    assert err.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED" and not emu.instances
    on_demand = cloud.launch_many(replace(batch_spec(("d-1", "d-2"), "tok-od"), spot=False))
    assert len(on_demand) == 2  # on-demand capacity is there
    emu.set_spot("withhold")
    held = cloud.launch_many(batch_spec(("w-1", "w-2"), "tok-spot-withheld"))
    assert {i.state for i in held} == {"pending"}
    assert sorted(emu.market()["withheld"]) == sorted(i.id for i in held)
    listed = {i.name: i.state for i in cloud.list_fleet("lab", lambda: None)}
    assert listed["w-1"] == listed["w-2"] == "pending" and listed["d-1"] == "running"
    check_exchanges(emu)


def test_a_jobs_placement_policy_is_made_named_refused_deletion_in_use_and_deleted(
    emu: GceEmulator, driver: Any
) -> None:
    cloud = _cloud(driver)
    cloud.create_placement("Lab-0a1b2c3d-pg-0123456789abcdef")
    cloud.create_placement("Lab-0a1b2c3d-pg-0123456789abcdef")  # a repeat: no error
    (name,) = emu.market()["policies"]
    assert name == "lab-0a1b2c3d-pg-0123456789abcdef"  # a resource name: lower case
    doc = emu.policies[("us-central1", name)]
    assert doc["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    spec = replace(batch_spec(("j-1", "j-2", "j-3"), "tok-placed"), spot=False,
                   placement_group="Lab-0a1b2c3d-pg-0123456789abcdef")  # fmt: skip
    made = cloud.launch_many(spec)
    # on-demand too: a compact policy's instances do not live-migrate
    sched = emu.instances[(ZONE, "j-1")]["scheduling"]
    assert sched["onHostMaintenance"] == "TERMINATE" and "provisioningModel" not in sched
    assert emu.market()["policies"][name]["members"] == sorted(i.id for i in made)
    with pytest.raises(InUseError):
        cloud.delete_placement("Lab-0a1b2c3d-pg-0123456789abcdef")
    for i in made:
        cloud.terminate(i.id)
    cloud.delete_placement("Lab-0a1b2c3d-pg-0123456789abcdef")
    cloud.delete_placement("Lab-0a1b2c3d-pg-0123456789abcdef")  # gone already: no error
    assert not emu.policies
    # a job that does not fit its policy is refused whole, never split
    cloud.create_placement("lab-pg-small")
    emu.policy_room("lab-pg-small", 2)
    with pytest.raises(CapacityError):
        cloud.launch_many(replace(spec, token="tok-small", placement_group="lab-pg-small"))
    assert not emu.instances
    check_exchanges(emu)


def test_a_policy_is_waited_for_only_by_a_launch_that_finds_it_not_ready(
    emu: GceEmulator, driver: Any
) -> None:
    """The policy's insert is not waited for: the job's bulk insert follows at once and
    finds it made (a placement: two calls, insert and delete). One that Compute has not
    finished (``resourceNotReady``) makes the launch wait for the insert, then ask again."""
    cloud = _cloud(driver)
    spec = replace(batch_spec(("q-1", "q-2"), "tok-ready"), placement_group="lab-pg-ready")
    cloud.create_placement("lab-pg-ready")
    emu.calls.clear()
    assert len(cloud.launch_many(spec)) == 2
    assert (emu.calls["bulkInsert"], emu.calls["operations.wait"]) == (1, 1)  # the bulk's
    emu.policy_delay = 1.0
    cloud.create_placement("lab-pg-slow")
    emu.calls.clear()
    made = cloud.launch_many(replace(spec, names=("r-1", "r-2"), node="r-1", token="tok-slow",
                                     placement_group="lab-pg-slow"))  # fmt: skip
    assert len(made) == 2 and emu.market()["policies"]["lab-pg-slow"]["members"]
    # refused not ready, the policy's insert waited for, then the bulk insert again
    assert (emu.calls["bulkInsert"], emu.calls["operations.wait"]) == (2, 2), emu.calls
    check_exchanges(emu)


def test_the_agent_waits_on_the_metadata_server_and_tells_a_preemption_once(
    emu: GceEmulator, driver: Any, node_api: NodeApiStub
) -> None:
    """The node agent's GCE notices against the emulator's metadata server (served on
    loopback here, as in a VM's namespace in the lab): it reads each key once, then
    waits on it with its ETag; a preemption ends the wait, the daemon is told once, and
    the instance is deleted when the preemption's time is up."""
    from slurm_burst.node.agent import GceNotices

    (inst,) = _cloud(driver).launch_many(batch_spec(("n-1",), "tok-notice"))
    emu.meta.add(inst.id, "n-1", ZONE)
    port = emu.meta.serve_here(inst.id)
    notices = GceNotices(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{node_api.server_port}")
    assert notices.look("preempted") == (False, notices.read("preempted")[1])  # FALSE
    # no ETag known: a wait is for a change from the value when asked (never a busy poll)
    held = threading.Thread(target=notices.read, args=("preempted", True), daemon=True)
    held.start()
    wait(lambda: emu.meta.waiting(inst.id) == 1, 10, "the read held")
    assert held.is_alive()
    notices.start()
    wait(lambda: emu.meta.waiting(inst.id) == 3, 10, "both keys waited on")
    emu.preempt(inst.id, 1.0)
    wait(lambda: notices.told.is_set(), 10, "the notice told")
    assert node_api.told == [{"path": "/v1/notice", "action": "preempted"}]
    wait(lambda: (ZONE, "n-1") not in emu.instances, 10, "the instance deleted")
    assert emu.market()["preempted"] == [inst.id]
    emu.meta.stop(inst.id)
    assert node_api.told == [{"path": "/v1/notice", "action": "preempted"}]  # once


def test_the_metadata_server_answers_only_with_its_header_and_a_maintenance_wakes(
    emu: GceEmulator, driver: Any, node_api: NodeApiStub
) -> None:
    import urllib.error
    import urllib.request

    from slurm_burst.node.agent import GceNotices

    emu.meta.add("77", "m-1", ZONE)
    port = emu.meta.serve_here("77")
    base = f"http://127.0.0.1:{port}/computeMetadata/v1/instance"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}/preempted", timeout=5)  # no Metadata-Flavor
    assert err.value.code == 403
    notices = GceNotices(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{node_api.server_port}")
    assert notices.read("maintenance-event")[0] == "NONE"
    notices.start()
    wait(lambda: emu.meta.waiting("77") == 2, 10, "both keys waited on")
    asked = emu.meta.asked["77"]
    emu.meta.maintenance("77", "MIGRATE_ON_HOST_MAINTENANCE")  # a live migration: no notice
    wait(lambda: emu.meta.asked["77"] == asked + 1, 10, "the new value read, and waited on")
    assert node_api.told == []
    emu.meta.maintenance("77", "TERMINATE_ON_HOST_MAINTENANCE")
    wait(lambda: notices.told.is_set(), 10, "the notice told")
    assert node_api.told == [{"path": "/v1/notice", "action": "maintenance"}]
    emu.meta.stop("77")


# -- the daemon's launcher and reconciler on the emulator ---------------------------------
JOB = [{"job_id": 7, "nodes": "spot-[1-4]"}]
NODES = [f"spot-{i}" for i in range(1, 5)]


def test_spot_refused_falls_back_at_once_in_one_policy_deleted_once_the_nodes_are_gone(
    emu: GceEmulator, tmp_path: Path
) -> None:
    """The daemon's own launcher: Spot refused for a 4-node job, its nodes launch at once
    on the fallback's on-demand capacity in one bulk insert, in the one compact policy
    made for the job (made once, whatever was tried); released, the reconcile pass
    deletes the policy: its insert and its delete are the calls a placement adds."""
    from slurm_burst.core.nodestate import Want
    from tests.integration.gcetools import gce_config
    from tests.integration.test_ec2 import daemon, launch_batch, requested

    dm = daemon(gce_config(tmp_path, emu.port), tmp_path)
    prov = dm.prov
    requested(prov, *NODES, jobs=JOB)
    emu.set_spot("refuse")
    emu.calls.clear()
    launch_batch(prov, NODES)
    recs = [prov.store.node(n) for n in NODES]
    assert all(r is not None and r.market == "" and r.instance_id for r in recs), recs
    (placed,) = {r.placement for r in recs if r is not None}
    (policy,) = emu.market()["policies"].values()
    assert policy["members"] == sorted(r.instance_id for r in recs if r is not None)
    assert emu.calls["bulkInsert"] == 2 and emu.calls["resourcePolicies.insert"] == 1
    for n in NODES:
        prov.store.update(n, want=Want.DOWN)
        prov.drive(n)
    dm.reconciler.pass_once()
    assert not emu.market()["policies"] and placed not in prov.store.placements()
    assert emu.calls["resourcePolicies.delete"] == 1
    assert {m: emu.calls[m] for m in emu.calls if m.startswith("resourcePolicies.")} == {
        "resourcePolicies.insert": 1, "resourcePolicies.delete": 1}  # fmt: skip


def test_a_policy_still_in_use_is_deleted_by_a_later_pass(emu: GceEmulator, tmp_path: Path
                                                           ) -> None:  # fmt: skip
    """An instance of the job that Compute has not deleted yet keeps its policy: the pass
    leaves it (recorded), a later one deletes it."""
    from slurm_burst.core.nodestate import Want
    from tests.integration.gcetools import gce_config
    from tests.integration.test_ec2 import daemon, launch_batch, requested

    dm = daemon(gce_config(tmp_path, emu.port), tmp_path)
    prov = dm.prov
    requested(prov, *NODES, jobs=JOB)
    launch_batch(prov, NODES)
    recs = [prov.store.node(n) for n in NODES]
    assert all(r is not None and r.market == "spot" for r in recs), recs
    (placed,) = {r.placement for r in recs if r is not None}
    straggler = recs[0]
    assert straggler is not None
    for n in NODES:
        prov.store.update(n, want=Want.DOWN)
        prov.drive(n)
    assert not emu.market()["live"]  # the nodes' teardowns deleted their instances
    (pname,) = emu.market()["policies"]
    # an instance that still names the policy (one whose delete Compute has not done yet)
    emu.members[("us-central1", pname)].add(straggler.instance_id)
    dm.reconciler.pass_once()
    assert placed in prov.store.placements() and pname in emu.market()["policies"]
    emu.members[("us-central1", pname)].clear()
    dm.reconciler.pass_once()
    assert placed not in prov.store.placements() and not emu.market()["policies"]
