"""The shipped systemd units (the daemon's; stage gc's, with its timer): systemd itself
parses them (``systemd-analyze verify``), their exposure scores stay low
(``systemd-analyze security``), and every capability the daemon keeps is explained
next to it; stage gc keeps none. Starting it needs a booted systemd, which this machine has
not; the lab runs the same daemon without the unit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

SYSTEMD = ROOT / "slurm-conf" / "systemd"
UNIT = SYSTEMD / "slurm-burst.service"
GC = SYSTEMD / "slurm-burst-stage-gc.service"
SERVICES = pytest.mark.parametrize("unit", [UNIT, GC], ids=lambda u: u.stem)
analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(analyze is None, reason="systemd-analyze is not installed")


def _copy(tmp_path: Path, unit: Path = UNIT) -> Path:
    """The unit with an ExecStart that exists here (verify checks it is executable)."""
    text = unit.read_text().replace("/opt/slurm-burst/bin/slurm-burst", shutil.which("true") or "")
    path = tmp_path / unit.name
    path.write_text(text)
    return path


@needs_analyze
@SERVICES
def test_systemd_parses_the_unit(tmp_path: Path, unit: Path) -> None:
    out = subprocess.run(
        [str(analyze), "verify", str(_copy(tmp_path, unit))], capture_output=True, text=True
    )
    assert out.returncode == 0 and unit.name not in out.stderr, out.stderr


@needs_analyze
def test_systemd_parses_the_gc_timer_with_its_service(tmp_path: Path) -> None:
    _copy(tmp_path, GC)
    timer = tmp_path / "slurm-burst-stage-gc.timer"
    timer.write_text((SYSTEMD / timer.name).read_text())
    out = subprocess.run([str(analyze), "verify", str(timer)], capture_output=True, text=True)
    assert out.returncode == 0 and "slurm-burst-stage-gc" not in out.stderr, out.stderr


def test_the_gc_unit_runs_a_command_the_cli_takes() -> None:
    from click.testing import CliRunner

    from slurm_burst.cli.main import cli

    line = re.search(r"^ExecStart=(\S+) (.*)$", GC.read_text(), re.M)
    daemons = re.search(r"^ExecStart=(\S+)", UNIT.read_text(), re.M)
    assert line and daemons and line.group(1) == daemons.group(1)  # the same install
    args = line.group(2).split()
    assert args[:2] == ["--config", "/etc/slurm-burst/slurm-burst.toml"]
    out = CliRunner().invoke(cli, [*args[2:], "--help"])
    assert out.exit_code == 0 and "book in the ledger" in out.output, out.output


@needs_analyze
@SERVICES
def test_the_units_exposure_is_low(tmp_path: Path, unit: Path) -> None:
    command = [str(analyze), "security", "--offline=yes", "--threshold=35"]
    out = subprocess.run(
        [*command, str(_copy(tmp_path, unit))],
        capture_output=True,
        text=True,
    )
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout)
    assert level, out.stdout[-2000:] + out.stderr
    assert out.returncode == 0, f"exposure {level.group(1)} over 3.5"


def test_every_capability_kept_says_why() -> None:
    text = UNIT.read_text()
    kept = re.search(r"^CapabilityBoundingSet=(.*)$", text, re.M)
    assert kept and kept.group(1).split(), "the unit must bound its capabilities"
    for cap in kept.group(1).split():
        assert re.search(rf"^# {cap}\s+\S", text, re.M), f"{cap} is kept without a reason"
    for directive in ("NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes"):
        assert f"\n{directive}\n" in text
