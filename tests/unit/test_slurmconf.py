"""`conf render`: the fragment and gres.conf follow the config."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_burst.config import load_config
from slurm_burst.core.slurm import release_of
from slurm_burst.services.slurmconf import render
from tests.conftest import invoke
from tests.unit.test_config import GOOD, write


def test_render_from_config(tmp_path: Path) -> None:
    files = render(load_config(write(tmp_path, GOOD)), "22.05")
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


def test_each_release_gets_what_it_accepts(tmp_path: Path) -> None:
    """22.05 needs cloud_reg_addrs and NoAddrCache; 24.11 and 26.05 call both defunct
    (an error: line at every start, seen in tests/lab/test_slurm_versions.py)."""
    cfg = load_config(write(tmp_path, GOOD))
    old = render(cfg, "22.05")["slurm-burst.conf"]
    assert "CommunicationParameters=NoAddrCache" in old and "cloud_reg_addrs," in old
    for release in ("24.11", "26.05"):
        frag = render(cfg, release)["slurm-burst.conf"]
        settings = [ln for ln in frag.splitlines() if not ln.startswith("#")]
        assert not [ln for ln in settings if "NoAddrCache" in ln or "cloud_reg_addrs" in ln]
        assert (
            "SlurmctldParameters=enable_configless,idle_on_node_suspend,power_save_interval="
            in frag
        )
        assert f"# For Slurm {release}." in frag
        assert "PrologSlurmctld=/usr/local/bin/slurm-burst-prolog-slurmctld" in frag


@pytest.mark.parametrize(
    ("text", "release"),
    [("slurm-wlm 24.11.5\n", "24.11"), ("slurm 22.05.8", "22.05"), ("26.05", "26.05")],
)
def test_release_of_a_version_line(text: str, release: str) -> None:
    assert release_of(text) == release


def test_an_unsupported_release_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Slurm 23\.02 is not one slurm-burst supports"):
        render(load_config(write(tmp_path, GOOD)), "23.02")
    out = invoke(["--config", str(write(tmp_path, GOOD)), "conf", "render", "--slurm-release",
                  "21.08"], expect=2)  # fmt: skip
    assert "21.08" in out.stderr


@pytest.mark.parametrize(
    ("ctld", "slurmd", "problem"),
    [
        ("22.05", "22.05", None),
        ("22.05", "21.08", None),
        ("22.05", "20.11", None),  # two behind: 22.05's window
        ("22.05", "20.02", "3 major releases behind slurmctld 22.05; Slurm 22.05 accepts 2"),
        ("22.05", "24.11", "newer than slurmctld 22.05"),
        ("24.11", "23.11", None),
        ("24.11", "23.02", None),  # three behind: 24.11's window
        ("26.05", "24.11", None),
        ("26.05", "22.05", "7 major releases behind"),
        ("26.05", "26.11", "newer than slurmctld 26.05"),  # a release the table lacks
    ],
)
def test_mixed_version_window(ctld: str, slurmd: str, problem: str | None) -> None:
    from slurm_burst.core.slurm import mixed_version_problem

    said = mixed_version_problem(ctld, slurmd)
    assert (said is None) if problem is None else (said is not None and problem in said)


def test_health_check_program_only_when_the_gpu_check_is_it(tmp_path: Path) -> None:
    plain = render(load_config(write(tmp_path, GOOD)), "22.05")["slurm-burst.conf"]
    assert "\nHealthCheckProgram=" not in plain and "HealthCheckProgram: the site's own" in plain
    cfg = load_config(
        write(
            tmp_path,
            GOOD + '[gpu]\nhealth_check_program = "/etc/slurm-burst/health-check"\n'
            'health_check_chain = "/usr/sbin/nhc"\nhealth_check_interval = 120\n',
        )
    )
    lines = render(cfg, "24.11")["slurm-burst.conf"].splitlines()
    assert "HealthCheckProgram=/etc/slurm-burst/health-check" in lines
    assert "HealthCheckInterval=120" in lines and "HealthCheckNodeState=ANY" in lines
    assert any("/usr/sbin/nhc runs first there" in ln for ln in lines)
    gres = render(cfg, "24.11")["gres.conf"]
    assert "NodeName=gpu-[01-03] Name=gpu Type=a10g File=/dev/nvidia0" in gres


def test_onprem_only_accounts_and_qos_are_denied_every_burst_partition(tmp_path: Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            GOOD + "[policy.accounts.medgen]\nonprem_only = true\n"
            "[policy.accounts.physics]\nwait_factor = 2\n"
            "[policy.qos.hipaa]\nonprem_only = true\n",
        )
    )
    (line,) = [ln for ln in render(cfg, "22.05")["slurm-burst.conf"].splitlines()
               if ln.startswith("PartitionName=burst-gpu")]  # fmt: skip
    assert line.endswith(" DenyAccounts=medgen DenyQos=hipaa")
    plain = render(load_config(write(tmp_path, GOOD)), "22.05")["slurm-burst.conf"]
    assert "DenyAccounts" not in plain and "DenyQos" not in plain
