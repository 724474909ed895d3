"""The EC2 tests' config (the EC2 emulator's port, one cluster name per test) and the
fixture that writes it: shared by test_ec2 and test_ec2_capacity through this tier's
conftest."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.config import Config, load_config

CONFIG = """
[cluster]
name = "{cluster}"
controller_host = "ctl"
controller_addr = "10.0.0.1"

[slurm]
onprem_partitions = ["batch"]
conf_dir = "{tmp}/slurm"
hook_dir = "{tmp}/bin"

[mesh]
endpoint = "203.0.113.10"
interface = "wg-ec2test"
state_dir = "{tmp}/wg"

[providers.aws]
driver = "ec2"
region = "us-east-1"
credentials = {{ key_env = "SB_TEST_AWS_KEY", secret_env = "SB_TEST_AWS_SECRET" }}
options = {{ host = "127.0.0.1", port = {port}, secure = false, signature_version = "4" }}

[node_groups.cpu]
pattern = "aws-{{n}}"
count = 64
partition = "burst-aws"
providers = ["aws"]
sizes = ["c5.large", "c5.xlarge"]
image = "ami-12345678"
cpus = 2
memory_mb = 3500
spot = {spot}
tags = {{ "cost-center" = "hpc-42" }}
price_per_hour = {{ "c5.large" = 0.085, "c5.xlarge" = 0.17 }}

[ledger]
url = "sqlite:///{tmp}/ledger.db"
accounting = false

[daemon]
state_dir = "{tmp}/state"
socket = "{tmp}/daemon.sock"
hook_log = "{tmp}/hooks.log"
boot_timeout = 600
workers = 8
poll_period = 1
heartbeat_stale = 30
metrics_listen = ""
api_backoff = 0.01
api_backoff_max = 0.05
"""


def with_profile(cluster: str, tmp: Path, port: int, profile: str) -> str:
    """:data:`CONFIG` with ``profile`` (another provider's profile and groups, TOML) in
    place of its EC2 profile and group."""
    text = CONFIG.format(cluster=cluster, tmp=tmp, port=port, spot="false")
    head, rest = text.split("[providers.aws]", 1)
    return head + profile + rest[rest.index("[ledger]") :]


@pytest.fixture
def cfg_factory(
    emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Config]:
    monkeypatch.setenv("SB_TEST_AWS_KEY", "AKIDEMULATOR000000000")
    monkeypatch.setenv("SB_TEST_AWS_SECRET", "emulator-secret")

    def make(spot: bool = False, daemon: str = "", extra: str = "", slurm: str = "") -> Config:
        """The test config; ``daemon`` and ``slurm`` lines added to those tables, ``extra``
        TOML at the end."""
        cluster = f"t{time.time_ns() % 10**9}"  # each test its own instances in the emulator
        path = tmp_path / "slurm-burst.toml"
        text = CONFIG.format(cluster=cluster, tmp=tmp_path, port=emulator.port,
                             spot=str(spot).lower())  # fmt: skip
        text = text.replace("[daemon]\n", f"[daemon]\n{daemon}\n")
        path.write_text(text.replace("[slurm]\n", f"[slurm]\n{slurm}\n") + extra)
        path.chmod(0o640)
        return load_config(path)

    return make


def spot_config(tmp: Path, text: str) -> Config:
    """A config ``text`` with a spot group loaded: ResumeTimeout long enough for its wait
    and a boot, written (0640) under ``tmp``."""
    path = tmp / "slurm-burst.toml"
    path.write_text(text.replace("[slurm]\n", "[slurm]\nresume_timeout = 900\n"))
    path.chmod(0o640)
    return load_config(path)
