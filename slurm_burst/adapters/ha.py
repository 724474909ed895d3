"""Active/passive HA: a PostgreSQL advisory lock elects the one daemon that acts.

The leader holds ``pg_try_advisory_lock(key)`` on a connection of its own for as
long as it lives. If its host dies, PostgreSQL drops the session (TCP keepalives
bound how long that takes) and the lock with it; the follower, trying once a
pass, takes it on its next try. A leader that cannot confirm it still holds the
lock (its connection broke) must stop acting at once: the daemon exits and its
supervisor restarts it as a follower. Two leaders at once are therefore impossible
while PostgreSQL is the single source of the lock.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

log = logging.getLogger(__name__)


def lock_key(cluster: str) -> int:
    """A stable 31-bit advisory-lock key per cluster."""
    return zlib.crc32(f"slurm-burst:{cluster}".encode()) & 0x7FFFFFFF


class PgLeaderLock:
    def __init__(self, url: str, cluster: str, node_id: str) -> None:
        self.url = url
        self.key = lock_key(cluster)
        self.node_id = node_id
        self._conn: Any = None

    def _connect(self) -> Any:
        engine = create_engine(
            self.url,
            poolclass=NullPool,
            connect_args={
                "connect_timeout": 5,
                "keepalives": 1,
                "keepalives_idle": 5,
                "keepalives_interval": 2,
                "keepalives_count": 3,
                "application_name": f"slurm-burst {self.node_id}",
            },
        )
        return engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def try_acquire(self) -> bool:
        """Take the lock if it is free; False (never an exception) if not reachable."""
        try:
            if self._conn is None:
                self._conn = self._connect()
            got = bool(
                self._conn.execute(
                    text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}
                ).scalar()
            )
        except (SQLAlchemyError, ImportError) as exc:  # the database away, refused, timed
            # out; or its driver not installed
            log.warning("ha.lock_unreachable error=%s", exc)
            self._drop()
            return False
        if not got:
            self._drop()  # a follower keeps no session open between tries
        return got

    def held(self) -> bool:
        """Whether this session still holds the lock (checked against the server)."""
        if self._conn is None:
            return False
        try:
            return bool(
                self._conn.execute(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND objid = :k AND pid = pg_backend_pid() AND granted"
                    ),
                    {"k": self.key},
                ).scalar()
            )
        except SQLAlchemyError as exc:
            log.error("ha.lock_lost error=%s", exc)
            self._drop()
            return False

    def leader_info(self) -> str:
        """The application name of the session holding the lock ('' if none)."""
        conn = None
        try:
            conn = self._connect()
            return str(
                conn.execute(
                    text(
                        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                        "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objid = :k "
                        "AND l.granted"
                    ),
                    {"k": self.key},
                ).scalar()
                or ""
            ).removeprefix("slurm-burst ")
        except (SQLAlchemyError, ImportError):
            return ""
        finally:
            if conn is not None:
                conn.close()

    def release(self) -> None:
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except SQLAlchemyError as exc:  # closing a broken connection
                log.debug("ha.close error=%s", exc)
            self._conn = None


class SoleLeader:
    """No election configured: this daemon is the leader (one per host by its lock)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def try_acquire(self) -> bool:
        return True

    def held(self) -> bool:
        return True

    def leader_info(self) -> str:
        return self.node_id

    def release(self) -> None:
        pass
