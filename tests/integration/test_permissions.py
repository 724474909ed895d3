"""Who may read and write what, with the hooks run as a non-root SlurmUser.

slurmctld runs the hooks as SlurmUser; the daemon runs as root. The lab runs Slurm as
root, which would hide a file the hooks cannot write, so here a hook runs as ``nobody``
(group ``nogroup`` standing in for SlurmUser's group, ``daemon.group``) after root set
the state database up, and after root ran a hook by hand. The hook runs in a child of
this process that drops to nobody (the interpreter lives under /root, which nobody
cannot enter; the code is imported before the drop, as it would already be loaded).
"""

from __future__ import annotations

import grp
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_burst.cli.main import cli
from slurm_burst.config import Config, load_config
from slurm_burst.wiring.light import node_store
from tests.conftest import LAB_CONFIG

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a hook as nobody: needs root")

NOBODY = 65534


@pytest.fixture()
def site() -> Iterator[Config]:
    """The lab's config under a directory nobody may enter (not /tmp/pytest-of-root,
    which is 0700), with daemon.group = nogroup and Slurm's commands faked."""
    base = Path(tempfile.mkdtemp(prefix="sb-perm-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        bin_dir = base / "slurm" / "bin"  # the lab config's bin_dir, under the new base
        bin_dir.mkdir(parents=True)
        for tool in ("scontrol", "sinfo", "squeue"):
            (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
            (bin_dir / tool).chmod(0o755)
        text = (
            LAB_CONFIG.read_text()
            .replace("/var/lib/slurm-burst-lab", str(base))
            .replace('group = "root"', 'group = "nogroup"')
        )
        path = base / "slurm-burst.toml"
        path.write_text(text)
        os.chown(path, 0, grp.getgrnam("nogroup").gr_gid)
        path.chmod(0o640)
        yield load_config(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(cfg: Config, *args: str) -> int:
    """Run ``slurm-burst --config CFG ARGS`` as nobody:nogroup; its exit code."""
    pid = os.fork()
    if pid == 0:  # the child: drop, run, exit without returning into pytest
        code = 70
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = CliRunner().invoke(cli, ["--config", cfg.source, *args])
            code = result.exit_code
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def mode_and_group(path: Path) -> tuple[str, str]:
    st = path.stat()
    return f"{stat.S_IMODE(st.st_mode):04o}", grp.getgrgid(st.st_gid).gr_name


def test_hooks_as_slurm_user_write_what_root_set_up(site: Config) -> None:
    state = Path(site.daemon.state_dir)
    db = state / "state.db"
    store = node_store(site)  # root sets up (db upgrade, the daemon's start)
    store.beat(time.time() + 3600, {"pid": 1, "node_id": "perm"})  # the daemon is up
    store.close()
    assert (
        CliRunner().invoke(cli, ["--config", site.source, "resume", "burst-cpu-1"]).exit_code == 0
    )
    # root ran a hook by hand first: its log and database must not lock SlurmUser out
    assert as_nobody(site, "resume", "burst-cpu-2") == 0
    assert as_nobody(site, "suspend", "burst-cpu-3") == 0
    store = node_store(site, create=False)
    try:
        got = [(r.kind, list(r.nodes)) for r in store.pending_requests()]
    finally:
        store.close()
    assert got == [
        ("resume", ["burst-cpu-1"]),
        ("resume", ["burst-cpu-2"]),
        ("suspend", ["burst-cpu-3"]),
    ]
    assert mode_and_group(state) == ("0770", "nogroup")
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        assert mode_and_group(path) == ("0660", "nogroup"), path
    log = Path(site.daemon.hook_log)
    assert mode_and_group(log) == ("0660", "nogroup")
    assert "burst-cpu-2" in log.read_text()  # nobody's hook could log


def test_nobody_outside_slurm_users_group_can_touch_the_state(site: Config) -> None:
    node_store(site).close()
    db = Path(site.daemon.state_dir) / "state.db"
    for path in (db.parent, db):
        assert not path.stat().st_mode & 0o007, path


def test_the_sqlite_ledger_is_the_daemons_alone(site: Config) -> None:
    assert CliRunner().invoke(cli, ["--config", site.source, "db", "upgrade"]).exit_code == 0
    ledger = Path(site.ledger.url.removeprefix("sqlite:///"))
    for path in (ledger, Path(f"{ledger}-wal"), Path(f"{ledger}-shm")):
        if path.exists() or path == ledger:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert as_nobody(site, "ledger", "report", "--json") != 0  # nobody cannot read it
