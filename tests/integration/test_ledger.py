"""The ledger suite, run unchanged against SQLite, the local PostgreSQL and MariaDB.

Each backend gets a fresh database per session, migrated once by Alembic (the
same code path as ``slurm-burst db upgrade``). Tests use their own instance ids
and job keys, so they share the database without interfering.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool

from slurm_burst.adapters.ledger import migrate
from slurm_burst.adapters.ledger.engine import make_engine
from slurm_burst.adapters.ledger.models import Base, InstanceEventRow, JobRow
from slurm_burst.adapters.ledger.reports import charge_lines, report
from slurm_burst.adapters.ledger.spool import Spool, SpoolingLedger
from slurm_burst.adapters.ledger.sql import SqlLedger
from slurm_burst.core.allocation import Allocation, InstanceSpan, JobSpan, allocate
from slurm_burst.core.gpu import GpuUsage
from slurm_burst.core.usage import (
    InstanceEvent,
    JobUsage,
    LedgerUnavailable,
    SchemaOutdated,
    Transfer,
)
from slurm_burst.wiring.ledger import chargeback_settings
from tests.contracts.ledger import LedgerContract

PG_ADMIN = "postgresql+psycopg://root@127.0.0.1/postgres"
MY_ADMIN = "mysql+pymysql://root@127.0.0.1/"


def _server_up(url: str) -> bool:
    try:
        with create_engine(url, connect_args={"connect_timeout": 3}).connect():
            return True
    except Exception:
        return False


@pytest.fixture(scope="session", params=["sqlite", "postgresql", "mariadb"])
def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    name = f"sbtest_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"
        return
    admin = PG_ADMIN if request.param == "postgresql" else MY_ADMIN
    if not _server_up(admin):
        pytest.fail(f"{request.param} is not running on 127.0.0.1 (make test starts it)")
    eng = create_engine(admin, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    url = (
        f"postgresql+psycopg://root@127.0.0.1/{name}"
        if request.param == "postgresql"
        else f"mysql+pymysql://root@127.0.0.1/{name}"
    )
    yield url
    make_engine(url).dispose()
    eng = create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=NullPool)  # after restarts
    with eng.connect() as c:
        if request.param == "postgresql":
            c.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
        else:
            c.execute(text(f"DROP DATABASE {name}"))


@pytest.fixture(scope="session")
def led(db_url: str) -> SqlLedger:
    engine = make_engine(db_url)
    with pytest.raises(SchemaOutdated, match="db upgrade"):
        SqlLedger(db_url, "c1", engine=engine)
    assert migrate.upgrade(engine) == (None, migrate.head())
    assert migrate.upgrade(engine) == (migrate.head(), migrate.head())  # idempotent
    return SqlLedger(db_url, "c1", {"lab": "lab-1"}, engine=engine)


T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)


def _event(
    led: SqlLedger | SpoolingLedger, inst: str, event: str, at: datetime, **kw: object
) -> None:
    led.instance_event(
        InstanceEvent(
            node=str(kw.get("node", "burst-cpu-1")),
            instance_id=inst,
            provider="lab",
            size="ns.cpu2",
            price_per_hour=0.085,
            event=event,
            at=at.timestamp(),
            partition="burst-cpu",
            cpus=2,
            price_source="rates.cpu2",
            price_version="1970-01-01T00:00:00Z",
            group="cpu",
        )
    )


def _job(
    jid: int, account: str, start: datetime, minutes: int, node: str = "burst-cpu-1"
) -> JobUsage:
    return JobUsage(
        "c1",
        jid,
        account,
        "alice",
        "burst-cpu",
        node,
        1,
        2,
        0,
        0,
        start,
        start,
        start + timedelta(minutes=minutes),
        "COMPLETED",
    )


def test_migrations_match_the_models(led: SqlLedger) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with led.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    # Column comments are not reflected by SQLite; everything else must match.
    real = [d for d in diff if not (isinstance(d, tuple) and "comment" in d[0])]
    real = [d for d in real if not (isinstance(d, list) and "comment" in d[0][0])]
    assert real == []


def test_downgrade_and_upgrade_again(db_url: str, led: SqlLedger) -> None:
    # a throwaway copy for SQLite; the server databases are checked by the upgrade above
    if not db_url.startswith("sqlite"):
        pytest.skip("downgrade is exercised on SQLite; servers share the session database")
    path = Path(db_url.removeprefix("sqlite:///")).with_name("down.db")
    eng = make_engine(f"sqlite:///{path}")
    migrate.upgrade(eng)
    assert migrate.downgrade(eng, "0001") == (migrate.head(), "0001")
    assert migrate.upgrade(eng) == ("0001", migrate.head())


def test_instance_events_are_recorded_once(led: SqlLedger) -> None:
    inst = f"i-{uuid.uuid4().hex[:8]}"
    for _ in range(3):  # a replayed event adds nothing
        _event(led, inst, "requested", T0)
        _event(led, inst, "terminated", T0 + timedelta(hours=1))
    rows = [r for r in led.instances() if r["instance_id"] == inst]
    assert len(rows) == 1
    r = rows[0]
    assert r["region"] == "lab-1" and r["partition"] == "burst-cpu"
    assert r["price_source"] == "rates.cpu2" and r["cost_micros"] == 85_000
    with led.engine.connect() as c:
        n = c.scalar(select(func.count()).where(InstanceEventRow.instance_id == inst))
    assert n == 2


def test_jobs_ingest_is_idempotent(led: SqlLedger) -> None:
    base = 10_000 + int(uuid.uuid4().int % 1_000_000) * 10
    jobs = [_job(base + i, "physics", T0, 10) for i in range(5)]
    window = (T0, T0 + timedelta(hours=1))
    assert led.record_jobs(jobs, window) == 5
    assert led.record_jobs(jobs, window) == 0
    assert led.record_jobs([*jobs, _job(base + 5, "chem", T0, 5)], window) == 1
    assert led.ingest_cursor() is not None
    with led.engine.connect() as c:
        keys = c.scalars(
            select(JobRow.job_key).where(JobRow.job_id >= base, JobRow.job_id < base + 6)
        )
        assert len(list(keys)) == 6


def _split_one_job(led: SqlLedger, account: str = "physics") -> tuple[datetime, str, str]:
    """One instance on a day of its own, one 30-minute job on it, the cost split:
    (the day, the instance, the job's key)."""
    day = T0 + timedelta(days=int(uuid.uuid4().int % 20))  # a day of its own in November
    inst = f"i-{uuid.uuid4().hex[:8]}"
    node = f"burst-cpu-{uuid.uuid4().int % 1000}"
    _event(led, inst, "requested", day, node=node)
    _event(led, inst, "terminated", day + timedelta(hours=1), node=node)
    jid = 20_000_000 + int(uuid.uuid4().int % 1_000_000)
    led.record_jobs(
        [_job(jid, account, day + timedelta(minutes=10), 30, node)],
        (day, day + timedelta(hours=2)),
    )
    closed = [c for c in led.closed_unallocated(day + timedelta(hours=2)) if c.instance_id == inst]
    assert len(closed) == 1
    c = closed[0]
    span = InstanceSpan(
        inst,
        node,
        c.partition,
        int(c.start.timestamp() * 1000),
        int(c.end.timestamp() * 1000),
        c.micros_per_hour,
        c.cpus,
        c.gpus,
    )
    jobs = [
        JobSpan(
            j.key,
            j.account,
            j.user,
            int(j.start.timestamp() * 1000),
            int(j.end.timestamp() * 1000),
            2,
        )
        for j in led.jobs_between(c.start, c.end)
        if j.nodes == node
    ]
    alloc = Allocation(inst, span.cost, "usage", allocate(span, jobs))
    assert led.write_allocations([alloc]) == 1
    assert led.write_allocations([alloc]) == 0  # split exactly once
    assert not [
        x for x in led.closed_unallocated(day + timedelta(hours=2)) if x.instance_id == inst
    ]
    return day, inst, f"c1:{jid}:{int((day + timedelta(minutes=10)).timestamp())}"


def test_allocation_report_and_budget(led: SqlLedger) -> None:
    day, inst, key = _split_one_job(led)
    first, nxt = day.date(), day.date() + timedelta(days=1)
    by_job = {r["job_key"]: r for r in report(led.engine, ["job"], first, nxt)}
    assert by_job[key]["account"] == "physics"
    assert by_job[key]["allocated_micros"] == 42_500  # half an hour of the whole node
    assert by_job[key]["total_micros"] == 85_000  # the idle half is its overhead share
    by_account = report(led.engine, ["account"], first, nxt)
    assert sum(r["total_micros"] for r in by_account) >= 85_000
    lines = [ln for ln in charge_lines(led.engine, first, nxt) if ln[5] == inst]
    assert sum(ln[8] for ln in lines) == 85_000
    led.set_budget("physics", 1_000_000)
    led.set_budget("physics", 2_000_000)
    assert led.budgets()["physics"][0] == 2_000_000
    assert led.spent(date(2026, 11, 1), date(2026, 12, 1))["physics"] >= 85_000


def test_spend_since_reads_the_running_total_a_pass_at_a_time(led: SqlLedger) -> None:
    """The metrics' spend counter: all-time micros per (account, partition), then only
    what later passes add (the same sums, read whole or in steps)."""
    last, before = led.spend_since(0)
    _split_one_job(led)
    after_last, added = led.spend_since(last)
    assert after_last > last
    assert sum(added.values()) == 85_000  # the one instance split: job and its overhead
    assert all(partition for _account, partition in added)
    _whole_last, whole = led.spend_since(0)
    for key in set(before) | set(added):
        assert whole.get(key, 0) == before.get(key, 0) + added.get(key, 0)
    assert led.spend_since(after_last) == (after_last, {})


def test_the_spend_counter_read_in_steps_is_the_ledger_read_whole(led: SqlLedger) -> None:
    from slurm_burst.adapters.metrics.prom import Metrics
    from slurm_burst.config import load_config
    from slurm_burst.services.chargeback import Chargeback

    cfg = load_config(Path(__file__).parents[2] / "slurm-conf/lab/slurm-burst.toml")
    m = Metrics()
    cb = Chargeback(chargeback_settings(cfg), led, None, None, metrics=m)
    cb.report_spend(whole=True)
    _split_one_job(led)
    cb.report_spend(whole=False)
    stepped = dict(m.spend.totals)
    cb.report_spend(whole=True)
    assert m.spend.totals == stepped
    assert sum(stepped.values()) == pytest.approx(sum(led.spend_since(0)[1].values()) / 1e6)
    groups = {g.partition: name for name, g in cfg.node_groups.items()}
    assert {group for _account, group in stepped} <= set(groups.values()) | set(groups)


def test_gpu_usage_gives_each_job_its_utilization_and_idle_gpu_cost(led: SqlLedger) -> None:
    account = f"gpu{uuid.uuid4().hex[:6]}"
    day, _inst, key = _split_one_job(led, account)
    jid = int(key.split(":")[1])
    start = (day + timedelta(minutes=10)).timestamp()
    rows = [  # two periods of one job on one node: 2 GPUs, busy 90 % then 30 %
        GpuUsage(key, jid, "burst-gpu-1", start, start + 600, 2, 20, 1200.0, 1080.0, 1 << 33),
        GpuUsage(key, jid, "burst-gpu-1", start + 600, start + 1800, 2, 40, 2400.0, 720.0, 0),
    ]
    assert led.gpu_usage(rows) == 2
    assert led.gpu_usage(rows) == 0  # a period is recorded once
    first, nxt = day.date(), day.date() + timedelta(days=1)
    (job,) = [r for r in report(led.engine, ["job"], first, nxt) if r["job_key"] == key]
    assert job["gpu_util"] == pytest.approx(0.5)  # (1080 + 720) / 3600
    assert job["idle_gpu_micros"] == 21_250  # half of the 42,500 allocated
    (acct,) = [r for r in report(led.engine, ["account"], first, nxt) if r["account"] == account]
    assert acct["idle_gpu_micros"] == 21_250 and acct["idle_gpu"] == pytest.approx(0.02125)
    others = [r for r in report(led.engine, ["job"], first, nxt) if r["job_key"] != key]
    assert all(r["gpu_util"] is None and r["idle_gpu_micros"] == 0 for r in others)


def test_report_groups_by_month_and_account(led: SqlLedger) -> None:
    rows = report(led.engine, ["month", "account"], date(2026, 1, 1), date(2027, 1, 1))
    assert rows and all(r["month"] == "2026-11" for r in rows)
    assert len({(r["month"], r["account"]) for r in rows}) == len(rows)


def test_spool_keeps_writes_while_the_database_is_away(led: SqlLedger, tmp_path: Path) -> None:
    down = SqlLedger(
        "sqlite:////nonexistent-dir/x/y.db",
        "c1",
        check_schema=False,
        engine=make_engine(f"sqlite:///{tmp_path}/empty.db"),
    )  # no tables: refused
    spooling = SpoolingLedger(down, Spool(tmp_path / "spool"))
    inst = f"i-{uuid.uuid4().hex[:8]}"
    _event(spooling, inst, "requested", T0)
    _event(spooling, inst, "terminated", T0 + timedelta(minutes=6))
    assert len(spooling.spool) == 2
    assert (tmp_path / "spool").stat().st_mode & 0o777 == 0o700
    spooling.ledger = led  # the database is back
    assert spooling.replay() == 2
    assert spooling.replay() == 0 and len(spooling.spool) == 0
    rows = [r for r in led.instances() if r["instance_id"] == inst]
    assert len(rows) == 1 and rows[0]["terminated"] is not None


def test_postgresql_restart_mid_cycle_loses_and_duplicates_nothing(
    db_url: str, led: SqlLedger, tmp_path: Path
) -> None:
    """Instance events keep coming while PostgreSQL restarts: none lost, none twice."""
    if not db_url.startswith("postgresql"):
        pytest.skip("restarts the local PostgreSQL server")
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    spooling = SpoolingLedger(led, Spool(tmp_path / "spool"))
    prefix = f"r-{uuid.uuid4().hex[:6]}"
    written: list[str] = []
    stop = threading.Event()

    def provision() -> None:  # what the daemon's workers do during a burst cycle
        i = 0
        while not stop.is_set():
            inst = f"{prefix}-{i}"
            for event, minutes in (
                ("requested", 0),
                ("running", 1),
                ("joined", 2),
                ("terminated", 30),
            ):
                _event(spooling, inst, event, T0 + timedelta(minutes=minutes))
            written.append(inst)
            i += 1
            time.sleep(0.02)

    worker = threading.Thread(target=provision)
    worker.start()
    time.sleep(0.5)
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        timeout=60,
    )
    time.sleep(0.5)
    stop.set()
    worker.join()
    spooled = len(spooling.spool)
    deadline = time.monotonic() + 30
    while len(spooling.spool) and time.monotonic() < deadline:
        with contextlib.suppress(LedgerUnavailable):
            spooling.replay()
        time.sleep(0.2)
    assert len(spooling.spool) == 0
    with led.engine.connect() as c:
        rows = c.execute(
            select(InstanceEventRow.instance_id, func.count())
            .where(InstanceEventRow.instance_id.like(f"{prefix}-%"))
            .group_by(InstanceEventRow.instance_id)
        ).all()
    assert {i for i, _ in rows} == set(written)
    assert all(n == 4 for _, n in rows)
    print(f"pg restart: {len(written)} instances x 4 events, {spooled} writes spooled")
    assert spooled > 0, "the restart should have sent some writes to the spool"


def test_the_cost_shown_is_the_cost_split_to_the_micro_dollar(led: SqlLedger) -> None:
    """Sub-millisecond instants: the instance's shown cost and its split agree exactly."""
    from slurm_burst.config import load_config
    from slurm_burst.services.chargeback import Chargeback

    cfg = load_config(Path(__file__).parents[2] / "slurm-conf/lab/slurm-burst.toml")
    ids = []
    base = T0 + timedelta(days=25)
    for k in range(40):  # start and end fractions that truncate differently
        inst = f"i-ms{uuid.uuid4().hex[:8]}"
        start = base + timedelta(minutes=k, microseconds=999 - k * 23)
        _event(led, inst, "requested", start, node=f"burst-cpu-{k + 500}")
        end = start + timedelta(seconds=1000 + k, microseconds=k * 37)
        _event(led, inst, "terminated", end, node=f"burst-cpu-{k + 500}")
        ids.append(inst)
    later = (base + timedelta(days=1)).timestamp()
    cb = Chargeback(chargeback_settings(cfg), led, None, None, clock=lambda: later)
    assert cb.allocate() >= len(ids)
    shown = {r["instance_id"]: r["cost_micros"] for r in led.instances()}
    with led.engine.connect() as c:
        split: dict[str, int] = dict(
            c.execute(
                text(
                    "SELECT instance_id, SUM(amount_micros) FROM charges"
                    " WHERE instance_id LIKE 'i-ms%' GROUP BY instance_id"
                )
            ).all()
        )
    assert {i: shown[i] for i in ids} == {i: int(split[i]) for i in ids}


class TestSqlLedgerContract(LedgerContract):
    """The ledger contract on SQLite, PostgreSQL and MariaDB (the fake passes it too)."""

    @pytest.fixture()
    def ledger(self, led: SqlLedger) -> SqlLedger:
        return led


class TestSpoolingLedgerContract(LedgerContract):
    """The daemon's spooling ledger keeps the contract while its database is up."""

    @pytest.fixture()
    def ledger(self, led: SqlLedger, tmp_path: Path) -> SpooledSql:
        return SpooledSql(SpoolingLedger(led, Spool(tmp_path / "spool")), led)


class SpooledSql:
    """Writes through the spooling ledger, reads from the database behind it."""

    def __init__(self, spooling: SpoolingLedger, sql: SqlLedger) -> None:
        self.spooling, self.sql = spooling, sql

    def instance_event(self, ev: InstanceEvent) -> None:
        self.spooling.instance_event(ev)

    def instance_events(self, evs: Sequence[InstanceEvent]) -> None:
        self.spooling.instance_events(evs)

    def transfer(self, t: Transfer) -> None:
        self.spooling.transfer(t)

    def transfers(
        self, start: date, end: date, account: str = "", job: int = 0
    ) -> list[dict[str, Any]]:
        return self.sql.transfers(start, end, account, job)

    def open_instances(self) -> dict[str, str]:
        return self.sql.open_instances()


def test_staging_is_in_the_chargeback_by_account_and_by_job(led: SqlLedger) -> None:
    """Transfers (pushes, pulls, an admin's pre-stage) add a staging column to reports
    and to their totals; by job, a job's transfers go to its row."""
    acct = f"stg{uuid.uuid4().hex[:8]}"
    day, _inst, key = _split_one_job(led, account=acct)
    first, nxt = day.date(), day.date() + timedelta(days=1)
    job_row = {r["job_key"]: r for r in report(led.engine, ["job"], first, nxt)}[key]
    jid, user = int(key.split(":")[1]), job_row["user"]
    at = (day + timedelta(minutes=5)).timestamp()

    def moved(direction: str, job: int, cost: int, sent: int, node: str = "") -> Transfer:
        return Transfer(
            key=f"{direction}:{acct}:{job}:{node}", direction=direction, store="s3-lab",
            provider="lab", account=acct, user=user, job_id=job, node=node, dataset="/d",
            manifest="ab" * 32, logical_bytes=sent, bytes_sent=sent, objects=1,
            objects_sent=1, seconds=1.0, at=at, per_gb=0.5, storage_per_gb_month=0.25,
            cost_micros=cost,
        )  # fmt: skip

    for t in (moved("in", jid, 3_000, 1 << 20), moved("pull", jid, 700, 1 << 20, "n1"),
              moved("in", 0, 5_000, 2 << 20)):  # fmt: skip
        led.transfer(t)
        led.transfer(t)  # once each
    by_account = {r["account"]: r for r in report(led.engine, ["account"], first, nxt)}
    assert by_account[acct]["staging_micros"] == 8_700
    assert by_account[acct]["total_micros"] == 85_000 + 8_700
    assert by_account[acct]["staged_bytes"] == 4 << 20
    month = date(first.year, first.month, 1)
    after = date(month.year + month.month // 12, month.month % 12 + 1, 1)
    assert led.spent(month, after)[acct] == 85_000 + 8_700  # budgets count staging too
    by_job = {r["job"]: r for r in report(led.engine, ["job"], first, nxt) if r["account"] == acct}
    assert by_job[str(jid)]["staging_micros"] == 3_700
    assert by_job[str(jid)]["total_micros"] == 85_000 + 3_700
    assert by_job["(pre-stage)"]["staging_micros"] == 5_000
    assert by_job["(pre-stage)"]["total_micros"] == 5_000
    listed = led.transfers(first, nxt, account=acct)
    assert sorted((t["direction"], t["job"], t["cost_micros"]) for t in listed) == [
        ("in", 0, 5_000), ("in", jid, 3_000), ("pull", jid, 700)
    ]  # fmt: skip
    # the finance export: a line per transfer, after the day's instance charges
    lines = [ln for ln in led.charge_lines(first, nxt) if ln[1] == acct]
    staged = [ln for ln in lines if ln[6].startswith("staging-")]
    cluster = key.split(":")[0]
    assert sorted((ln[4], ln[6], ln[8], ln[5], ln[3]) for ln in staged) == sorted([
        (f"{cluster}:{jid}", "staging-in", 3_000, "", ""),
        (f"{cluster}:{jid}", "staging-pull", 700, "", ""),
        ("", "staging-in", 5_000, "", ""),
    ])  # fmt: skip
    assert sum(ln[8] for ln in lines) == 85_000 + 8_700  # the report's total, line by line
    assert [ln[0] for ln in lines] == sorted(ln[0] for ln in lines)


def test_storage_booked_by_gc_is_charged_to_the_account_once_a_period(led: SqlLedger) -> None:
    """Storage's GB-months (``stage gc``'s bookings) are in the account's staging, its
    spend, the by-job report as ``(storage)`` and the export (kind staging-stored); a
    period booked twice counts once; each namespace's last booking is read back."""
    from slurm_burst.core.pricing import GB, MONTH_SECONDS, storage_cost_micros
    from slurm_burst.core.usage import StorageCharge

    acct = f"sto{uuid.uuid4().hex[:8]}"
    store = f"s3-{acct}"
    at = (T0 + timedelta(hours=2)).timestamp()

    def booked(start: float | None, end: float, byte_seconds: int) -> StorageCharge:
        return StorageCharge(
            key=f"stored:{acct}:{start}", store=store, provider="lab", account=acct,
            namespace=f"acct-{acct}", start=start, at=end, key_count=7, stored_bytes=GB,
            byte_seconds=byte_seconds, per_gb_month=0.023,
            cost_micros=storage_cost_micros(byte_seconds, 23_000),
        )  # fmt: skip

    first = booked(None, at, GB * MONTH_SECONDS)  # a GB-month: $0.023
    then = booked(at, at + 3600, GB * 3600 * 100)  # 100 GB for an hour
    for s in (first, first, then, then):
        led.storage(s)
    assert led.storage_booked(store) == {f"acct-{acct}": at + 3600}
    assert led.storage_booked("another-store") == {}
    day = T0.date()
    rows = led.storage_rows(day, day + timedelta(days=1), account=acct)
    shown = [(r["start"], r["keys"], r["bytes"], r["cost_micros"], r["gb_months"]) for r in rows]
    assert shown == [
        (datetime.fromtimestamp(at, UTC).isoformat(), 7, GB, 3_151, round(100 / 730, 6)),
        (None, 7, GB, 23_000, 1.0),
    ]  # fmt: skip
    total = 23_000 + 3_151
    by_account = {r["account"]: r for r in report(led.engine, ["account"], day, day + timedelta(1))}
    assert by_account[acct]["staging_micros"] == total and by_account[acct]["staged_bytes"] == 0
    assert by_account[acct]["total_micros"] == total
    by_job = {r["job"]: r for r in report(led.engine, ["job"], day, day + timedelta(1))
              if r["account"] == acct}  # fmt: skip
    assert by_job["(storage)"]["staging_micros"] == total and by_job["(storage)"]["user"] == ""
    assert led.spent(date(day.year, day.month, 1), day + timedelta(days=1))[acct] == total
    lines = [ln for ln in led.charge_lines(day, day + timedelta(days=1)) if ln[1] == acct]
    assert [(ln[6], ln[8], ln[2], ln[4]) for ln in lines] == [
        ("staging-stored", 23_000, "", ""),
        ("staging-stored", 3_151, "", ""),
    ]
