"""Engines for SQLite, PostgreSQL and MariaDB, and the few places the dialects differ."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Insert, Table, create_engine, event, insert
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError

from slurm_burst.core.redact import redact
from slurm_burst.core.usage import LedgerConflict, LedgerError, LedgerUnavailable
from slurm_burst.fileio import check_sqlite_files, create_new, ensure_dir, file_error


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, foreign keys and a busy timeout."""
    try:
        parsed = make_url(url)
    except (SQLAlchemyError, ValueError) as exc:  # ArgumentError; a bad port number
        raise LedgerError(
            redact(f"ledger.url {url!r} is not a database URL: {exc}")
        ) from None  # the cause quotes the URL too
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _create_private(Path(str(parsed.database)))
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() in ("postgresql", "mysql"):
        kwargs["connect_args"] = {"connect_timeout": 5}
    try:
        engine = create_engine(url, **kwargs)
    except (SQLAlchemyError, ImportError, TypeError, ValueError) as exc:  # missing driver
        # module, an option the dialect does not take
        raise LedgerError(redact(f"ledger.url {parsed.render_as_string()}: {exc}")) from None
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    return engine


def _create_private(path: Path) -> None:
    """A new SQLite ledger is the daemon's alone (0600, whatever the umask); SQLite gives
    its -wal and -shm the same mode. An existing file is left as the site made it."""
    try:
        ensure_dir(path.parent, 0o750, what="the ledger's directory")
        create_new(path, 0o600)
        check_sqlite_files(path)  # the file and its journal: plain files, never links
    except OSError as exc:
        raise LedgerError(f"ledger database {path}: {file_error(exc)}") from None


def insert_ignore(engine: Engine, table: Table) -> Insert:
    """INSERT that skips rows whose unique key exists: replays add nothing."""
    name = engine.dialect.name
    if name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if name in ("mysql", "mariadb"):
        return insert(table).prefix_with("IGNORE")
    raise LedgerError(f"ledger: database {name!r} is not supported (sqlite, postgresql, mysql)")


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn a lost or refused connection into LedgerUnavailable, other errors into LedgerError."""
    try:
        yield
    except IntegrityError as exc:
        raise LedgerConflict(f"{what}: already recorded: {_first_line(exc)}") from exc
    except OperationalError as exc:
        raise LedgerUnavailable(f"{what}: database unreachable: {_first_line(exc)}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise LedgerUnavailable(f"{what}: connection lost: {_first_line(exc)}") from exc
        raise LedgerError(f"{what}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def bulk_insert(
    conn: Connection, table: Table, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> None:
    """Insert many plain rows fast: COPY on PostgreSQL, the driver's executemany elsewhere.

    The values must already be what the columns store (no type processing): ints,
    strings, dates. A duplicate key fails the transaction, as an INSERT would.
    """
    if not rows:
        return
    raw = conn.connection.driver_connection
    assert raw is not None
    quote = {"postgresql": '"', "sqlite": '"'}.get(conn.dialect.name, "`")
    # names come from our own table metadata, never from input; values are bound
    cols = ", ".join(f"{quote}{c}{quote}" for c in columns)
    if conn.dialect.name == "postgresql":
        with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        return
    mark = "?" if conn.dialect.name == "sqlite" else "%s"
    marks = ", ".join([mark] * len(columns))
    sql = f"INSERT INTO {table.name} ({cols}) VALUES ({marks})"  # noqa: S608
    cur = raw.cursor()
    try:
        cur.executemany(sql, rows)
    finally:
        cur.close()
