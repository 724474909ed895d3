"""Azure end to end: our Azure provider talks to the lab's Azure emulator over TLS (a
certificate of the lab's own CA, trusted through the profile's ``ca_file``), whose VMs
boot as namespace VMs in a subnet of their own on the cloud bridge. The daemon launches a
job's nodes with one scale-out of the group's Flexible scale set, reads their host keys
from the boot diagnostics serial logs in the site's storage account (the fleet listing
names each log), joins them over WireGuard, and the job runs; then each VM is deleted by
name and the ledger prices them at the group's Azure rate. And 16 nodes launch and join
while the emulator's ARM buckets are scaled down until it answers 429. And Spot (group
``azspot``): refused, a 4-node job runs on-demand in one proximity placement group,
deleted after; withheld, the fallback comes after the wait; evicted (a ``Preempt``
Scheduled Event), the job gets its signal, is requeued and completes on a replacement.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
import subprocess
import time
import urllib.request
from typing import Any

import pytest
from slurm_burst_lab.config import settings
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from tests.conftest import wait
from tests.lab.conftest import CLOUD_JOIN
from tests.lab.reclaim import srun_with_spot, thaw_spot, withheld_falls_back
from tests.lab.release import emulator_vms, release

NODES = ("burst-az-1", "burst-az-2")
PRICE = 0.096  # the lab config's Standard_D2s_v5 price


def emulator(cfg: Config, what: str) -> dict[str, Any]:
    """The lab's Azure emulator's control endpoint ``/_emulator/<what>`` (over TLS)."""
    prov = cfg.providers[settings(cfg).azure_provider]
    context = ssl.create_default_context(cafile=str(prov.options["ca_file"]))
    url = f"{prov.options['endpoint']}/_emulator/{what}"
    with urllib.request.urlopen(url, timeout=30, context=context) as r:
        return dict(json.loads(r.read()))


def _release(env: dict[str, str], lab: Lab, store: Store, nodes: list[str], ids: set[str],
             vm_ids: set[str]) -> None:  # fmt: skip
    release(env, lab, store, nodes, "azure", vm_ids)

    def listed() -> set[str]:
        return ids & {v["name"] for v in emulator(lab.cfg, "vms")["vms"]}

    wait(lambda: not listed(), 30, "the VMs deleted (each by name; a delete takes 1 s)")


def job_on_azure(lab: Lab, cfg: Config, env: dict[str, str], store: Store) -> None:
    subnet = ipaddress.ip_network(settings(cfg).azure_subnet)
    before = emulator(cfg, "calls")["calls"]
    srun = subprocess.run(
        ["srun", "-p", "burst-az", "-N2", "-t", "5", "hostname", "-I"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert srun.returncode == 0, srun.stderr[-3000:]
    tasks = [line.split() for line in srun.stdout.splitlines() if line.strip()]
    assert len(tasks) == 2, srun.stdout
    assert all(any(ipaddress.ip_address(a) in subnet for a in t) for t in tasks), tasks
    recs = {n: store.node(n) for n in NODES}
    for rec in recs.values():
        assert rec is not None and rec.provider == "azure", rec
        assert rec.size == "Standard_D2s_v5" and ipaddress.ip_address(rec.ip) in subnet, rec
        assert re.fullmatch(r"[a-z0-9-]+-1_[0-9a-f]{8}", rec.instance_id), rec  # Azure's names
    ids = {r.instance_id for r in recs.values() if r}
    vms = {v["name"]: v["vmId"] for v in emulator(cfg, "vms")["vms"]}
    vm_ids = {vms[i] for i in ids}
    assert set(emulator_vms(lab, "azure")) >= vm_ids
    calls = emulator(cfg, "calls")["calls"]
    made = {m: calls.get(m, 0) - before.get(m, 0) for m in calls}
    assert made.get("vmss.put") == 1, made  # one scale-out for the job
    assert made.get("storage.get", 0) >= 2, made  # host keys from the serial logs
    assert not made.get("vm.get") and not made.get("vm.retrieveBootDiagnosticsData"), made
    log = (lab.paths.log / "daemon.log").read_text()
    for name in NODES:
        steps = dict(re.findall(rf"node\.step node={name} step=([\w-]+) seconds=([\d.]+)", log))
        assert "attest" in steps, f"no attest step logged for {name}"
        CLOUD_JOIN[f"azure {name}"] = {k: steps[k] for k in ("launch", "boot", "attest", "ssh",
                                                             "slurmd") if k in steps}  # fmt: skip
    _release(env, lab, store, list(NODES), ids, vm_ids)
    from slurm_burst.wiring import ledger

    def priced() -> list[dict[str, Any]]:
        rows = ledger.ledger(cfg).instances()
        return [r for r in rows if r["instance_id"] in ids and r["terminated"]]

    wait(lambda: len(priced()) == 2, 60, "both Azure VMs in the ledger")
    for row in priced():
        assert (row["provider"], row["size"]) == ("azure", "Standard_D2s_v5"), row
        assert row["price_per_hour"] == pytest.approx(PRICE) and row["cost"] > 0, row


def test_a_job_runs_on_azure_vms_of_one_scale_out_attested_by_boot_diagnostics_and_joined(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    job_on_azure(lab, lab_config, env, store)


def test_a_job_runs_on_azure_vms_on_a_newer_release(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The same on a newer release (its VMs boot that release's image): the 24.11
    share's (Makefile), left out of the host's run."""
    job_on_azure(lab, lab_config, env, store)


WIDE = [f"burst-azx-{i}" for i in range(1, 17)]
LIMITS = 0.02  # ARM's buckets at a fiftieth: 5 reads (0.5 a second), 4 writes, 4 deletes


@pytest.mark.full  # 1 min: make test-full only (docs/testing.md, the time budget)
def test_16_azure_vms_join_and_run_their_job_while_the_emulator_throttles(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """ARM's buckets scaled down in the emulator so that the daemon's requests are
    answered 429 with Retry-After: 16 VMs in one scale-out, each attested and joined,
    the job runs on all 16, and no node fails: a throttle is waited out, it is no
    launch failure. The daemon is not told the smaller buckets (what is left comes in
    every answer's headers). Throttling is off again before the release."""
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    before = emulator(lab_config, "calls")["calls"]
    emulator(lab_config, f"limits?factor={LIMITS}")
    began = time.monotonic()
    try:
        srun = subprocess.run(
            ["srun", "-p", "burst-azx", "-N16", "-t", "5", "hostname", "-I"],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        seen = emulator(lab_config, "calls")
    finally:
        emulator(lab_config, "limits?factor=1")
    took = time.monotonic() - began
    assert srun.returncode == 0, srun.stderr[-3000:]
    assert len([x for x in srun.stdout.splitlines() if x.strip()]) == 16, srun.stdout
    recs = [store.node(n) for n in WIDE]
    assert all(r is not None and r.instance_id and not r.error for r in recs), recs
    made = {m: n - before.get(m, 0) for m, n in seen["calls"].items()}
    CLOUD_JOIN["azure burst-azx-[1-16]"] = {
        "srun_s": f"{took:.1f}", "throttled": json.dumps(seen["throttled"]),
        **{m: str(n) for m, n in made.items() if n},
    }  # fmt: skip
    assert sum(seen["throttled"].values()) > 0, f"the emulator never throttled: {seen}"
    assert made.get("vmss.put") == 1, made  # one scale-out
    bad = [e for e in store.events(since_id=start, limit=10**6)
           if e["event"] in ("node.replaced", "node.released", "size.unavailable")]  # fmt: skip
    assert not bad, bad
    ids = {r.instance_id for r in recs if r}
    vms = {v["name"]: v["vmId"] for v in emulator(lab_config, "vms")["vms"]}
    _release(env, lab, store, WIDE, ids, {vms[i] for i in ids if i in vms})


SPOTS = [f"burst-azspot-{i}" for i in range(1, 5)]


def _thaw_spot(store: Store) -> None:
    thaw_spot(store, "azure", "Standard_D2s_v5")


def _srun_with_spot(
    cfg: Config, env: dict[str, str], mode: str, count: int
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    return srun_with_spot(
        lambda what: emulator(cfg, what), env, "burst-azspot", mode, count, "SkuNotAvailable"
    )


def _vm_ids(cfg: Config, ids: set[str]) -> set[str]:
    vms = {v["name"]: v["vmId"] for v in emulator(cfg, "vms")["vms"]}
    return {vms[i] for i in ids if i in vms}


def test_spot_refused_runs_a_4_node_job_on_demand_in_one_proximity_placement_group(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The emulator refuses Spot capacity (``SkuNotAvailable``): the job's four nodes
    launch at once on the fallback group's on-demand Standard_D2s_v5, in one scale-out
    of the job's own set in the proximity placement group made for the job; the events
    say why; once the nodes are released the job's sets and its group are deleted."""
    from slurm_burst.adapters.cloud.providers.azure_arm import sets

    _thaw_spot(store)
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    before = emulator(lab_config, "calls")["calls"]
    srun, market = _srun_with_spot(lab_config, env, "refuse", 4)
    assert srun.returncode == 0, srun.stderr[-3000:]
    assert len([x for x in srun.stdout.splitlines() if x.strip()]) == 4, srun.stdout
    recs = [store.node(n) for n in SPOTS]
    assert all(r is not None and (r.market, r.size) == ("", "Standard_D2s_v5") for r in recs)
    (placed,) = {r.placement for r in recs if r is not None}
    group = market["ppgs"][sets.ppg_name(placed)]
    ids = {r.instance_id for r in recs if r is not None}
    assert group["vms"] == sorted(ids) and sets.job_set(placed) in group["sets"], group
    calls = emulator(lab_config, "calls")["calls"]
    made = {m: calls.get(m, 0) - before.get(m, 0) for m in calls}
    # Spot refused, then on-demand into the job's group: two scale-outs, one group
    assert made.get("vmss.put") == 2 and made.get("ppg.put") == 1, made
    fell = {e["node"] for e in store.events(since_id=start, limit=10**6)
            if e["event"] == "spot.fallback"}  # fmt: skip
    assert fell == set(SPOTS)
    _release(env, lab, store, SPOTS, ids, _vm_ids(lab_config, ids))
    wait(lambda: sets.ppg_name(placed) not in emulator(lab_config, "market")["ppgs"], 120,
         "the job's proximity placement group deleted")  # fmt: skip
    after = emulator(lab_config, "calls")["calls"]
    spent = {m: after.get(m, 0) - before.get(m, 0) for m in after
             if m.startswith(("ppg.", "vmss.delete"))}  # fmt: skip
    assert spent.get("ppg.delete") == 1 and spent.get("vmss.delete") == 2, spent
    CLOUD_JOIN["azure spot refused -> on-demand, proximity"] = {
        "placement_calls": json.dumps(spent),
        "scale_outs": str(made.get("vmss.put")),
    }


def test_spot_withheld_falls_back_after_the_wait_and_the_job_runs(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The emulator makes the Spot VMs and never allocates them (Creating for good): after
    the group's spot_fallback_after (15 s) the launch gives them up, deletes each, and the
    job's nodes launch on-demand together; the job runs, no node fails."""
    _thaw_spot(store)
    nodes = SPOTS[:2]
    took, recs, _ = withheld_falls_back(lambda what: emulator(lab_config, what), env, store,
                                        "burst-azspot", nodes)  # fmt: skip
    CLOUD_JOIN["azure spot withheld -> on-demand, job ran"] = {"srun_s": f"{took:.1f}"}
    ids = {r.instance_id for r in recs}
    _release(env, lab, store, nodes, ids, _vm_ids(lab_config, ids))


@pytest.mark.full  # 1.8 min: make test-full only (docs/testing.md, the time budget)
def test_an_eviction_signals_the_job_which_is_requeued_and_completes_on_a_replacement(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The emulator schedules a ``Preempt`` on the job's Spot VM: its metadata service
    says so inside the VM, the node's agent (polling it every second) tells the daemon,
    the job's batch shell gets the USR1 it asked for within seconds, the job is requeued
    before the VM is deleted (by the daemon after the requeue, or by Azure at the event's
    NotBefore, 30 s after the notice) and runs again on a replacement (on-demand: the Spot size
    cooled down), and the ledger records the reclaim as ``SpotEviction``."""
    from slurm_burst.core.records import NodeRecord
    from tests.lab.reclaim import reclaimed_job_runs_again

    _thaw_spot(store)

    def evict(rec: NodeRecord) -> object:
        return emulator(lab_config, f"event?vm={rec.instance_id}&type=Preempt&in=30")

    took, again, events = reclaimed_job_runs_again(lab, lab_config, env, store, "burst-azspot",
                                                   evict, "SpotEviction")  # fmt: skip
    assert any("SpotEviction" in e["detail"] for e in events if e["event"] == "spot.interruption")
    # the evicted VM is gone: deleted by the daemon's teardown after the requeue (it comes
    # before the agent's acknowledgement, due once the jobs have had time to leave, and
    # before NotBefore; the acknowledgement is test_azure_spot's)
    reclaimed = {e["detail"] for e in events if e["event"] == "spot.interruption"}
    market = emulator(lab_config, "market")
    assert not any(vm in d for d in reclaimed for vm in market["live"]), (reclaimed, market)
    CLOUD_JOIN["azure eviction -> USR1"] = {"seconds": f"{took:.2f}"}
    ids = {again.instance_id}
    _release(env, lab, store, [again.name], ids, _vm_ids(lab_config, ids))
