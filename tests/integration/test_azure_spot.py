"""Azure Spot, proximity placement and Scheduled Events through slurm-burst's Azure
provider against the lab's Azure emulator over HTTP: a Spot launch is a scale-out of a
Spot set of its own (``priority``, ``evictionPolicy = Delete``, ``maxPrice``); a refusal
and a Spot quota are capacity errors (the launcher's fallback, at once); capacity that
does not come within the group's wait is given up with its VMs deleted; a placed job
gets a proximity placement group and a set of its own, both deleted after its VMs; the
node agent reads Scheduled Events naming its VM, tells the daemon once, and
acknowledges the event only after the daemon's requeue."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.azureemu import AzureEmulator

from slurm_burst.adapters.cloud.providers.azure_arm import PROVIDER, sets
from slurm_burst.core.cloud import (
    SPOT_WAIT_CODE,
    CapacityError,
    InUseError,
    LaunchSpec,
    NotFoundError,
    QuotaError,
)
from tests.conftest import wait
from tests.integration.azuretools import GROUP, batch_spec, check_exchanges, make_cloud
from tests.integration.conftest import NodeApiStub

pytestmark = pytest.mark.integration

SIZE = "Standard_D2s_v5"
PLACED = "burstlab-pg-00112233aabbccdd"


def _spot(names: tuple[str, ...], token: str, wait_s: float = 30.0, **kw: Any) -> LaunchSpec:
    return replace(batch_spec(names, token), spot=True, spot_wait=wait_s, **kw)


def test_a_spot_launch_scales_out_a_spot_set_of_its_own_deleted_when_evicted(
    azure_emu: AzureEmulator,
) -> None:
    cloud = make_cloud(azure_emu)
    made = cloud.launch_many(_spot(("s-1", "s-2"), "tok-spot"))
    spot_set = f"{sets.set_base('lab', 'cpu', SIZE, spot=True)}-1"
    assert spot_set.endswith("-spot-1") and all(i.id.startswith(f"{spot_set}_") for i in made)
    put = next(b for m, p, b in azure_emu.requests if m == "PUT" and "ScaleSets" in p)
    profile = put["properties"]["virtualMachineProfile"]
    assert (profile["priority"], profile["evictionPolicy"], profile["billingProfile"]) == (
        "Spot", "Delete", {"maxPrice": -1})  # fmt: skip
    # the same group's on-demand launch: another set (a set's priority is fixed)
    (od,) = cloud.launch_many(batch_spec(("o-1",), "tok-od"))
    assert od.id.startswith(f"{sets.set_base('lab', 'cpu', SIZE)}-1_")
    capped = cloud.launch_many(_spot(("c-1",), "tok-cap", spot_max_price=0.05))
    assert capped
    last = [b for m, p, b in azure_emu.requests if m == "PUT" and "ScaleSets" in p][-1]
    assert last["properties"]["virtualMachineProfile"]["billingProfile"] == {"maxPrice": 0.05}
    assert check_exchanges(azure_emu, []) == 3


@pytest.mark.parametrize("code", ["SkuNotAvailable", "OverconstrainedAllocationRequest",
                                  "AllocationFailed"])  # fmt: skip
def test_refused_spot_capacity_is_a_capacity_error_with_nothing_left(
    azure_emu: AzureEmulator, code: str
) -> None:
    azure_emu.arm.set_spot("refuse", code)
    cloud = make_cloud(azure_emu)
    with pytest.raises(CapacityError) as err:
        cloud.launch_many(_spot(("s-1", "s-2"), "tok-refused"))
    assert err.value.code == code
    assert azure_emu.arm.vms == {}
    assert cloud.launch_many(batch_spec(("o-1",), "tok-od"))  # on-demand is not refused


def test_a_spot_quota_is_a_refusal_and_an_on_demand_one_stays_a_quota(
    azure_emu: AzureEmulator,
) -> None:
    """Spot cores have a quota of their own: exhausted, the on-demand fallback may fit."""
    azure_emu.arm.limit(SIZE, 0, "OperationNotAllowed")
    cloud = make_cloud(azure_emu)
    with pytest.raises(CapacityError) as err:
        cloud.launch_many(_spot(("s-1",), "tok-q1"))
    assert err.value.code == "OperationNotAllowed" and not isinstance(err.value, QuotaError)
    with pytest.raises(QuotaError):
        cloud.launch_many(batch_spec(("o-1",), "tok-q2"))


def test_withheld_spot_capacity_is_given_up_after_the_wait_with_its_vms_deleted(
    azure_emu: AzureEmulator,
) -> None:
    azure_emu.arm.set_spot("withhold")
    cloud = make_cloud(azure_emu)
    began = time.monotonic()
    with pytest.raises(CapacityError) as err:
        cloud.launch_many(_spot(("s-1", "s-2"), "tok-held", wait_s=1.5))
    took = time.monotonic() - began
    assert err.value.code == SPOT_WAIT_CODE and 1.5 <= took < 15, took
    market = azure_emu.arm.market()
    assert len(market["withheld"]) == 2 and market["live"] == []  # each deleted by name
    assert azure_emu.calls["vm.delete"] == 2 and not azure_emu.calls.get("vmss.delete")
    azure_emu.arm.set_spot("")
    assert len(cloud.launch_many(_spot(("s-1", "s-2"), "tok-held-2"))) == 2  # the set again


def test_a_placed_job_gets_a_proximity_group_and_a_set_of_its_own_deleted_after(
    azure_emu: AzureEmulator,
) -> None:
    """placement = "proximity": the job's proximity placement group (in the profile's
    zone) and a Flexible set of its own in it, a Spot one apart; both sets and the group
    deleted once the VMs are gone, refused (InUse) before; a placement costs the job a
    group's PUT and DELETE, and a GET and a DELETE of each set."""
    cloud = make_cloud(azure_emu, zone="2")
    spec = replace(batch_spec(("p-1", "p-2"), "tok-p"), placement_group=PLACED,
                   placement_kind="proximity")  # fmt: skip
    cloud.create_placement(PLACED)  # nothing: the launch makes it
    azure_emu.arm.set_spot("refuse")
    with pytest.raises(CapacityError):
        cloud.launch_many(replace(spec, spot=True, spot_wait=30.0, token="tok-ps"))
    azure_emu.arm.set_spot("")
    made = cloud.launch_many(spec)
    ppg = sets.ppg_name(PLACED)
    market = azure_emu.arm.market()["ppgs"][ppg]
    assert market["zones"] == ["2"] and market["sets"] == sorted(
        [sets.job_set(PLACED), sets.job_set(PLACED, spot=True)])  # fmt: skip
    assert market["vms"] == sorted(i.id for i in made)
    assert azure_emu.calls["ppg.put"] == 1  # made once, for both launches
    with pytest.raises(InUseError):
        cloud.delete_placement(PLACED)
    for inst in made:
        cloud.terminate(inst.id)
    time.sleep(0.1)
    before = dict(azure_emu.calls)
    cloud.delete_placement(PLACED)
    spent = {k: v - before.get(k, 0) for k, v in azure_emu.calls.items() if v != before.get(k, 0)}
    assert spent.get("vmss.delete") == 2 and spent.get("ppg.delete") == 1, spent
    assert azure_emu.arm.ppgs == {} and azure_emu.arm.sets == {}
    with pytest.raises(NotFoundError):
        PROVIDER.delete_placement(cloud.inner, PLACED)  # type: ignore[arg-type]
    check_exchanges(azure_emu, [])


def test_the_emulator_refuses_a_set_in_another_zone_than_its_proximity_group(
    azure_emu: AzureEmulator,
) -> None:
    import json

    token = _token(azure_emu)
    base = (f"{azure_emu.base}/subscriptions/{_sub()}/resourceGroups/{GROUP}/providers/"
            "Microsoft.Compute")  # fmt: skip
    code, _ = _put(f"{base}/proximityPlacementGroups/g1", token,
                   {"location": "eastus", "zones": ["1"], "properties": {}})  # fmt: skip
    assert code == 201
    body = json.loads(json.dumps(next(
        b for m, p, b in _launch_once(azure_emu) if m == "PUT" and "ScaleSets" in p)))  # fmt: skip
    body["zones"] = ["3"]
    body["properties"]["proximityPlacementGroup"] = {"id": "/x/proximityPlacementGroups/g1"}
    code, doc = _put(f"{base}/virtualMachineScaleSets/other", token, body)
    assert code == 404  # no such group: its id is checked
    body["properties"]["proximityPlacementGroup"] = {
        "id": f"/subscriptions/{_sub()}/resourceGroups/{GROUP}/providers/Microsoft.Compute/"
        "proximityPlacementGroups/g1"}  # fmt: skip
    code, doc = _put(f"{base}/virtualMachineScaleSets/other", token, body)
    assert code == 400 and "zones" in str(doc.get("error")), doc


def _sub() -> str:
    from slurm_burst_lab.azureemu import SUBSCRIPTION

    return SUBSCRIPTION


def _token(emu: AzureEmulator) -> str:
    import json
    import urllib.parse

    from slurm_burst_lab.azureemu import CLIENT, SECRET, TENANT

    data = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": CLIENT,
                                   "client_secret": SECRET,
                                   "resource": "https://management.core.windows.net/"})  # fmt: skip
    with urllib.request.urlopen(f"{emu.base}/{TENANT}/oauth2/token", data.encode(), 10) as r:
        return str(json.loads(r.read())["access_token"])


def _put(url: str, token: str, body: object) -> tuple[int, dict[str, Any]]:
    import json

    req = urllib.request.Request(f"{url}?api-version=2024-03-01", json.dumps(body).encode(),
                                 {"Authorization": f"Bearer {token}",
                                  "Content-Type": "application/json"}, method="PUT")  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _launch_once(emu: AzureEmulator) -> list[tuple[str, str, object]]:
    make_cloud(emu).launch_many(batch_spec(("z-1",), "tok-z"))
    return list(emu.requests)


# -- Scheduled Events: the node agent against the VM's metadata service -------------------
def test_the_agent_tells_a_preempt_once_and_acknowledges_it_after_the_requeue(
    azure_emu: AzureEmulator, node_api: NodeApiStub
) -> None:
    """A Preempt naming this VM is told once (an event for another VM, and a Freeze, are
    not); it is acknowledged only once the daemon's requeue is past (``requeue_at`` and
    the jobs' time to leave), and the acknowledged eviction deletes the VM."""
    from slurm_burst.node.agent import AzureNotices

    (inst,) = make_cloud(azure_emu).launch_many(_spot(("e-1",), "tok-ev"))
    vm = next(v for v in azure_emu.arm.vms.values() if v["name"] == inst.id)
    vm_id = vm["properties"]["vmId"]
    imds = azure_emu.arm.imds
    imds.add(vm_id, inst.id)
    port = imds.serve_here(vm_id)
    base = f"http://127.0.0.1:{port}"
    with pytest.raises(urllib.error.HTTPError) as err:  # no Metadata header: refused
        urllib.request.urlopen(f"{base}/metadata/scheduledevents?api-version=2020-07-01", None, 5)
    assert err.value.code == 400
    notices = AzureNotices(base, f"http://127.0.0.1:{node_api.server_port}")
    assert notices.look() == "" and notices.name == inst.id
    azure_emu.arm.schedule_event(inst.id, "Freeze", 300)
    assert notices.look() == "" and node_api.told == []
    node_api.answer = {"jobs": [7], "signalled": [7], "requeue_at": time.time() + 1.0}
    notices.LEAVE = 0.5
    event = azure_emu.arm.schedule_event(inst.id, "Preempt", 60)
    said = notices.look()
    assert said == f"Preempt event {event['EventId']} told to the daemon", said
    assert node_api.told == [{"path": "/v1/notice", "action": "Preempt",
                              "time": event["NotBefore"]}]  # fmt: skip
    assert notices.look() == "" and imds.acked.get(vm_id) is None  # not before the requeue
    time.sleep(1.6)
    assert notices.look() == f"event {event['EventId']} acknowledged"
    assert imds.acked[vm_id] == [event["EventId"]]
    wait(lambda: azure_emu.arm.market()["evicted"] == [inst.id], 10, "the VM evicted")
    assert inst.id not in azure_emu.arm.market()["live"]
    assert len(node_api.told) == 1  # once
    imds.stop(vm_id)


def test_an_event_for_another_vm_is_not_told(
    azure_emu: AzureEmulator, node_api: NodeApiStub
) -> None:
    from slurm_burst.node.agent import AzureNotices

    imds = azure_emu.arm.imds
    imds.add("vm-a", "set_aaaa")
    port = imds.serve_here("vm-a")
    imds.schedule("vm-a", "Preempt", 60, resources=["set_bbbb"])  # its neighbour's
    notices = AzureNotices(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{node_api.server_port}")
    assert notices.look() == "" and node_api.told == []
    imds.schedule("vm-a", "Redeploy", 60)
    assert "Redeploy event" in notices.look()
    assert node_api.told[0]["action"] == "Redeploy"
    imds.stop("vm-a")


# -- the daemon's launcher and reconciler on the emulator ---------------------------------
JOB = [{"job_id": 7, "nodes": "spot-[1-4]"}]
NODES = [f"spot-{i}" for i in range(1, 5)]


@pytest.mark.parametrize("mode", ["refuse", "withhold"])
def test_spot_not_given_falls_back_in_one_proximity_group_deleted_once_the_nodes_are_gone(
    azure_emu: AzureEmulator, tmp_path: Path, mode: str
) -> None:
    """The daemon's own launcher: Spot refused (or withheld past the group's 1 s wait)
    for a 4-node job: its nodes launch on the fallback's on-demand capacity in one
    scale-out of the job's own set, in the one proximity placement group made for the
    job; released, the reconcile pass deletes the sets and the group."""
    from slurm_burst.core.nodestate import Want
    from tests.integration.azuretools import azure_config
    from tests.integration.test_ec2 import daemon, launch_batch, requested

    dm = daemon(azure_config(tmp_path, azure_emu.port, wait=1.0), tmp_path)
    prov = dm.prov
    requested(prov, *NODES, jobs=JOB)
    azure_emu.arm.set_spot(mode, "OverconstrainedAllocationRequest")
    azure_emu.calls.clear()
    launch_batch(prov, NODES)
    recs = [prov.store.node(n) for n in NODES]
    assert all(r is not None and r.market == "" and r.instance_id for r in recs), recs
    (placed,) = {r.placement for r in recs if r is not None}
    (group,) = azure_emu.arm.market()["ppgs"].values()
    assert group["vms"] == sorted(r.instance_id for r in recs if r is not None)
    assert azure_emu.calls["vmss.put"] == 2 and azure_emu.calls["ppg.put"] == 1
    for n in NODES:
        prov.store.update(n, want=Want.DOWN)
        prov.drive(n)
    time.sleep(0.1)
    dm.reconciler.pass_once()
    assert not azure_emu.arm.market()["ppgs"] and placed not in prov.store.placements()
    assert azure_emu.calls["ppg.delete"] == 1 and azure_emu.calls["vmss.delete"] == 2
