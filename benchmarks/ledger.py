"""Ledger benchmark: 10 million synthetic usage (charge) rows on SQLite and PostgreSQL.

For each database: a fresh database migrated by Alembic; charge lines written
through the ledger's own write path (``SqlLedger.add_charges``: the lines and
their per-pass rollups in one transaction per batch of 50,000, as the daemon's
allocation passes write them) -> ingest rows/s; then the month x account
report for one month (best and median of 5) and its peak memory, measured in a
fresh process (ru_maxrss). Also the sacct ingest path (``record_jobs``) on
200,000 job rows. Goals (issue 4): report <= 1 s on PostgreSQL and <= 3 s on
SQLite, ingest >= 20,000 rows/s, report memory <= 200 MB.

    python benchmarks/ledger.py [--rows N] [--db sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from slurm_burst.adapters.ledger import migrate  # noqa: E402
from slurm_burst.adapters.ledger.engine import make_engine  # noqa: E402
from slurm_burst.adapters.ledger.sql import SqlLedger  # noqa: E402
from slurm_burst.core.allocation import OVERHEAD, USAGE, Charge  # noqa: E402
from slurm_burst.core.usage import JobUsage  # noqa: E402

BATCH = 50_000
ACCOUNTS = [f"acct{i:03d}" for i in range(200)]
USERS = [f"user{i:04d}" for i in range(500)]  # each in one account, using 1-2 partitions
PARTS = ["burst-cpu", "burst-gpu", "burst-hpc", "burst-mem"]
START = date(2026, 8, 1)
DAYS = 92  # August to October: the report asks for September


def lines(n: int, seed: int = 1) -> Iterator[list[Charge]]:
    """``n`` charge lines in time order, a batch at a time, as allocation passes write them.

    Batches are made on demand: 10 million lines held at once would need gigabytes.
    """
    rnd = random.Random(seed)
    per_day = max(1, n // DAYS)
    k = 0
    while k < n:
        size = min(BATCH, n - k)
        batch = []
        for i in range(size):
            idx = k + i
            day = (START + timedelta(days=min(DAYS - 1, idx // per_day))).isoformat()
            kind = OVERHEAD if idx % 5 == 0 else USAGE
            u = rnd.randrange(len(USERS))
            batch.append(
                Charge(
                    f"i-{idx // 3:09d}",
                    day,
                    kind,
                    ACCOUNTS[u % len(ACCOUNTS)],
                    USERS[u],
                    PARTS[(u + rnd.randrange(2)) % len(PARTS)],
                    f"bench:{idx}:0",
                    rnd.randrange(1, 5_000_000),
                    rnd.randrange(1, 3_600_000),
                    rnd.randrange(0, 14_400_000),
                )
            )
        yield batch
        k += size


def report_child(url: str) -> None:
    """Run in a fresh process: time the report and print its peak RSS."""
    from slurm_burst.adapters.ledger.reports import report

    engine = make_engine(url)
    samples = []
    rows: list[dict[str, object]] = []
    for _ in range(5):
        t = time.perf_counter()
        rows = report(engine, ["month", "account"], date(2026, 9, 1), date(2026, 10, 1))
        samples.append(time.perf_counter() - t)
    samples.sort()
    # VmHWM: this process's own peak (ru_maxrss would include the parent's, kept over exec)
    hwm = next(ln for ln in Path("/proc/self/status").read_text().splitlines()
               if ln.startswith("VmHWM:"))  # fmt: skip
    rss = int(hwm.split()[1]) / 1024
    print(json.dumps({"best": samples[0], "median": samples[2], "rows": len(rows), "rss_mb": rss}))


def bench(kind: str, n: int, tmp: Path) -> None:
    name = f"sbbench_{uuid.uuid4().hex[:8]}"
    admin = None
    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'ledger.db'}"
    else:
        admin = create_engine("postgresql+psycopg://root@127.0.0.1/postgres",
                              isolation_level="AUTOCOMMIT", poolclass=NullPool)  # fmt: skip
        with admin.connect() as c:
            c.execute(text(f"CREATE DATABASE {name}"))
        url = f"postgresql+psycopg://root@127.0.0.1/{name}"
    try:
        engine = make_engine(url)
        migrate.upgrade(engine)
        led = SqlLedger(url, "bench", engine=engine)
        ingest = 0.0  # time in the ledger's write path only, not in making the lines
        for i, b in enumerate(lines(n), 1):
            t = time.perf_counter()
            led.add_charges(b)
            ingest += time.perf_counter() - t
            if i % 40 == 0:
                print(f"  {kind}: {i * BATCH:,} rows ...", file=sys.stderr)
        if kind == "postgresql":
            with engine.connect() as c:
                c.execute(text("ANALYZE"))
                c.commit()
        out = subprocess.run([sys.executable, __file__, "--report-child", url],
                             capture_output=True, text=True, check=True)  # fmt: skip
        r = json.loads(out.stdout)
        goal = 1.0 if kind == "postgresql" else 3.0
        rate = n / ingest
        print(f"{kind:<11} ingest {n:,} charge rows      {ingest:8.1f} s  {rate:10,.0f} rows/s"
              f"  (goal >= 20,000){'  OK' if rate >= 20_000 else '  UNDER GOAL'}")  # fmt: skip
        print(f"{kind:<11} report month x account      best {r['best']:.3f} s  median "
              f"{r['median']:.3f} s  ({r['rows']} rows; goal <= {goal:g} s)"
              f"{'  OK' if r['median'] <= goal else '  OVER GOAL'}")  # fmt: skip
        print(f"{kind:<11} report peak memory          {r['rss_mb']:.0f} MB  (goal <= 200 MB)"
              f"{'  OK' if r['rss_mb'] <= 200 else '  OVER GOAL'}")  # fmt: skip
        jobs = [
            JobUsage("bench", i, ACCOUNTS[i % 200], USERS[i % 500], PARTS[i % 4],
                     f"burst-cpu-{i % 500}", 1, 2, 0, 1000,
                     datetime(2026, 9, 1, tzinfo=UTC) + timedelta(seconds=i),
                     datetime(2026, 9, 1, tzinfo=UTC) + timedelta(seconds=i),
                     datetime(2026, 9, 1, tzinfo=UTC) + timedelta(seconds=i + 600), "COMPLETED")
            for i in range(200_000)
        ]  # fmt: skip
        t = time.perf_counter()
        for i in range(0, len(jobs), 20_000):
            led.record_jobs(jobs[i : i + 20_000], (jobs[i].start, jobs[i].end))
        dt = time.perf_counter() - t
        print(
            f"{kind:<11} sacct job ingest 200,000 rows  {dt:8.1f} s  {len(jobs) / dt:10,.0f} rows/s"
        )
        engine.dispose()
    finally:
        if admin is not None:
            with admin.connect() as c:
                c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--db", default="sqlite,postgresql")
    ap.add_argument("--report-child")
    args = ap.parse_args()
    if args.report_child:
        report_child(args.report_child)
        return
    print(f"ledger: {args.rows:,} synthetic charge rows per database, {len(ACCOUNTS)} accounts, "
          f"{DAYS} days")  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        for kind in args.db.split(","):
            bench(kind, args.rows, Path(d))


if __name__ == "__main__":
    main()
