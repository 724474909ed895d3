"""The lab's pre_run poll (lab/slurm_burst_lab/prerunpoll): preloaded, a sleep of 60 s
lasts the configured seconds, any other sleep and any bad setting keep Slurm's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_burst_lab import prerunpoll

SLEEP = "import ctypes, sys; ctypes.CDLL(None).sleep(int(sys.argv[1]))"


def sleep_in(env: dict[str, str], seconds: int, timeout: float) -> None:
    subprocess.run([sys.executable, "-c", SLEEP, str(seconds)], env={**os.environ, **env},
                   check=True, timeout=timeout)  # fmt: skip


def test_a_sleep_of_60_lasts_the_poll(tmp_path: Path) -> None:
    env = prerunpoll.environment(1, tmp_path)
    assert env[prerunpoll.VARIABLE] == "1" and Path(env["LD_PRELOAD"]).is_file()
    sleep_in(env, 60, timeout=30)  # Slurm's 60 s would time out


@pytest.mark.parametrize("value", ["0", "60", "2x", "99999999999999999999"])
def test_a_bad_setting_keeps_slurms_sixty(tmp_path: Path, value: str) -> None:
    env = prerunpoll.environment(1, tmp_path) | {prerunpoll.VARIABLE: value}
    with pytest.raises(subprocess.TimeoutExpired):
        sleep_in(env, 60, timeout=1.5)


def test_other_sleeps_are_slurms_own(tmp_path: Path) -> None:
    env = prerunpoll.environment(1, tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        sleep_in(env, 59, timeout=1.5)


def test_slurms_own_poll_preloads_nothing(tmp_path: Path) -> None:
    assert prerunpoll.environment(60, tmp_path) == {}
    assert not list(tmp_path.iterdir())
