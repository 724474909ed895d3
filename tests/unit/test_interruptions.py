"""Interruption notices: what a notice says, which signal a job asked for, and what the
daemon does with a notice (signal now, requeue before the reclaim, replace the node), on
fakes. The lab raises a real notice on an EC2 VM (tests/lab/test_x_ec2.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.core.cloud import CapacityError
from slurm_burst.core.interruption import (
    Declared,
    Notice,
    declared_signal,
    parse_notice,
    requeue_at,
)
from slurm_burst.core.mesh import Refused
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import NodeRecord
from slurm_burst.core.slurm import SlurmJob
from slurm_burst.services.interruptions import InterruptionPorts, Interruptions
from slurm_burst.services.nodeapi import NodeApi, NodeApiSettings
from tests.conftest import lab_config_in, wait
from tests.fakes.clock import FakeClock
from tests.fakes.slurm import FakeScheduler
from tests.fakes.store import MemoryStore

pytestmark = pytest.mark.unit

NOW = 1_790_000_000.0


@pytest.mark.parametrize(
    ("script", "want"),
    [
        ("#!/bin/sh\n#SBATCH --signal=B:USR1@120\nsrun app\n", Declared("USR1", True)),
        ("#!/bin/bash\n#SBATCH -N2\n#SBATCH --signal=SIGUSR2\n", Declared("USR2", False)),
        ("#!/bin/sh\n#SBATCH --signal 10@30\n", Declared("10", False)),
        ("#!/bin/sh\n#SBATCH --signal=R:TERM@60\n", Declared("TERM", False)),
        ("#!/bin/sh\necho hi\n#SBATCH --signal=USR1\n", None),  # after a command: not read
        ("#!/bin/sh\n#SBATCH --signal=usr1@60\n", Declared("USR1", False)),
        ("#!/bin/sh\n#SBATCH --signal=99\n", None),
        ("#!/bin/sh\n#SBATCH --signal=B:$(reboot)\n", None),
        ("", None),
        ("#!/bin/sh\n# --signal=USR1 in a comment\nsrun app\n", None),
    ],
    ids=["batch-only", "name-with-sig", "number-space", "reservation-flag", "after-command",
         "lower-case", "no-such-signal", "injection", "no-script", "plain-comment"],
)  # fmt: skip
def test_the_signal_a_job_asked_for_is_read_from_its_script(
    script: str, want: Declared | None
) -> None:
    assert declared_signal(script) == want


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"action": "terminate", "time": "2026-11-27T15:00:00Z"}, ""),
        ({"action": "reboot", "time": "2026-11-27T15:00:00Z"}, "action"),
        ({"action": "stop", "time": "soon"}, "ISO 8601"),
        ({"action": "stop", "time": 5}, "ISO 8601"),
        (["terminate"], "JSON object"),
        ({"action": ["preempted"], "time": "2026-11-27T15:00:00Z"}, "action"),
        ({"action": {"a": 1}}, "action"),
    ],
    ids=["ec2", "bad-action", "bad-time", "number-time", "a-list", "action-a-list",
         "action-an-object"],
)  # fmt: skip
def test_a_notice_is_checked(body: object, error: str) -> None:
    if error:
        with pytest.raises(ValueError, match=error):
            parse_notice(body, NOW)
        return
    notice = parse_notice(body, NOW)
    assert notice.action == "terminate" and NOW <= notice.at <= NOW + 86_400
    assert notice.code == "SpotInterruption" and notice.capacity


@pytest.mark.parametrize(
    ("body", "code", "capacity"),
    [({"action": "preempted"}, "Preempted", True),
     ({"action": "maintenance"}, "HostMaintenance", False),
     # a time the node gives is not taken: its clock is less trusted than ours
     ({"action": "preempted", "time": "2099-01-01T00:00:00Z"}, "Preempted", True)],
    ids=["preempted", "maintenance", "a-nodes-own-time"],
)  # fmt: skip
def test_a_gce_notice_comes_30_s_after_the_daemon_hears_with_its_code(
    body: object, code: str, capacity: bool
) -> None:
    notice = parse_notice(body, NOW)
    assert (notice.at, notice.code, notice.capacity) == (NOW + 30, code, capacity)


def _rfc1123(at: float) -> str:
    from email.utils import formatdate

    return formatdate(at, usegmt=True)


@pytest.mark.parametrize(
    ("body", "at", "code", "capacity"),
    [({"action": "Preempt", "time": _rfc1123(NOW + 30)}, NOW + 30, "SpotEviction", True),
     ({"action": "Preempt", "time": ""}, NOW, "SpotEviction", True),  # started: now
     ({"action": "Terminate", "time": _rfc1123(NOW + 600)}, NOW + 600, "Terminated", False),
     ({"action": "Reboot", "time": _rfc1123(NOW + 900)}, NOW + 900, "HostMaintenance", False),
     ({"action": "Redeploy", "time": _rfc1123(NOW - 50)}, NOW, "HostMaintenance", False),
     ({"action": "Preempt", "time": _rfc1123(NOW + 10 * 86_400)}, NOW + 86_400,
      "SpotEviction", True)],
    ids=["preempt", "started", "terminate", "reboot", "past-clamped", "far-clamped"],
)  # fmt: skip
def test_an_azure_event_comes_at_its_not_before_within_a_day_with_its_code(
    body: object, at: float, code: str, capacity: bool
) -> None:
    notice = parse_notice(body, NOW)
    assert (round(notice.at), notice.code, notice.capacity) == (round(at), code, capacity)


@pytest.mark.parametrize(
    "body",
    [{"action": "Preempt", "time": "tomorrow"}, {"action": "Preempt", "time": 30},
     {"action": "Preempt", "time": "x" * 41}, {"action": "Freeze", "time": ""},
     {"action": "preempt", "time": ""}],
    ids=["words", "a-number", "too-long", "freeze", "lower-case"],
)  # fmt: skip
def test_a_bad_azure_event_is_refused_with_what_is_wrong(body: object) -> None:
    with pytest.raises(ValueError, match=r"time|action"):
        parse_notice(body, NOW)


def test_a_maintenance_notice_replaces_the_node_without_cooling_the_spot_size() -> None:
    store = MemoryStore()
    rec = spot_node(store)
    slurm = FakeScheduler(jobs=[SlurmJob(9, "quick", "RUNNING", "burst-spot", nodes=rec.name)])
    cooled: list[str] = []
    failed: list[tuple[str, str]] = []

    def fail(node: str, code: str, message: str) -> bool:
        failed.append((node, code))
        return True

    clock = FakeClock(time.time())
    service = Interruptions(InterruptionPorts(
        store=store, jobs=slurm, clock=clock, cool=lambda r, exc: cooled.append(exc.code),
        fail=fail, submit=lambda node: None,
    ))  # fmt: skip
    service.notice(rec, parse_notice({"action": "maintenance"}, clock.now()))
    wait(lambda: failed, 10, "the node failed")
    assert cooled == [] and failed == [(rec.name, "HostMaintenance")] and slurm.requeued == [9]
    service.close()


def test_a_signalled_job_is_requeued_before_the_reclaim_and_another_at_once() -> None:
    notice = Notice("terminate", NOW + 120)
    assert requeue_at(notice, True, NOW) == NOW + 110
    assert requeue_at(notice, False, NOW) == NOW
    assert requeue_at(Notice("terminate", NOW + 5), True, NOW) == NOW  # already too late


def spot_node(store: MemoryStore, name: str = "burst-spot-1") -> NodeRecord:
    store.transition(name, NodeState.REQUESTED, NOW, group="ec2spot", want=Want.UP)
    for s in (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.BOOTSTRAPPING, NodeState.JOINED):
        store.transition(name, s, NOW)
    store.update(name, provider="aws", size="t3.micro", market="spot", instance_id="i-1")
    addr = store.allocate_address(name, "10.77.0.0/24", NOW)
    store.update(name, mesh_addr=addr)
    rec = store.node(name)
    assert rec is not None
    return rec


def test_a_notice_signals_the_jobs_requeues_them_and_replaces_the_node(tmp_path: Path) -> None:
    store = MemoryStore()
    rec = spot_node(store)
    slurm = FakeScheduler(jobs=[
        SlurmJob(7, "train", "RUNNING", "burst-spot", nodes="burst-spot-[1-4]"),
        SlurmJob(8, "other", "RUNNING", "burst-spot", nodes="burst-spot-[5-6]"),
        SlurmJob(9, "quick", "RUNNING", "burst-spot", nodes="burst-spot-1"),
    ])  # fmt: skip
    slurm.scripts[7] = "#!/bin/sh\n#SBATCH --signal=B:USR1@60\nsrun train\n"
    cooled: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    submitted: list[str] = []

    def cool(r: NodeRecord, exc: CapacityError) -> None:
        cooled.append((r.name, exc.code))

    def fail(node: str, code: str, message: str) -> bool:
        failed.append((node, code))
        return True

    synced: list[tuple[list[int], float, list[int]]] = []

    def sync_outputs(jobs: list[int], budget: float) -> list[int]:
        synced.append((jobs, budget, list(slurm.requeued)))  # what was requeued by then
        return [7]

    clock = FakeClock(time.time())
    service = Interruptions(
        InterruptionPorts(store=store, jobs=slurm, clock=clock, cool=cool, fail=fail,
                          submit=submitted.append, sync_outputs=sync_outputs)
    )  # fmt: skip
    said = service.notice(rec, Notice("terminate", clock.now() + 10.5))
    assert said["jobs"] == [7, 9] and said["signalled"] == [7]
    assert slurm.signals == [(7, "USR1", True)]  # at once, as the job asked; 9 asked none
    assert cooled == [("burst-spot-1", "SpotInterruption")]
    events = [e["event"] for e in store.events()]
    assert "spot.interruption" in events and "job.signalled" in events
    assert service.notice(rec, Notice("terminate", clock.now() + 10.5)) == {"known": True}
    # the requeue waits until shortly before the reclaim (10 s before: 0.5 s here)
    assert slurm.requeued == []
    wait(lambda: slurm.requeued, 10, "the requeue")
    assert slurm.requeued == [7, 9] and failed == [("burst-spot-1", "SpotInterruption")]
    assert submitted == ["burst-spot-1"]
    # the outputs were synced a last time first, until 2 s before the reclaim
    assert synced == [([7, 9], 8.5, [])], synced
    assert "output.synced_on_notice" in [e["event"] for e in store.events()]
    service.close()


def test_the_node_api_hands_a_live_nodes_notice_on_and_refuses_others(tmp_path: Path) -> None:
    cfg = lab_config_in(tmp_path)
    store = MemoryStore()
    rec = spot_node(store)
    api = NodeApi(NodeApiSettings(cfg.fleet, "10.77.0.0/24"), store, FakeClock())
    with pytest.raises(Refused) as no_handler:
        api.notice(rec.mesh_addr, b"{}")
    assert no_handler.value.status == 404
    told: list[tuple[str, Notice]] = []

    def noticed(r: NodeRecord, n: Notice) -> dict[str, Any]:
        told.append((r.name, n))
        return {"ok": True}

    api.noticed = noticed
    body = json.dumps({"action": "terminate", "time": "2099-01-01T00:00:00Z"}).encode()
    assert api.notice(rec.mesh_addr, body) == {"ok": True}
    assert told and told[0][0] == "burst-spot-1"
    for source, bad, status in [("10.77.0.99", body, 403), (rec.mesh_addr, b"\xff\x00", 400),
                                (rec.mesh_addr, b'{"action": "x", "time": "y"}', 400)]:  # fmt: skip
        with pytest.raises(Refused) as caught:
            api.notice(source, bad)
        assert caught.value.status == status
