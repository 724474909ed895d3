"""What the hooks and the quick commands build: the state database, the request spool,
Slurm's commands, the clock, protected mode, the HA election.

The hooks import this module on every call (slurmctld waits for them): it imports at
the top only what they use, all of it light. What they never use is imported inside
its function: protected mode's service, and the HA election's PostgreSQL driver (only
an HA pair needs it).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_burst.adapters.clock import SystemClock
from slurm_burst.adapters.proc import CommandError, run
from slurm_burst.adapters.slurm.cli import SlurmCli
from slurm_burst.adapters.state.requestspool import RequestSpool
from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.slurm import release_of
from slurm_burst.fileio import gid_of
from slurm_burst.trusted import Writers

if TYPE_CHECKING:
    from slurm_burst.ports import Clock, LeaderElection, NodeStore, Scheduler
    from slurm_burst.services.groups import GroupControl


def state_db_path(cfg: Config) -> Path:
    return Path(cfg.daemon.state_dir) / "state.db"


def node_store(
    cfg: Config, create: bool = True, upgrade: bool = False, timeout: float = 10.0
) -> Store:
    """The state database; ``create=False`` for readers (StoreError if there is none).
    Only the daemon upgrades an older release's schema (``upgrade=True``): see Store.
    ``timeout``: seconds a write waits for another's lock (the hooks: hook_db_timeout)."""

    return Store(
        state_db_path(cfg), create=create, upgrade=upgrade, group=slurm_group(cfg), timeout=timeout
    )


def request_spool(cfg: Config) -> RequestSpool:
    """Where hooks keep what the state database cannot take (daemon.spool_dir)."""
    writers = Writers.us(user=cfg.daemon.user, group=cfg.daemon.group)
    return RequestSpool(cfg.daemon.spool_dir, slurm_group(cfg), writers)


def slurm_release(cfg: Config) -> str:
    """The cluster's Slurm release: ``slurm.release``, else what the installed Slurm says
    (``slurmctld -V`` beside ``slurm.bin_dir``, which needs no configuration; else
    ``sinfo --version`` with the cluster's slurm.conf). ValueError, saying what to do,
    when none answers."""

    if cfg.slurm.release:
        return cfg.slurm.release
    bin_dir = Path(cfg.slurm.bin_dir)
    env = {"SLURM_CONF": f"{cfg.slurm.conf_dir}/slurm.conf"}
    tried = []
    for argv in (
        [str(bin_dir.parent / "sbin" / "slurmctld"), "-V"],
        [str(bin_dir / "sinfo"), "--version"],
    ):
        try:
            return release_of(run(argv, timeout=10, env=env).stdout)
        except (CommandError, ValueError, OSError) as exc:
            tried.append(f"{' '.join(argv)}: {str(exc)[:200]}")
    raise ValueError(f"cannot tell the Slurm release ({'; '.join(tried)}); set slurm.release")


def slurm_group(cfg: Config) -> int | None:
    """The gid of ``daemon.group`` (SlurmUser's); None if this host has no such group
    (then files keep their creator's group; ``config check`` warns)."""
    return gid_of(cfg.daemon.group)


def clock() -> Clock:
    return SystemClock()


def scheduler(cfg: Config, timeout: float | None = None) -> SlurmCli:
    s = cfg.slurm
    return SlurmCli(
        bin_dir=s.bin_dir,
        slurm_conf=str(Path(s.conf_dir) / "slurm.conf"),
        timeout=s.command_timeout if timeout is None else min(timeout, s.command_timeout),
        batch=s.update_batch,
    )


def group_control(cfg: Config, store: NodeStore, slurm: Scheduler | None = None) -> GroupControl:
    """Protected mode on ``slurm`` (default: this config's Slurm commands). Imported
    here: the service and its ports cost a hook ~10 ms it never uses."""
    from slurm_burst.services.groups import GroupControl

    return GroupControl(
        cfg.node_groups,
        store,
        slurm if slurm is not None else scheduler(cfg),
        protect_cooldown=cfg.daemon.protect_cooldown,
    )


def node_id(cfg: Config) -> str:
    """This daemon's name in the HA election, status and its lock file."""
    return cfg.daemon.node_id or socket.gethostname()


def leader(cfg: Config) -> LeaderElection:
    from slurm_burst.adapters.ha import PgLeaderLock, SoleLeader

    if cfg.daemon.ha_url:
        return PgLeaderLock(cfg.daemon.ha_url, cfg.cluster.name, node_id(cfg))
    return SoleLeader(node_id(cfg))
