"""What Slurm is told of a burst node's instance: on 23.11+ slurmd's own flags
(``--instance-id``, ``--instance-type``, ``--extra`` with the provider, region, market,
group and price), so ``scontrol show node`` and ``sacctmgr show instance`` name it;
before 23.11 the node's comment, cleared with the instance."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_burst.core.nodestate import NodeState, Want
from tests.fakes.world import make_world

N = "burst-cpu-1"


def test_on_2411_slurmd_is_started_with_the_instance_and_no_comment_is_set(
    tmp_path: Path,
) -> None:
    w = make_world(tmp_path, slurm_release="24.11")
    w.request(N)
    rec = w.prov.drive(N)
    assert rec is not None and rec.state == NodeState.JOINED
    node = next(iter(w.connector.nodes.values()))
    start = next(a for a in node.ran if a[2:3] == ["slurmd-start"])
    assert start[3:7] == [N, "10.77.0.1", "--instance-id", rec.instance_id]
    assert start[7:9] == ["--instance-type", "ns.cpu2"] and start[9] == "--extra"
    assert json.loads(start[10]) == {"slurm_burst": {
        "provider": "lab", "region": w.cfg.providers["lab"].region, "market": "on-demand",
        "group": "cpu", "price_per_hour": 0.085,
    }}  # fmt: skip
    assert not [u for u in w.slurm.updates if u.get("comment")]
    [said] = [u for u in w.slurm.updates if u.get("instance")]  # before slurmd starts
    assert said["instance"] == (rec.instance_id, "ns.cpu2", start[10])
    assert said["nodes"] == [N] and said["state"] is None and said["addrs"] is None


def test_on_2205_the_instance_is_in_the_comment_until_it_is_released(tmp_path: Path) -> None:
    w = make_world(tmp_path)
    w.request(N)
    rec = w.prov.drive(N)
    assert rec is not None and rec.state == NodeState.JOINED
    node = next(iter(w.connector.nodes.values()))
    start = next(a for a in node.ran if a[2:3] == ["slurmd-start"])
    assert start[3:] == [N, "10.77.0.1"]  # 22.05's slurmd has no such flags
    region = w.cfg.providers["lab"].region
    where = f"lab/{region}" if region else "lab"
    said = [u["comment"] for u in w.slurm.updates if u.get("comment")]
    assert said == [f"slurm-burst: instance {rec.instance_id} ns.cpu2 {where} on-demand"]
    w.store.update(N, want=Want.DOWN)
    w.prov.drive(N)
    assert [u for u in w.slurm.updates if N in u["nodes"]][-1].get("comment") == ""


def test_a_refused_instance_update_fails_no_join(tmp_path: Path) -> None:
    w = make_world(tmp_path, slurm_release="24.11")

    def refuse(names: object, change: dict[str, object]) -> str | None:
        return None if any(change.values()) else "Invalid instance id"

    w.slurm.refuse = refuse
    w.request(N)
    rec = w.prov.drive(N)
    assert rec is not None and rec.state == NodeState.JOINED
    assert [u for u in w.slurm.updates if u.get("instance")]  # asked, refused, said
