"""The SQL ledger, the daemon's spooling ledger in front of it, chargeback and Slurm
accounting; where staged data's storage is booked."""

from __future__ import annotations

from pathlib import Path

from slurm_burst.adapters.ledger.spool import Spool, SpoolingLedger
from slurm_burst.adapters.ledger.sql import SqlLedger
from slurm_burst.adapters.slurm.accounting import SlurmAccounting
from slurm_burst.config import Config
from slurm_burst.ports import AccountingLedger, Metrics
from slurm_burst.services.chargeback import Chargeback, ChargebackSettings
from slurm_burst.services.transfers import StorageBook
from slurm_burst.wiring.light import scheduler
from slurm_burst.wiring.storage import prices


def ledger(cfg: Config, check_schema: bool = True) -> SqlLedger:
    """The SQL ledger; readers check that the schema is current (else: run db upgrade)."""
    return SqlLedger(
        cfg.ledger.url,
        cfg.cluster.name,
        {n: p.region for n, p in cfg.providers.items()},
        check_schema=check_schema,
    )


def spool_dir(cfg: Config) -> Path:
    return Path(cfg.ledger.spool_dir or Path(cfg.daemon.state_dir) / "ledger-spool")


def daemon_ledger(cfg: Config, sql: SqlLedger | None = None) -> SpoolingLedger:
    """The daemon's ledger: never blocks provisioning, spools while the database is away."""
    return SpoolingLedger(sql or ledger(cfg, check_schema=False), Spool(spool_dir(cfg)))


def chargeback_settings(cfg: Config) -> ChargebackSettings:
    return ChargebackSettings(fleet=cfg.fleet, ledger=cfg.ledger, spend_cap=cfg.policy.spend_cap)


def chargeback(
    cfg: Config, sql: AccountingLedger | None = None, metrics: Metrics | None = None
) -> Chargeback:
    return Chargeback(
        chargeback_settings(cfg),
        sql or ledger(cfg),
        accounting(cfg) if cfg.ledger.accounting else None,
        scheduler(cfg),
        metrics=metrics,
    )


def accounting(cfg: Config) -> SlurmAccounting:
    """Slurm accounting (sacct, sacctmgr) for the ledger's ingest and budgets."""
    return SlurmAccounting(
        cfg.slurm.bin_dir,
        str(Path(cfg.slurm.conf_dir) / "slurm.conf"),
        cfg.cluster.name,
        timeout=max(cfg.slurm.command_timeout, 60.0),
    )


def storage_book(cfg: Config, store: str) -> StorageBook:
    """Where ``stage gc`` books ``store``'s storage: the SQL ledger, at its prices."""
    return StorageBook(cfg.cluster.name, prices(store, cfg.stores[store]), ledger(cfg))
