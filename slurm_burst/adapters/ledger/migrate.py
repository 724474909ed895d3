"""Schema migrations (Alembic), run by ``slurm-burst db upgrade`` and the daemon at start.

Two processes may upgrade at once (a daemon restarting while an admin runs
``db upgrade``, or two HA daemons): the upgrade runs under a lock that the
database itself holds where it can (PostgreSQL advisory lock, MariaDB
``GET_LOCK``) and a file lock next to an SQLite database. A database made by
the burst path's first ledger (tables but no version) is recognised and stamped
at revision 0001 before upgrading.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError as AlembicCommandError
from sqlalchemy import Connection, Engine, inspect, text

from slurm_burst.adapters.ledger.engine import translated
from slurm_burst.core.usage import SchemaOutdated, UnknownRevision

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
LOCK_KEY = 0x5B5B_0001  # PostgreSQL advisory lock id of slurm-burst migrations
LOCK_NAME = "slurm_burst_migrate"


def _config(conn: Connection | None = None) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


def head() -> str:
    rev = ScriptDirectory.from_config(_config()).get_current_head()
    assert rev is not None
    return rev


def current(engine: Engine) -> str | None:
    with translated("ledger schema version"), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def _lock(engine: Engine, conn: Connection) -> Iterator[None]:
    name = engine.dialect.name
    if name == "postgresql":
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            conn.commit()
    elif name in ("mysql", "mariadb"):
        conn.execute(text("SELECT GET_LOCK(:n, 300)"), {"n": LOCK_NAME})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": LOCK_NAME})
            conn.commit()
    else:
        db = engine.url.database
        path = Path(f"{db}.migrate-lock") if db and db != ":memory:" else None
        if path is None:
            yield
            return
        with open(path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _check_target(target: str) -> None:
    """``head`` or a revision this code ships; anything else is :class:`UnknownRevision`."""
    known = [r.revision for r in ScriptDirectory.from_config(_config()).walk_revisions()]
    if target != "head" and target not in known:
        raise UnknownRevision(
            f"no schema revision {target[:40]!r} (known: head, {', '.join(sorted(known))})"
        )


def upgrade(engine: Engine, target: str = "head") -> tuple[str | None, str | None]:
    """Upgrade the schema to ``target`` under the lock; return (before, after) revisions."""
    _check_target(target)
    with translated("ledger upgrade"), engine.connect() as conn, _lock(engine, conn):
        before = MigrationContext.configure(conn).get_current_revision()
        if before is None and inspect(conn).has_table("instances"):
            log.info("ledger.migrate.stamp revision=0001 reason=unversioned-burst-ledger")
            command.stamp(_config(conn), "0001")
            conn.commit()
            before = "0001"
        try:
            command.upgrade(_config(conn), target)
        except AlembicCommandError as exc:
            raise UnknownRevision(f"no schema revision {target!r}: {exc}") from exc
        conn.commit()
        after = MigrationContext.configure(conn).get_current_revision()
    if before != after:
        log.info("ledger.migrate.upgraded from=%s to=%s", before, after)
    return before, after


def downgrade(engine: Engine, target: str) -> tuple[str | None, str | None]:
    with translated("ledger downgrade"), engine.connect() as conn, _lock(engine, conn):
        before = MigrationContext.configure(conn).get_current_revision()
        command.downgrade(_config(conn), target)
        conn.commit()
        after = MigrationContext.configure(conn).get_current_revision()
    return before, after


def require_current(engine: Engine) -> None:
    """Raise SchemaOutdated unless the database is at this code's head revision."""
    have, want = current(engine), head()
    if have != want:
        raise SchemaOutdated(
            f"ledger schema is at {have or 'nothing (empty database)'}, this slurm-burst "
            f"needs {want}: run 'slurm-burst db upgrade'"
        )
