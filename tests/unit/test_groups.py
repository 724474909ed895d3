"""Protected mode and its end: our drain lifted, node by node where scontrol refuses a
batch for one node caught mid-transition."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_burst.services.groups import GroupControl
from tests.conftest import lab_config_in
from tests.fakes.slurm import FakeScheduler
from tests.fakes.store import MemoryStore


def test_enable_undrains_one_by_one_when_a_batch_is_refused(tmp_path: Path) -> None:
    cfg = lab_config_in(tmp_path)
    names = cfg.node_groups["cpu"].node_names()
    slurm = FakeScheduler.cloud_nodes(names, "burst-cpu")
    groups = GroupControl(
        cfg.node_groups, MemoryStore(), slurm, protect_cooldown=cfg.daemon.protect_cooldown
    )
    groups.protect("cpu", "3 failed launches", 0.0)
    assert all("DRAIN" in slurm.node(n).flags for n in names)

    def refuse(nodes: Sequence[str], change: dict[str, Any]) -> str | None:
        stuck = change["state"] == "resume" and names[3] in nodes
        return "slurm_update error: Invalid node state specified" if stuck else None

    slurm.refuse = refuse
    undrained = groups.enable("cpu")
    assert undrained == [n for n in names if n != names[3]]
    assert "DRAIN" in slurm.node(names[3]).flags
    assert not any("DRAIN" in slurm.node(n).flags for n in undrained)
