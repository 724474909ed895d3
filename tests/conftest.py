"""Shared test helpers, and the tiers: each test is marked by the directory it lives in.

``tests/unit``         pure: core, services on in-memory fakes, parsers; no server, no
                       program, no network (``make test-fast``, under a minute)
``tests/integration``  real PostgreSQL and MariaDB, the EC2 emulator over HTTP, recorded
                       provider responses, SQLite files, Slurm's own ``scontrol``
``tests/lab``          root and the lab: real slurmctld, sshd, WireGuard, namespace VMs
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest
from click.testing import CliRunner, Result
from hypothesis import settings

from slurm_burst.cli.main import cli
from slurm_burst.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]


def script(name: str) -> ModuleType:
    """``scripts/NAME.py``, imported by path (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAB_CONFIG = ROOT / "slurm-conf" / "lab" / "slurm-burst.toml"

# make test-full sets SLURM_BURST_TEST_FULL=1: a test with a short form (fewer cases of
# the same kind) runs its long form there. docs/testing.md lists them.
FULL = os.environ.get("SLURM_BURST_TEST_FULL") == "1"

# ``make test`` and ``make test-full`` run hypothesis's own defaults (100 examples);
# ``make test-fast`` loads the profile ``fast`` (``--hypothesis-profile=fast``), a tenth of
# them, so that the tier run after every edit stays in seconds. A test that sets its own
# count asks through ``examples()``, which scales it the same way.
FULL_EXAMPLES = 100
settings.register_profile("fast", max_examples=FULL_EXAMPLES // 10)


def examples(n: int) -> int:
    """``n`` generated examples under hypothesis's defaults, scaled to the loaded profile
    (at least 10, so that a fast run still tries a few of each kind)."""
    loaded = settings.default
    assert loaded is not None  # a profile is always loaded once hypothesis is imported
    return max(10, n * loaded.max_examples // FULL_EXAMPLES)


TIERS = ("unit", "integration", "lab")
T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def invoke(
    args: Sequence[str], expect: int | None = 0, env: dict[str, str] | None = None
) -> Result:
    """Run the CLI in-process; on an unexpected exit code show everything it said."""
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=True)
    if expect is not None and result.exit_code != expect:
        exc = "".join(traceback.format_exception(result.exception)) if result.exception else ""
        pytest.fail(
            f"exit {result.exit_code} (wanted {expect}) for {list(args)}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n{exc}"
        )
    return result


def wait(cond: Callable[[], T | None], timeout: float, what: str, every: float = 0.2) -> T:
    """Poll ``cond`` until it returns something true; fail the test after ``timeout`` s.
    The first polls come quickly (from 5 ms, doubling up to ``every``): what is done at
    once is seen at once, and what takes long is not polled more than ``every`` asks."""
    deadline = time.monotonic() + timeout
    pause = min(0.005, every)
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, every)


def lab_config_in(tmp_path: Path, extra: str = "", edits: Sequence[tuple[str, str]] = ()) -> Config:
    """The shipped lab config with every path of the lab under ``tmp_path/lab`` (nothing
    of a real lab is touched), each of ``edits`` (old, new) made once, plus ``extra``
    TOML lines appended."""
    text = LAB_CONFIG.read_text().replace("/var/lib/slurm-burst-lab", f"{tmp_path}/lab")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "slurm-burst.toml"
    path.write_text(text + extra)
    path.chmod(0o640)
    return load_config(path)
