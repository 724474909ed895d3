"""Last lab module: `lab down` leaves no namespace, process, link or file behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from slurm_burst_lab.service import Lab
from slurm_burst_lab.slurmroot import mounted_under

from tests.conftest import LAB_CONFIG, invoke
from tests.lab.conftest import make


def _lab_processes(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd and int(pid) != os.getpid():
            found.append(f"{pid}: {cmd}")
    return found


def test_down_removes_everything(lab: Lab) -> None:
    """`make lab-down`, as the README shows it, removes everything the lab made."""
    state = str(lab.paths.state)
    assert _lab_processes(state)  # the lab really was running
    done = make("lab-down")
    assert done.returncode == 0, done.stdout + done.stderr
    netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    assert [n for n in netns if n.startswith("sbl-")] == []
    assert _lab_processes(state) == []
    assert not Path(state).exists()
    root = lab.slurm_root().base  # another release's controller root, with /host bound in
    assert mounted_under(root) == [] and not root.exists()
    assert (
        not Path("/sys/class/net/sbl-lan").exists() and not Path("/sys/class/net/sbl-inet").exists()
    )
    assert not Path("/sys/class/net/wg-burst").exists()  # the WireGuard hub
    assert not Path(lab.lab.shared_dir).exists()
    assert _lab_processes(str(LAB_CONFIG.resolve())) == []  # the daemon
    assert Path("/etc/munge/munge.key").exists()  # the host's own munge is not ours to touch
    assert subprocess.run(["pgrep", "-x", "slurmdbd"], capture_output=True).returncode == 1
    dbs = subprocess.run(
        ["mariadb", "-u", "root", "-N", "-e", "SHOW DATABASES"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert lab.lab.accounting_db not in dbs  # the lab's accounting database is dropped
    status = invoke(["--config", str(LAB_CONFIG), "lab", "status", "--json"], expect=3)
    assert '"up": false' in status.stdout


def test_down_after_a_crashed_up_sweeps_only_lab_programs(lab: Lab) -> None:
    """Processes missing from lab.json are still found; an admin's `tail -f` is left alone."""
    import json
    import subprocess

    lab.up()
    record = json.loads(lab.paths.record.read_text())
    record["onprem"] = {}
    record["processes"].pop("munged")
    lab.paths.record.write_text(json.dumps(record))
    log = lab.paths.log / "slurmctld.log"
    admin = subprocess.Popen(["tail", "-f", str(log)], stdout=subprocess.DEVNULL)
    try:
        lab.down()
        assert admin.poll() is None  # still running
        assert _lab_processes(str(lab.paths.state)) == [f"{admin.pid}: tail -f {log} "]
        netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        assert [n for n in netns if n.startswith("sbl-")] == []
    finally:
        admin.kill()
        admin.wait()


def test_a_failed_up_stops_what_it_started(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """munged, slurmdbd, slurmctld and the daemon are running when the on-prem nodes fail
    to boot: the failed 'up' removes them, and everything else it made."""
    from slurm_burst_lab import components

    def boom(*args: object) -> dict[str, dict[str, object]]:
        raise RuntimeError("injected: the on-prem nodes did not boot")

    lab.down()  # whatever the tests before left
    monkeypatch.setattr(components, "boot_onprem", boom)
    with pytest.raises(RuntimeError, match="injected"):
        lab.up()
    assert _lab_processes(str(lab.paths.state)) == []
    assert _lab_processes(str(LAB_CONFIG.resolve())) == []  # the daemon
    assert not lab.paths.state.exists()
    netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    assert [n for n in netns if n.startswith("sbl-")] == []
    assert subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode == 1
    kept = lab.paths.failed_up_logs  # where its error points: what ran, up to the failure
    assert "daemon.started" in (kept / "daemon.log").read_text()
    shutil.rmtree(kept)
