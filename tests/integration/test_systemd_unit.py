"""The daemon's systemd unit: systemd itself parses it (``systemd-analyze verify``), its
exposure score stays low (``systemd-analyze security``), and every capability it keeps
is explained next to it. Starting it needs a booted systemd, which this machine has
not; the lab runs the same daemon without the unit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

UNIT = ROOT / "slurm-conf" / "systemd" / "slurm-burst.service"
analyze = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(analyze is None, reason="systemd-analyze is not installed")


def _copy(tmp_path: Path) -> Path:
    """The unit with an ExecStart that exists here (verify checks it is executable)."""
    text = UNIT.read_text().replace("/opt/slurm-burst/bin/slurm-burst", shutil.which("true") or "")
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


@needs_analyze
def test_systemd_parses_the_unit(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(analyze), "verify", str(_copy(tmp_path))], capture_output=True, text=True
    )
    assert out.returncode == 0 and "slurm-burst.service" not in out.stderr, out.stderr


@needs_analyze
def test_the_units_exposure_is_low(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(analyze), "security", "--offline=yes", "--threshold=35", str(_copy(tmp_path))],
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
