"""The daemon's host (adapters/host.py): one daemon per host, and the wake-up socket the
hooks write to, on a real filesystem and real Unix sockets."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from slurm_burst.adapters.host import LocalHost
from slurm_burst.core.errors import DaemonError

pytestmark = pytest.mark.integration


def test_a_second_daemon_on_the_host_is_refused_and_names_the_lock(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = LocalHost(str(state), str(tmp_path / "d.sock"), "daemon.lock", None)
    first.acquire()
    assert (state / "daemon.lock").read_text() == f"{os.getpid()}\n"
    assert (state.stat().st_mode & 0o777, (state / "daemon.lock").stat().st_mode & 0o777) == (
        0o770, 0o600,
    )  # fmt: skip
    second = LocalHost(str(state), str(tmp_path / "e.sock"), "daemon.lock", None)
    with pytest.raises(DaemonError, match=r"another slurm-burst daemon holds .*daemon.lock"):
        second.acquire()
    assert DaemonError("x").code == "DaemonStart"


def test_a_state_dir_anyone_may_write_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    os.chmod(tmp_path / "state", 0o1777)
    host = LocalHost(str(tmp_path / "state"), str(tmp_path / "d.sock"), "daemon.lock", None)
    with pytest.raises(DaemonError, match=r"daemon.state_dir .* is writable by anyone"):
        host.acquire()
    assert list((tmp_path / "state").iterdir()) == []
    assert (tmp_path / "state").stat().st_mode & 0o7777 == 0o1777


def test_wake_ups_end_a_wait_and_are_drained_and_close_removes_the_socket(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run" / "d.sock"
    host = LocalHost(str(tmp_path / "state"), str(path), "daemon.lock", None)
    host.open()
    assert path.stat().st_mode & 0o777 == 0o660
    poke = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for _ in range(5):  # a burst of hooks
        poke.sendto(b"w", str(path))
    t = time.monotonic()
    host.wait(5.0)
    assert time.monotonic() - t < 1.0  # woken, not timed out
    t = time.monotonic()
    host.wait(0.3)  # all five were taken by the first wait
    assert time.monotonic() - t >= 0.25
    host.close()
    assert not path.exists()
    host.close()  # twice is harmless
