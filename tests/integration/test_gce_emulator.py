"""The lab's Compute Engine emulator (slurm_burst_lab.gceemu) over HTTP: libcloud's own
GCE driver, built by slurm-burst with its ``endpoint`` option, launches, lists and
deletes on it after a real token exchange; bulk inserts keep Compute's rules; and every
request and answer is checked against Compute's own discovery document
(``compute.v1.json``, shipped by google-api-python-client)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.gceemu import PROJECT, GceEmulator, Quotas, matches

from slurm_burst.adapters.cloud.providers import split_endpoint
from tests.integration.gcetools import (
    IMAGE,
    SCHEMAS,
    ZONE,
    batch_spec,
    check_exchanges,
    make_driver,
    schema_of_kind,
)

pytestmark = pytest.mark.integration


def test_libclouds_driver_launches_lists_and_deletes_after_a_token_exchange(
    emu: GceEmulator, driver: Any
) -> None:
    assert emu.calls["token"] == 1 and driver.zone.name == ZONE
    node = driver.create_node(
        "burst-gce-1", "n2-standard-2", IMAGE, ex_labels={"slurm-burst-cluster": "lab"},
        ex_metadata={"enable-guest-attributes": "TRUE"}, ex_tags=["slurm-node"],
    )  # fmt: skip
    assert (node.name, node.state, node.extra["labels"]) == (
        "burst-gce-1",
        "running",
        {"slurm-burst-cluster": "lab"},
    )
    assert node.private_ips == ["10.251.0.2"] and emu.calls["insert"] == 1
    assert [n.name for n in driver.list_nodes()] == ["burst-gce-1"]
    with pytest.raises(Exception, match="already exists"):
        driver.create_node("burst-gce-1", "n2-standard-2", IMAGE)
    assert driver.destroy_node(node)
    assert driver.list_nodes() == [] and emu.calls["delete"] == 1
    assert check_exchanges(emu) > 20


def _bulk(driver: Any, names: list[str], *, min_count: int | None = None,
          region: str = "", request_id: str = "", shape: str = "") -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {
        "count": str(len(names)), "minCount": str(min_count or len(names)),  # int64: strings
        "perInstanceProperties": {n: {} for n in names},
        "instanceProperties": {
            "machineType": "n2-standard-2", "labels": {"slurm-burst-cluster": "lab"},
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
                "sourceImage": f"projects/debian-cloud/global/images/{IMAGE}"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
        },
    }  # fmt: skip
    if shape:
        body["locationPolicy"] = {"targetShape": shape}
    where = f"/regions/{region}" if region else f"/zones/{ZONE}"
    params = {"requestId": request_id} if request_id else {}
    started = driver.connection.request(f"{where}/instances/bulkInsert", method="POST",
                                        data=body, params=params).object  # fmt: skip
    assert started["status"] == "RUNNING" and "error" not in started  # the outcome comes later
    # its outcome (read plainly: libcloud's request raises on an operation with an error)
    import urllib.request

    conn = driver.connection
    url = f"http://{conn.host}:{conn.port}{conn.request_path}{where}/operations/{started['name']}"
    with urllib.request.urlopen(urllib.request.Request(url + "/wait", method="POST")) as r:
        return dict(json.loads(r.read()))


def test_a_bulk_insert_makes_all_its_named_instances_or_at_least_min_count(
    emu: GceEmulator, driver: Any
) -> None:
    op = _bulk(driver, ["b-1", "b-2", "b-3"])
    assert op["status"] == "DONE" and "error" not in op
    group = op["operationGroupId"]
    wanted = f'operationGroupId="{group}" AND operationType="insert"'
    per = driver.connection.request(f"/zones/{ZONE}/operations", method="GET",
                                    params={"filter": wanted}).object["items"]  # fmt: skip
    assert sorted(o["targetLink"].rsplit("/", 1)[1] for o in per) == ["b-1", "b-2", "b-3"]
    emu.limit("n2-standard-2", ZONE, 2)  # room for two more
    short = _bulk(driver, ["c-1", "c-2", "c-3"], min_count=3)
    assert short["error"]["errors"][-1]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert not any(n.startswith("c-") for _, n in emu.instances)  # none, not two
    part = _bulk(driver, ["d-1", "d-2", "d-3"], min_count=2)
    assert "error" not in part and sorted(n for _, n in emu.instances if n[0] == "d") == [
        "d-1", "d-2"]  # fmt: skip
    check_exchanges(emu)


def test_a_repeated_request_id_is_the_same_request_and_one_job_stays_in_one_zone(
    emu: GceEmulator, driver: Any
) -> None:
    first = _bulk(driver, ["r-1", "r-2"], region="us-central1", request_id="req-1",
                  shape="ANY_SINGLE_ZONE")  # fmt: skip
    again = _bulk(driver, ["r-1", "r-2"], region="us-central1", request_id="req-1",
                  shape="ANY_SINGLE_ZONE")  # fmt: skip
    assert again["name"] == first["name"] and len(emu.instances) == 2
    assert len({z for z, _ in emu.instances}) == 1  # one zone for the job's nodes
    other = _bulk(driver, ["r-1", "r-3"], region="us-central1")  # a new id, one exists
    codes = [e["code"] for e in other["error"]["errors"]]
    assert codes == ["RESOURCE_ALREADY_EXISTS"] and len(emu.instances) == 3
    check_exchanges(emu)


def test_the_fleet_is_listed_filtered_and_in_pages(emu: GceEmulator, driver: Any) -> None:
    _bulk(driver, [f"f-{i}" for i in range(7)])
    driver.connection.request(f"/zones/{ZONE}/instances/f-0/setLabels", method="POST", data={
        "labels": {"slurm-burst-cluster": "other"},
        "labelFingerprint": emu.instances[(ZONE, "f-0")]["labelFingerprint"]})  # fmt: skip
    names, token, pages = [], "", 0
    while True:
        params = {"filter": 'labels.slurm-burst-cluster = "lab" AND status != "TERMINATED"',
                  "maxResults": 3}  # fmt: skip
        if token:
            params["pageToken"] = token
        page = driver.connection.request("/aggregated/instances", method="GET",
                                         params=params).object  # fmt: skip
        pages += 1
        names += [i["name"] for zone in page["items"].values() for i in zone.get("instances", [])]
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert sorted(names) == [f"f-{i}" for i in range(1, 7)] and pages == 2
    check_exchanges(emu)


def test_host_keys_are_read_from_guest_attributes_once_published(
    emu: GceEmulator, driver: Any
) -> None:
    from slurm_burst.adapters.cloud.providers.gce import GuestAttributes

    node = driver.create_node("burst-gce-2", "n2-standard-2", IMAGE)
    reader = GuestAttributes(driver)
    assert reader.read(node) == []  # not published yet: a 404, no keys
    emu.publish("burst-gce-2", [("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIExample")])
    assert reader.read(node) == [("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIExample")]
    check_exchanges(emu)


def test_quotas_answer_rate_limit_exceeded_past_a_groups_minute(tmp_path: Path) -> None:
    e = GceEmulator(quotas=Quotas({"read_requests": 3}))
    e.start()
    try:
        import urllib.error
        import urllib.request

        url = f"http://127.0.0.1:{e.port}/compute/v1/projects/{PROJECT}/zones/{ZONE}"
        if time.time() % 60 > 58:  # not across a minute's edge
            time.sleep(2.5)
        for _ in range(3):
            urllib.request.urlopen(url).read()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url)
        assert err.value.code == 403
        doc = json.loads(err.value.read())
        assert doc["error"]["errors"][0]["reason"] == "rateLimitExceeded"
        assert e.quotas is not None and e.quotas.throttled["read_requests"] == 1
    finally:
        e.stop()


def test_filters_are_read_as_compute_reads_them() -> None:
    r = {"name": "n-1", "status": "RUNNING", "labels": {"c": "lab"}, "scheduling":
         {"preemptible": True}}  # fmt: skip
    assert matches('labels.c = "lab" AND status != "TERMINATED"', r)
    assert matches("(status = RUNNING) (labels.c = lab)", r)
    assert matches("scheduling.preemptible = true", r) and not matches('name = "n-2"', r)
    assert matches('name = "n-2" OR labels.c = lab', r) and matches("labels.c:*", r)
    for bad in ('labels.c = "lab" AND', "(status = RUNNING", "status RUNNING", "= x"):
        with pytest.raises(ValueError, match="filter"):
            matches(bad, r)


@pytest.mark.parametrize(("url", "ok"), [
    ("https://compute-psc.p.googleapis.com", True), ("http://127.0.0.1:8480", True),
    ("http://10.0.0.5:80", False), ("https://h/path", False), ("ftp://h", False),
    ("https://user:pw@h", False), ("https://h:99999", False),
])  # fmt: skip
def test_an_endpoint_is_https_or_loopback_http(url: str, ok: bool) -> None:
    if ok:
        assert split_endpoint(url)[1] in ("compute-psc.p.googleapis.com", "127.0.0.1")
    else:
        with pytest.raises(ValueError):
            split_endpoint(url)


def test_a_batch_is_one_bulk_insert_named_after_its_nodes_and_a_repeat_makes_none(
    emu: GceEmulator, driver: Any
) -> None:
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement

    cloud = LibcloudCloud("gcp", driver, Placement(zone=ZONE, security_groups=("slurm-node",),
                                                   ssh_user="slurm"))  # fmt: skip
    names = ("burst-gce-1", "burst-gce-2", "burst-gce-3")
    emu.calls.clear()
    made = cloud.launch_many(batch_spec(names, "burstlab-0a1b2c3d-b3-0-0123456789abcdef"))
    assert sorted(i.name for i in made) == list(names)
    assert emu.calls["bulkInsert"] == 1 and emu.calls["insert"] == 0
    assert {i.tags["slurm-burst-token"] for i in made} == {
        "burstlab-0a1b2c3d-b3-0-0123456789abcdef"
    }
    inst = emu.instances[(ZONE, "burst-gce-2")]
    assert inst["scheduling"]["provisioningModel"] == "SPOT"
    assert inst["tags"]["items"] == ["slurm-node"]
    items = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    assert items["enable-guest-attributes"] == "TRUE" and items["ssh-keys"].startswith("slurm:")
    # the daemon died before it recorded them: the repeat is the same request
    again = cloud.launch_many(batch_spec(names, "burstlab-0a1b2c3d-b3-0-0123456789abcdef"))
    assert sorted(i.id for i in again) == sorted(i.id for i in made) and len(emu.instances) == 3
    check_exchanges(emu)


def test_a_bulk_insert_short_of_capacity_is_a_capacity_error_or_what_is_worth_having(
    emu: GceEmulator, driver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.core.cloud import CapacityError

    cloud = LibcloudCloud("gcp", driver, Placement(zone=ZONE, ssh_user="slurm"))
    emu.limit("n2-standard-4", ZONE, 2)
    with pytest.raises(CapacityError) as err:
        cloud.launch_many(batch_spec(("j-1", "j-2", "j-3"), "tok-job-1", size="n2-standard-4"))
    assert err.value.code == "ZONE_RESOURCE_POOL_EXHAUSTED" and not emu.instances
    turns: list[str] = []  # what the budget is asked for inside the launch call
    cloud.turn = turns.append
    emu.calls.clear()
    with caplog.at_level(logging.WARNING):
        made = cloud.launch_many(batch_spec(("k-1", "k-2", "k-3"), "tok-job-2", least=2,
                                        size="n2-standard-4"))  # fmt: skip
    assert sorted(i.name for i in made) == ["k-1", "k-2"]
    # k-3's own insert operation, in the bulk operation's group, says why
    assert emu.calls["operations.list"] == 1
    assert "instance=k-3 code=ZONE_RESOURCE_POOL_EXHAUSTED" in caplog.text
    # the wait, the listing of what it made and that of the group's operations each took
    # their turn from their quota group (the bulk insert's own is the caller's)
    assert turns == ["zoneOperations.wait", "instances.aggregatedList",
                     "globalOperations.aggregatedList"]  # fmt: skip
    assert emu.calls["operations.wait"] == 1 and emu.calls["aggregatedList"] == 1
    check_exchanges(emu)


def test_a_profile_with_a_region_and_no_zone_launches_into_the_region(
    emu: GceEmulator, tmp_path: Path
) -> None:
    """regionInstances.bulkInsert: Compute picks the zones; a whole job's nodes go to one
    zone that has room for them all, a batch of independent nodes where there is room,
    and a single node is a bulk insert of one (libcloud's insert needs a zone)."""
    from dataclasses import replace

    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement

    driver = make_driver(emu, tmp_path, region="us-central1")
    assert driver.zone is None
    cloud = LibcloudCloud("gcp", driver, Placement(region="us-central1", ssh_user="slurm"))
    emu.limit("n2-standard-2", "us-central1-a", 1)
    emu.limit("n2-standard-2", "us-central1-b", 2)
    job = cloud.launch_many(batch_spec(("r-1", "r-2", "r-3"), "tok-region-job"))
    zones = {z for (z, n) in emu.instances if n.startswith("r-")}
    assert len(job) == 3 and zones == {"us-central1-c"}, zones  # the one zone with room
    emu.limit("n2-standard-2", "us-central1-c", 0)
    spread = cloud.launch_many(batch_spec(("s-1", "s-2", "s-3"), "tok-region-any", least=1))
    assert sorted(i.name for i in spread) == ["s-1", "s-2", "s-3"]
    assert {z for (z, n) in emu.instances if n.startswith("s-")} == {
        "us-central1-a",
        "us-central1-b",
    }
    emu.limit("n2-standard-2", "us-central1-c", 1)
    one = cloud.launch(replace(batch_spec(("t-1",), "tok-region-one"), names=()))
    assert one.name == "t-1" and emu.calls["bulkInsert"] == 3 and emu.calls["insert"] == 0
    check_exchanges(emu)


def test_the_fleet_is_one_listing_and_reads_and_teardowns_need_no_other(
    emu: GceEmulator, driver: Any
) -> None:
    """Booting nodes, host-key reads and teardowns share one aggregatedList of the
    cluster's instances: no libcloud ``list_nodes`` (every instance and every disk) per
    read, no per-node get; an instance not listed yet is found by one filtered listing."""
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement

    cloud = LibcloudCloud("gcp", driver, Placement(zone=ZONE, ssh_user="slurm"))
    made = cloud.launch_many(batch_spec(("g-1", "g-2", "g-3"), "tok-fleet"))
    driver.create_node("not-ours", "e2-small", IMAGE)  # another tool's, same project
    emu.calls.clear()
    pages: list[int] = []
    fleet = cloud.list_fleet("lab", lambda: pages.append(1))
    assert sorted(i.name for i in fleet) == ["g-1", "g-2", "g-3"] and pages == [1]
    assert emu.calls == {"aggregatedList": 1}
    emu.publish("g-2", [("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIGtwoXXX")])
    g2 = next(i for i in made if i.name == "g-2")
    assert cloud.host_keys(g2.id) == [("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIGtwoXXX")]
    assert emu.calls == {"aggregatedList": 1, "getGuestAttributes": 1}  # no lookup
    cloud.terminate(g2.id)
    cloud.terminate(g2.id)  # gone already: nothing to do, no error
    assert (ZONE, "g-2") not in emu.instances and emu.calls["delete"] == 1
    assert emu.calls["aggregatedList"] == 2  # the second: one filtered on its id
    fresh = LibcloudCloud("gcp", driver, Placement(zone=ZONE, ssh_user="slurm"))
    g3 = next(i for i in made if i.name == "g-3")
    assert fresh.host_keys(g3.id) == []  # not listed by this one: found by its id
    assert emu.calls["aggregatedList"] == 3 and "list" not in emu.calls
    check_exchanges(emu)


def test_in_scale_mode_instances_boot_and_publish_their_keys_on_their_own(tmp_path: Path) -> None:
    """Scale mode's instances stay STAGING for the boot delay, then publish a host key
    of their own ``keys_after`` seconds later, as the guest environment does."""
    import urllib.error
    import urllib.request

    from slurm_burst_lab.gceemu import scale_key

    from tests.conftest import wait

    e = GceEmulator(boot_delay=3.0, keys_after=1.0)
    e.start()
    try:
        base = f"http://127.0.0.1:{e.port}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"
        body = json.dumps({"name": "s-1", "machineType": "zones/x/machineTypes/e2-small"})
        urllib.request.urlopen(urllib.request.Request(base, body.encode(), method="POST"))

        def get(path: str) -> dict[str, Any]:
            with urllib.request.urlopen(base + path) as r:
                return dict(json.loads(r.read()))

        assert get("/s-1")["status"] == "STAGING"  # 3 s: a loaded machine reads it sooner
        with pytest.raises(urllib.error.HTTPError):
            get("/s-1/getGuestAttributes?queryPath=hostkeys/")
        wait(lambda: get("/s-1")["status"] == "RUNNING", 15, "the instance running")

        def keys() -> list[dict[str, str]]:
            try:
                got = get("/s-1/getGuestAttributes?queryPath=hostkeys/")
            except urllib.error.HTTPError:
                return []
            return list(got["queryValue"]["items"])

        items = wait(keys, 15, "its host key published")
        key = scale_key(e.instances[(ZONE, "s-1")]["id"])
        assert items == [{"namespace": "hostkeys", "key": "ssh-ed25519", "value": key}]
        from slurm_burst.core.hostkeys import key_entry

        assert key_entry("ssh-ed25519", key) == ("ssh-ed25519", key)  # the daemon reads it
    finally:
        e.stop()


def _libcloud_fixture(name: str) -> dict[str, Any]:
    """One of the GCE answers libcloud's own tests record (shipped with libcloud)."""
    import libcloud

    path = Path(libcloud.__file__).parent / "test" / "compute" / "fixtures" / "gce" / name
    return dict(json.loads(path.read_text()))


def test_answers_carry_every_field_of_libclouds_recorded_ones(
    emu: GceEmulator, driver: Any
) -> None:
    """libcloud's recorded answers (its GCE test fixtures, from Compute itself) against
    the emulator's of the same kind: every field they have that Compute still serves (in
    the discovery document's schema) is in the emulator's too, so libcloud's parsing of
    an answer never meets a gap here that Compute would have filled."""
    node = driver.create_node("burst-gce-1", "n2-standard-2", IMAGE)
    driver.ex_get_zone(ZONE)
    driver.ex_get_size("n2-standard-2", ZONE)
    aggregated = _libcloud_fixture("aggregated_instances.json")
    recorded = {
        "Instance": next(v["instances"][0] for v in aggregated["items"].values()
                         if v.get("instances")),
        "Operation": _libcloud_fixture(
            "operations_operation_zones_us-central1-a_instances_post.json"),
        "Zone": _libcloud_fixture("zones_us-central1-a.json"),
        "MachineType": _libcloud_fixture("zones_europe-west1-a_machineTypes_n1-standard-1.json"),
    }  # fmt: skip
    ours: dict[str, dict[str, Any]] = {}
    for _, answer in emu.answers:  # an answer, or the items of a list
        items = answer.get("items")
        for one in [answer, *(items if isinstance(items, list) else [])]:
            if one["kind"] != "compute#operation" or one.get("status") == "DONE":
                ours.setdefault(schema_of_kind(one["kind"]), one)  # (the recorded op is done)
    ours["Instance"] = emu._shown(emu.instances[(ZONE, node.name)])
    missing = {}
    for schema, theirs in recorded.items():
        served = set(SCHEMAS[schema]["properties"])
        gap = sorted((set(theirs) & served) - set(ours[schema]))
        if gap:
            missing[schema] = gap
    assert missing == {}, missing
