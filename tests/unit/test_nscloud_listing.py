"""The namespace cloud forgets terminated instances, as EC2 does after about an hour:
a listing must not grow with every VM the lab ever made (the soak's memory figure)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from slurm_burst_lab.nscloud.driver import NamespaceNodeDriver


def vm(state_dir: Path, vm_id: str, state: str, terminated_at: float | None = None) -> None:
    d = state_dir / "vms" / vm_id
    d.mkdir(parents=True)
    meta: dict[str, Any] = {
        "id": vm_id,
        "name": vm_id,
        "size": "ns.cpu2",
        "image": "host",
        "state": state,
        "ip": "10.0.0.9",
        "token": None,
        "tags": {},
        "created_at": 0,
        "region": "r",
    }
    if terminated_at is not None:
        meta["terminated_at"] = terminated_at
    (d / "meta.json").write_text(json.dumps(meta))


def test_terminated_instances_are_listed_until_forget_after_then_gone(tmp_path: Path) -> None:
    now = time.time()
    vm(tmp_path, "ns-old", "terminated", now - 600)
    vm(tmp_path, "ns-recent", "terminated", now - 5)
    vm(tmp_path, "ns-pending", "pending")
    driver = NamespaceNodeDriver(state_dir=str(tmp_path), forget_after=60)
    listed = {n.id: n.state for n in driver.list_nodes()}
    assert set(listed) == {"ns-recent", "ns-pending"}
    assert str(listed["ns-recent"]) == "terminated"
    assert not (tmp_path / "vms" / "ns-old").exists()
    assert (tmp_path / "vms" / "ns-pending" / "meta.json").exists()
