"""The HA election against the local PostgreSQL: one leader, and the follower takes over."""

from __future__ import annotations

import time

import pytest

PG = "postgresql+psycopg://root@127.0.0.1/postgres"


def _pg_up() -> bool:
    try:
        from sqlalchemy import create_engine, text

        with create_engine(PG).connect() as c:
            c.execute(text("SELECT 1"))
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _pg_up(), reason="needs the local PostgreSQL (make test starts it)")
def test_only_one_daemon_leads_and_the_follower_takes_over() -> None:
    from slurm_burst.adapters.ha import PgLeaderLock

    cluster = f"ha-test-{time.time_ns()}"
    a, b = PgLeaderLock(PG, cluster, "ctl-a"), PgLeaderLock(PG, cluster, "ctl-b")
    try:
        assert a.try_acquire() and a.held()
        assert not b.try_acquire() and not b.held()
        assert b.leader_info() == "ctl-a"
        a.release()  # the leader dies: its session (and the lock) goes with it
        assert not a.held()
        assert b.try_acquire() and b.held() and a.leader_info() == "ctl-b"
        assert not a.try_acquire()
    finally:
        a.release()
        b.release()
