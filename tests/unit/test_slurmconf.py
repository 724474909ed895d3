"""`conf render`: the fragment and gres.conf follow the config."""

from __future__ import annotations

from pathlib import Path

from slurm_burst.config import load_config
from slurm_burst.services.slurmconf import render
from tests.conftest import invoke
from tests.unit.test_config import GOOD, write


def test_render_from_config(tmp_path: Path) -> None:
    files = render(load_config(write(tmp_path, GOOD)))
    frag = files["slurm-burst.conf"]
    assert (
        "NodeName=gpu-[01-03] State=CLOUD CPUs=4 RealMemory=15000 Gres=gpu:a10g:1"
        in frag.splitlines()
    )
    assert "SuspendExcParts=batch" in frag
    assert "ResumeProgram=/usr/local/bin/slurm-burst-resume" in frag
    assert "SlurmctldParameters=enable_configless,idle_on_node_suspend,cloud_reg_addrs" in frag
    part = next(ln for ln in frag.splitlines() if ln.startswith("PartitionName=burst-gpu"))
    assert "Nodes=gpu-[01-03]" in part and "SuspendTime=600" in part
    assert "NodeName=gpu-[01-03] Name=gpu Type=a10g File=/dev/nvidia0" in files["gres.conf"]
    assert "$" not in frag  # every template placeholder was filled


def test_render_writes_files(tmp_path: Path) -> None:
    cfg = write(tmp_path, GOOD)
    out = tmp_path / "etc"
    invoke(["--config", str(cfg), "conf", "render", "-o", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["gres.conf", "slurm-burst.conf"]
