"""The product without its test bed: ``pip wheel .`` holds no lab module, and that wheel,
installed where the lab is not, checks a real config (and refuses the lab's, naming why).

The install is a fresh virtual environment with the product's wheel unpacked into its
site-packages and this venv's third-party packages beside it (never the lab's, nor the
editable finders of this checkout): no index is needed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))
OURS = ("slurm_burst", "_slurm_burst", "__editable__", "slurm-burst")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "--wheel-dir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return next(out.glob("slurm_burst-*.whl"))


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the product wheel and its dependencies, and no lab."""
    venv = tmp_path_factory.mktemp("alone") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    deps = venv / "deps"
    deps.mkdir()
    for entry in SITE.iterdir():
        name = entry.name.lower().replace("-", "_")
        if entry.suffix != ".pth" and not name.startswith(OURS):
            (deps / entry.name).symlink_to(entry)
    (site / "deps.pth").write_text(f"{deps}\n")
    return venv / "bin" / "python"


def test_the_wheel_holds_the_product_and_no_lab(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "slurm_burst/extensions.py" in names and "slurm_burst/wiring/daemon.py" in names
    lab = [n for n in names if "lab" in n.split("/")[0] or "nscloud" in n or "simnvml" in n]
    assert lab == []
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "slurm_burst.plugins" not in zipfile.ZipFile(wheel).read(entry_points).decode()


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SLURM_BURST"))}
    return subprocess.run(
        [str(python), "-m", "slurm_burst", *args],
        capture_output=True, text=True, timeout=120, env=env, cwd="/",
    )  # fmt: skip


def test_the_product_alone_checks_a_real_config(python: Path) -> None:
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u, slurm_burst; "
         "print(slurm_burst.__file__, u.find_spec('slurm_burst_lab'))"],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert "site-packages/slurm_burst/__init__.py None" in probe.stdout
    out = run(python, "--config", str(ROOT / "slurm-conf/example/slurm-burst.toml"),
              "config", "check")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout
    commands = run(python, "--help").stdout.split("Commands:")[1]
    assert re.findall(r"^  (\S+)", commands, re.M)[:3] == ["budget", "conf", "config"]
    assert not re.search(r"^  lab ", commands, re.M)


def test_the_product_alone_refuses_the_labs_config_and_says_why(python: Path) -> None:
    out = run(python, "--config", str(ROOT / "slurm-conf/lab/slurm-burst.toml"),
              "config", "check")  # fmt: skip
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "error: lab: unknown key" in text
    assert "providers.lab.driver: libcloud has no compute driver 'nscloud'" in text
    assert "Traceback" not in text
    assert run(python, "lab", "up").returncode == 2  # no such command
