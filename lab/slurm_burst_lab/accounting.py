"""The lab's Slurm accounting: slurmdbd on the local MariaDB, the cluster, accounts, users.

slurmdbd must answer before slurmctld starts (slurmctld registers the cluster
with it), and the cluster, its accounts and root's associations must exist
before any job is submitted, because the lab enforces associations and limits
(``AccountingStorageEnforce=associations,limits,safe``) as a site with budgets
would.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from slurm_burst.adapters.proc import CommandError, run
from slurm_burst.config import Config
from slurm_burst_lab.components import Paths, Proc, spawn, wait_for
from slurm_burst_lab.config import settings

log = logging.getLogger(__name__)


class AccountingError(RuntimeError):
    pass


def check_mariadb() -> None:
    """MariaDB must be running: slurmdbd keeps the lab's accounting there."""
    if shutil.which("mariadb") is None:
        raise AccountingError("MariaDB client missing: run scripts/setup-system.sh")
    try:
        run(["mariadb", "-u", "root", "-e", "SELECT 1"], timeout=10)
    except CommandError as exc:
        raise AccountingError(
            "MariaDB is not answering as root on its socket; start it with "
            "'start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd' "
            f"({exc.stderr.strip() or exc.reason})"
        ) from exc


def start_slurmdbd(cfg: Config, paths: Paths, slurm_conf: Path, prefix: Sequence[str] = ()) -> Proc:
    """slurmdbd (``prefix``: of another release, ``SlurmRoot.prefix``), answering."""
    env = {"SLURM_CONF": str(slurm_conf)}
    argv = [*prefix, "/usr/sbin/slurmdbd", "-D"]
    proc = spawn(argv, paths.log / "slurmdbd.out", env=env)
    wait_for(lambda: _sacctmgr_ok(cfg, slurm_conf), 60, "slurmdbd answering sacctmgr", proc)
    return proc


def _sacctmgr(cfg: Config, slurm_conf: Path, *args: str, timeout: float = 20) -> str:
    sacctmgr = str(Path(cfg.slurm.bin_dir) / "sacctmgr")  # the release the lab runs
    argv = [sacctmgr, "--immediate", "--noheader", "--parsable2", *args]
    return run(argv, timeout=timeout, env={"SLURM_CONF": str(slurm_conf)}).stdout


def _sacctmgr_ok(cfg: Config, slurm_conf: Path) -> bool:
    try:
        _sacctmgr(cfg, slurm_conf, "show", "cluster", timeout=5)
        return True
    except CommandError:
        return False


JOB_USER = "games"  # base-passwd gives it uid 5 in every Debian; 26.05 refuses "nobody" (65534)


def ensure_associations(cfg: Config, slurm_conf: Path) -> None:
    """The cluster, the lab's accounts and root in each (default: the first). Idempotent."""
    lab = settings(cfg)
    cluster = cfg.cluster.name
    accounts = [*lab.accounts, cfg.ledger.site_account]
    have_clusters = _sacctmgr(cfg, slurm_conf, "show", "cluster", "format=cluster").split()
    if cluster not in have_clusters:
        _sacctmgr(cfg, slurm_conf, "add", "cluster", cluster)
    have = set(_sacctmgr(cfg, slurm_conf, "show", "account", "format=account").split())
    for acct in accounts:
        if acct not in have:
            _sacctmgr(
                cfg,
                slurm_conf,
                "add",
                "account",
                acct,
                f"cluster={cluster}",
                f"description=slurm-burst lab account {acct}",
                "organization=lab",
            )
    assoc = _sacctmgr(
        cfg, slurm_conf, "show", "assoc", f"cluster={cluster}", "user=root", "format=account"
    ).split()
    missing = [a for a in accounts if a not in assoc]
    if missing:
        _sacctmgr(
            cfg,
            slurm_conf,
            "add",
            "user",
            "root",
            f"account={','.join(missing)}",
            f"cluster={cluster}",
        )
    # burst buffers are not root's (Slurm refuses them): stage-in jobs run as JOB_USER, a
    # user every image has with the same uid
    theirs = _sacctmgr(
        cfg, slurm_conf, "show", "assoc", f"cluster={cluster}", f"user={JOB_USER}",
        "format=account",
    ).split()  # fmt: skip
    if lab.accounts and [a for a in accounts if a not in theirs]:
        _sacctmgr(cfg, slurm_conf, "add", "user", JOB_USER, f"account={','.join(accounts)}",
                  f"cluster={cluster}", f"defaultaccount={lab.accounts[0]}")  # fmt: skip
    if lab.accounts:
        _sacctmgr(
            cfg,
            slurm_conf,
            "modify",
            "user",
            "where",
            "name=root",
            f"cluster={cluster}",
            "set",
            f"defaultaccount={lab.accounts[0]}",
        )


def drop_database(cfg: Config) -> bool:
    """Drop the lab's accounting database (nothing else); True if it existed."""
    db = settings(cfg).accounting_db
    try:
        out = run(["mariadb", "-u", "root", "-N", "-e", "SHOW DATABASES"], timeout=10).stdout
        if db not in out.split():
            return False
        # the name is checked by config validation (letters, digits, '_'); quoted anyway
        run(["mariadb", "-u", "root", "-e", f"DROP DATABASE `{db}`"], timeout=30)
        return True
    except CommandError as exc:
        log.warning("lab.down accounting database not dropped: %s", exc)
        return False
