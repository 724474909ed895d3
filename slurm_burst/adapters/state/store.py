"""The daemon's state database: requests from the hooks, each node's state, the mesh
address pool, events and the heartbeat. SQLite (stdlib), WAL, one file on the
controller host.

Why not the SQL ledger's engine: the hooks write here, and they must return in
well under 300 ms; the stdlib driver opens a database in about a millisecond.
Every write is its own transaction (``BEGIN IMMEDIATE``), so a request a hook
recorded survives a crash of either side, and two writers never interleave.

The schema's version is SQLite's ``user_version``; :data:`MIGRATIONS` bring an
older database forward when it is opened (version 1 renamed ``grp`` to
``node_group``), so an upgrade keeps every in-flight node.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from slurm_burst.core.nodestate import NodeState, Want, check_transition
from slurm_burst.core.records import (
    NODE_FIELDS,
    Batch,
    DuplicateRequest,
    GroupHealth,
    NodeRecord,
    OutputRecord,
    OutputState,
    Placement,
    PoolExhausted,
    Request,
    StageRecord,
    StoreError,
    WarmOverride,
)
from slurm_burst.core.slurm import JobOwner
from slurm_burst.fileio import (
    FileRefused,
    check_sqlite_files,
    create_new,
    ensure_dir,
    file_error,
    share,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id         INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL CHECK (kind IN ('resume', 'suspend', 'resume-fail')),
    nodes      TEXT NOT NULL,            -- JSON list of node names
    jobs       TEXT NOT NULL DEFAULT '[]', -- JSON: the resume file's jobs
    created_at REAL NOT NULL,
    done_at    REAL,
    uid        TEXT                      -- the hook's id: one request, wherever it was kept
);
CREATE INDEX IF NOT EXISTS requests_pending ON requests (done_at) WHERE done_at IS NULL;
CREATE TABLE IF NOT EXISTS nodes (
    name        TEXT PRIMARY KEY,
    node_group  TEXT NOT NULL,
    state       TEXT NOT NULL,
    want        TEXT NOT NULL CHECK (want IN ('up', 'down')),
    error       TEXT NOT NULL DEFAULT '',
    message     TEXT NOT NULL DEFAULT '',
    provider    TEXT NOT NULL DEFAULT '',
    size        TEXT NOT NULL DEFAULT '',
    launch_seq  INTEGER NOT NULL DEFAULT 0,
    token       TEXT NOT NULL DEFAULT '',
    instance_id TEXT NOT NULL DEFAULT '',
    ip          TEXT NOT NULL DEFAULT '',
    host_keys   TEXT NOT NULL DEFAULT '[]',
    wg_pubkey   TEXT NOT NULL DEFAULT '',
    mesh_addr   TEXT NOT NULL DEFAULT '',
    jobs        TEXT NOT NULL DEFAULT '[]',
    requested_at REAL NOT NULL DEFAULT 0,
    state_since REAL NOT NULL DEFAULT 0,
    registered_at REAL NOT NULL DEFAULT 0, -- when slurmctld was seen to hear from its slurmd
    market      TEXT NOT NULL DEFAULT '',   -- 'spot' or '' (on-demand)
    placement   TEXT NOT NULL DEFAULT ''    -- the placement group of its instance
);
CREATE TABLE IF NOT EXISTS mesh_addresses (
    address      TEXT PRIMARY KEY,
    node         TEXT NOT NULL UNIQUE,
    allocated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS groups (
    name            TEXT PRIMARY KEY,
    failures        INTEGER NOT NULL DEFAULT 0,  -- failed launches in a row
    protected_until REAL NOT NULL DEFAULT 0,     -- 0 = not protected
    reason          TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS unavailable (
    provider TEXT NOT NULL,
    size     TEXT NOT NULL,
    until    REAL NOT NULL,
    code     TEXT NOT NULL,
    PRIMARY KEY (provider, size)
);
CREATE TABLE IF NOT EXISTS stages (
    job_id     INTEGER PRIMARY KEY,
    user       TEXT NOT NULL,
    uid        INTEGER NOT NULL,
    gid        INTEGER NOT NULL,
    account    TEXT NOT NULL,
    qos        TEXT NOT NULL DEFAULT '',
    partitions TEXT NOT NULL DEFAULT '',
    burst_only INTEGER NOT NULL DEFAULT 0,
    stages     TEXT NOT NULL,              -- JSON: [{"src", "dst"}]
    state      TEXT NOT NULL,
    message    TEXT NOT NULL DEFAULT '',
    datasets   TEXT NOT NULL DEFAULT '[]', -- JSON: per stage, its manifest, files, bytes
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS outputs (
    job_id    INTEGER NOT NULL,
    name      TEXT NOT NULL,                -- the directory on the node's stage directory
    home      TEXT NOT NULL,                -- where it lands on-prem
    sync      INTEGER NOT NULL DEFAULT 0,   -- seconds between syncs, 0: at the end only
    state     TEXT NOT NULL,
    node      TEXT NOT NULL DEFAULT '',
    manifest  TEXT NOT NULL DEFAULT '',     -- the last version synced
    files     INTEGER NOT NULL DEFAULT 0,
    bytes     INTEGER NOT NULL DEFAULT 0,
    synced_at REAL NOT NULL DEFAULT 0,
    message   TEXT NOT NULL DEFAULT '',
    updated_at REAL NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE TABLE IF NOT EXISTS events (
    id     INTEGER PRIMARY KEY,
    at     REAL NOT NULL,
    node   TEXT NOT NULL DEFAULT '',
    event  TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
"""


# Schema versions: each entry brings a database from version i to i + 1.
MIGRATIONS: tuple[str, ...] = (
    "ALTER TABLE nodes RENAME COLUMN grp TO node_group",
    "ALTER TABLE nodes ADD COLUMN registered_at REAL NOT NULL DEFAULT 0",
    "ALTER TABLE requests ADD COLUMN uid TEXT",
    "CREATE INDEX IF NOT EXISTS stages_state ON stages (state)",  # stages: made by SCHEMA
    "SELECT 1",  # outputs: made by SCHEMA
    "ALTER TABLE nodes ADD COLUMN market TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE nodes ADD COLUMN placement TEXT NOT NULL DEFAULT ''",
)
_OUTPUT_FIELDS = frozenset(
    {"sync", "state", "node", "manifest", "files", "bytes", "synced_at", "message"}
)
# Made after the migrations, on a new database and an upgraded one alike.
INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS requests_uid ON requests (uid) WHERE uid IS NOT NULL",
)
SCHEMA_VERSION = len(MIGRATIONS)

# NodeRecord field -> column, in field order (the record's names are the port's).
COLUMN = {f: ("node_group" if f == "group" else f) for f in NodeRecord._fields}
NODE_SELECT = "SELECT " + ", ".join(COLUMN.values()) + " FROM nodes"  # noqa: S608 - our names
NODE_RETURNING = " RETURNING " + ", ".join(COLUMN.values())
_STATE = {str(s): s for s in NodeState}

# the ``meta`` keys of small facts (an earlier release's, so an upgrade keeps them)
FOLLOWER = "follower."  # follower.<node id> -> {at, pid, leader}
BATCH = "batch."  # batch.<token> -> Batch.doc()
PLACEMENT = "placement."  # placement.<name> -> {provider, made}
NOTICED = "notice."  # notice.<instance id> -> {node, action, at}
REPLACED = "replaced."  # replaced.<node> -> {first, again}
WARM = "warm."  # warm.<group> -> {nodes, until}
PULLED = "staged."  # staged.<job>.<node> -> {at, fetched_bytes}
ASKED = "pull."  # pull.<job>.<node> -> when the prolog asked
PULL_FAILED = "pullfail."  # pullfail.<job>.<node> -> why


def _job_node(key: str) -> tuple[int, str]:
    job, node = key.split(".", 1)
    return int(job), node


_WANT = {str(w): w for w in Want}


def _record(row: sqlite3.Row) -> NodeRecord:
    """A record from a row selected with ``NODE_SELECT`` (the columns in field order)."""
    return NodeRecord(row[0], row[1], _STATE[row[2]], _WANT[row[3]], *row[4:])


def _stage(row: sqlite3.Row) -> StageRecord:
    owner = JobOwner(
        row["job_id"],
        row["user"],
        row["uid"],
        row["gid"],
        row["account"],
        row["qos"],
        tuple(row["partitions"].split(",")) if row["partitions"] else (),
    )
    return StageRecord(
        owner=owner, burst_only=bool(row["burst_only"]), stages=json.loads(row["stages"]),
        state=row["state"], message=row["message"], datasets=json.loads(row["datasets"]),
        created_at=row["created_at"], updated_at=row["updated_at"],
    )  # fmt: skip


def _sets(changes: dict[str, Any]) -> tuple[str, list[Any]]:
    """``col = ?, ...`` and its values; enum values stored as their text."""
    return ", ".join(f"{COLUMN[k]} = ?" for k in changes), [
        str(v) if isinstance(v, NodeState | Want) else v for v in changes.values()
    ]


class Store:
    """Thread-safe access to the state database (one connection, one lock).

    ``create``: make the file and schema if missing (the daemon, the hooks); readers pass
    False. ``upgrade``: bring an older release's schema forward. Only the daemon should:
    during an upgrade the old daemon may still run on the old schema, and the hooks
    (new code, run by slurmctld) must not change it under it. Opened without
    ``upgrade``, an older database still takes requests and heartbeats (their tables
    never changed); reading or changing nodes says to restart the daemon.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        create: bool = True,
        upgrade: bool = True,
        group: int | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.outdated = False  # an older schema left in place for the daemon to upgrade
        if create:
            self._make_file(group)
        elif not self.path.exists():
            raise StoreError(f"state database {self.path} does not exist (is the daemon set up?)")
        self._check_files()
        try:
            self._db = sqlite3.connect(
                f"file:{quote(str(self.path.absolute()))}?nofollow=1",
                timeout=timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=True,
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if create:
                self._use_wal(timeout)
            if self._version() != SCHEMA_VERSION:
                self._set_up(create, upgrade)
            if create:
                self._share_journal(group)
            self._db.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise StoreError(f"state database {self.path}: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"state database {self.path}: {exc.strerror or exc}") from None
        self._lock = threading.RLock()
        self._depth = 0  # tx() blocks open: inside one, a write is a savepoint

    def _use_wal(self, timeout: float) -> None:
        """Switch a new database to WAL (a database stays in it). The switch takes the
        exclusive lock without SQLite's busy handler: a reader opening the new file at
        that moment (a hook, ``lab up`` waiting for the heartbeat) made it fail at once
        with "database is locked", so it is retried here until ``timeout``."""
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _make_file(self, group: int | None) -> None:
        """The directory 0770 and the database 0660, in SlurmUser's ``group``: the hooks
        (SlurmUser) write requests, the daemon (root) the rest. Made before SQLite opens
        it, so its -wal and -shm (SQLite gives them the database's mode and owner) are
        never wider. One that exists is left as it is (:meth:`_check_files` checks it)."""
        try:
            ensure_dir(self.path.parent, 0o770, group, "state directory")
            create_new(self.path, 0o660, group)
        except OSError as exc:
            raise StoreError(f"state database {self.path}: {file_error(exc)}") from None

    def _check_files(self) -> None:
        """The database and its journal files are plain files (a symlink or device
        planted under one of their names is refused before SQLite opens anything)."""
        try:
            check_sqlite_files(self.path)
        except FileRefused as exc:
            raise StoreError(f"state database: {exc}") from None

    def _share_journal(self, group: int | None) -> None:
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                share(f"{self.path}{suffix}", 0o660, group)

    def _has_schema(self) -> bool:
        return bool(self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'nodes'").fetchone())

    def _version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _set_up(self, create: bool, upgrade: bool) -> None:
        """Create the schema, or bring an older one forward, in one transaction.

        Taken with BEGIN IMMEDIATE and re-read inside it: two processes opening the
        same new or old database at once (two hooks) set it up once.
        """
        db = self._db
        if not create and not self._has_schema():  # said without taking the write lock
            raise StoreError(f"state database {self.path} is empty (has the daemon run?)")
        db.execute("BEGIN IMMEDIATE")
        try:
            version = self._version()
            fresh = not self._has_schema()
            if fresh and not create:
                raise StoreError(f"state database {self.path} is empty (has the daemon run?)")
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"state database {self.path} has schema version {version}, newer than "
                    f"this slurm-burst's {SCHEMA_VERSION}: a newer release wrote it"
                )
            if not fresh and version < SCHEMA_VERSION and not upgrade:
                self.outdated = True
                db.execute("ROLLBACK")
                return
            for statement in SCHEMA.split(";"):  # CREATE ... IF NOT EXISTS: what is missing
                if statement.strip():
                    db.execute(statement)
            for sql in (*(() if fresh else MIGRATIONS[version:]), *INDEXES):
                db.execute(sql)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE) so writers queue.

        Inside :meth:`atomically` it is a savepoint of the outer transaction instead: a
        write that fails is undone alone, and nothing is committed until the outer ends.
        SQLite's errors leave it as the port's StoreError.
        """
        with self._lock, self._failing_as_store_error():
            nested = self._depth > 0  # ours to count: a transaction left open by a failed
            # COMMIT must fail the next write, not swallow it as a savepoint
            self._db.execute("SAVEPOINT w" if nested else "BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK TO w" if nested else "ROLLBACK")
                if nested:
                    self._db.execute("RELEASE w")
                raise
            finally:
                self._depth -= 1
            try:
                self._db.execute("RELEASE w" if nested else "COMMIT")
            except BaseException:
                if not nested:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise

    @contextmanager
    def atomically(self) -> Iterator[None]:
        """Every write inside is one transaction: all of it lands, or none if the block
        raises. Other threads' reads and writes wait until it ends."""
        with self.tx():
            yield

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock, self._failing_as_store_error():
            return list(self._db.execute(sql, args))

    # -- heartbeat ------------------------------------------------------------
    def beat(self, now: float, info: Mapping[str, Any]) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES ('heartbeat', ?)",
                (json.dumps({"at": now, **info}),),
            )

    def heartbeat(self) -> dict[str, Any] | None:
        rows = self._read("SELECT value FROM meta WHERE key = 'heartbeat'")
        return dict(json.loads(rows[0]["value"])) if rows else None

    @contextmanager
    def _failing_as_store_error(self) -> Iterator[None]:
        """SQLite's errors (locked past the timeout, disk full, a damaged file) as the
        port's StoreError: what the hooks act on to keep a request elsewhere, and what
        the daemon's loops wait out. Every read (:meth:`_read`) and write (:meth:`tx`)
        passes here."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"state database {self.path}: {exc}") from exc

    # -- small facts, kept in ``meta`` under the keys of earlier releases ----------
    def _get(self, key: str) -> Any:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else None

    def _items(self, prefix: str) -> dict[str, Any]:
        """The facts whose key starts with ``prefix``, by the rest of the key."""
        rows = self._read(
            "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
        )
        return {r["key"][len(prefix) :]: json.loads(r["value"]) for r in rows}

    def _set(self, key: str, value: Any) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def _delete(self, key: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM meta WHERE key = ?", (key,))

    def check_writable(self, now: float) -> None:
        self._set("writable_at", now)

    # -- who acts ---------------------------------------------------------------
    def follower(self, node_id: str, info: Mapping[str, Any] | None) -> None:
        if info is None:
            self._delete(f"{FOLLOWER}{node_id}")
        else:
            self._set(f"{FOLLOWER}{node_id}", dict(info))

    def followers(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self._items(FOLLOWER).items() if isinstance(v, dict)}

    # -- what the periodic passes leave -------------------------------------------
    def last_pass(self) -> dict[str, Any] | None:
        got = self._get("reconcile")
        return dict(got) if isinstance(got, dict) else None

    def record_pass(self, summary: Mapping[str, Any]) -> None:
        self._set("reconcile", dict(summary))

    def suspects(self) -> dict[str, float]:
        got = self._get("suspects")
        return {str(k): float(v) for k, v in got.items()} if isinstance(got, dict) else {}

    def set_suspects(self, suspects: Mapping[str, float]) -> None:
        self._set("suspects", dict(suspects))

    def policy_report(self) -> dict[str, Any] | None:
        got = self._get("policy")
        return dict(got) if isinstance(got, dict) else None

    def set_policy_report(self, doc: Mapping[str, Any]) -> None:
        self._set("policy", dict(doc))

    # -- launches in flight ----------------------------------------------------------
    def installation(self, make: Callable[[], str]) -> str:
        with self.tx():
            got = self._get("installation")
            if not got:
                got = make()
                self._set("installation", got)
        return str(got)

    def begin_batch(self, batch: Batch) -> None:
        self._set(f"{BATCH}{batch.token}", batch.doc())

    def batch(self, token: str) -> Batch | None:
        got = self._get(f"{BATCH}{token}")
        return Batch.from_doc(token, got) if isinstance(got, dict) else None

    def end_batch(self, token: str) -> None:
        self._delete(f"{BATCH}{token}")

    def placements(self) -> dict[str, Placement]:
        return {
            name: Placement(name, str(v.get("provider", "")), bool(v.get("made")))
            for name, v in self._items(PLACEMENT).items()
            if isinstance(v, dict)
        }

    def set_placement(self, placement: Placement) -> None:
        doc: dict[str, Any] = {"provider": placement.provider}
        if placement.made:
            doc["made"] = True
        self._set(f"{PLACEMENT}{placement.name}", doc)

    def forget_placement(self, name: str) -> None:
        self._delete(f"{PLACEMENT}{name}")

    def notice_seen(self, instance_id: str, node: str, action: str, at: float) -> bool:
        with self.tx():
            if self._get(f"{NOTICED}{instance_id}") is not None:
                return False
            self._set(f"{NOTICED}{instance_id}", {"node": node, "action": action, "at": at})
            return True

    def replaced(self, node: str) -> tuple[float, float] | None:
        got = self._get(f"{REPLACED}{node}")
        if not isinstance(got, dict):
            return None
        return float(got.get("first") or 0.0), float(got.get("again") or 0.0)

    def set_replaced(self, node: str, first: float, again: float) -> None:
        self._set(f"{REPLACED}{node}", {"first": first, "again": again})

    # -- pulls of a job's data onto its nodes -----------------------------------------
    def pulled(self, job_id: int, node: str, at: float, fetched_bytes: int) -> None:
        self._set(f"{PULLED}{int(job_id)}.{node}", {"at": at, "fetched_bytes": fetched_bytes})

    def pulled_on(self, job_id: int) -> list[str]:
        return sorted(self._items(f"{PULLED}{int(job_id)}."))

    def ask_pull(self, job_id: int, node: str, at: float) -> None:
        self._set(f"{ASKED}{int(job_id)}.{node}", at)

    def pulls_asked(self) -> list[tuple[int, str]]:
        return sorted(_job_node(k) for k in self._items(ASKED))

    def pull_done(self, job_id: int, node: str, failure: str = "") -> None:
        with self.tx():
            if failure:
                self._set(f"{PULL_FAILED}{int(job_id)}.{node}", failure)
            self._delete(f"{ASKED}{int(job_id)}.{node}")

    def pull_failure(self, job_id: int, node: str) -> str:
        return str(self._get(f"{PULL_FAILED}{int(job_id)}.{node}") or "")

    def _forget_pulls(self, db: sqlite3.Connection) -> None:
        """The pulls of every job with no stage left."""
        known = {int(r[0]) for r in db.execute("SELECT job_id FROM stages")}
        gone = [(f"{prefix}{key}",) for prefix in (PULLED, ASKED, PULL_FAILED)
                for key in self._items(prefix) if _job_node(key)[0] not in known]  # fmt: skip
        db.executemany("DELETE FROM meta WHERE key = ?", gone)

    # -- node groups: failures in a row, protected mode -----------------------
    def groups(self) -> dict[str, GroupHealth]:
        return {
            r["name"]: GroupHealth(r["name"], r["failures"], r["protected_until"], r["reason"])
            for r in self._read("SELECT * FROM groups")
        }

    def group_launch_result(self, name: str, ok: bool) -> int:
        """Count a failed launch (or reset on a join); return the failures in a row."""
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO groups (name) VALUES (?)", (name,))
            if ok:
                db.execute("UPDATE groups SET failures = 0 WHERE name = ?", (name,))
            else:
                db.execute("UPDATE groups SET failures = failures + 1 WHERE name = ?", (name,))
            return int(
                next(iter(db.execute("SELECT failures FROM groups WHERE name = ?", (name,))))[0]
            )

    def protect_group(self, name: str, until: float, reason: str) -> None:
        with self.tx() as db:
            db.execute("INSERT OR IGNORE INTO groups (name) VALUES (?)", (name,))
            db.execute(
                "UPDATE groups SET protected_until = ?, reason = ? WHERE name = ?",
                (until, reason, name),
            )

    def unprotect_group(self, name: str) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE groups SET protected_until = 0, reason = '', failures = 0 WHERE name = ?",
                (name,),
            )

    # -- sizes unavailable after a capacity error -----------------------------
    def mark_unavailable(self, provider: str, size: str, until: float, code: str) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO unavailable VALUES (?, ?, ?, ?)",
                (provider, size, until, code),
            )

    def unavailable(self, now: float) -> dict[tuple[str, str], tuple[float, str]]:
        return {
            (r["provider"], r["size"]): (r["until"], r["code"])
            for r in self._read("SELECT * FROM unavailable WHERE until > ?", (now,))
        }

    # -- a warm pool's override (slurm-burst group warm) ------------------------
    def warm_override(self, group: str) -> WarmOverride | None:
        got = self._get(f"{WARM}{group}")
        if not isinstance(got, dict):
            return None
        return WarmOverride(int(got.get("nodes") or 0), float(got.get("until") or 0.0))

    def set_warm_override(self, group: str, override: WarmOverride | None) -> None:
        if override is None:
            self._delete(f"{WARM}{group}")
        else:
            self._set(f"{WARM}{group}", {"nodes": override.nodes, "until": override.until})

    # -- requests (hooks write, the daemon consumes) --------------------------
    def add_request(
        self,
        kind: str,
        nodes: Sequence[str],
        jobs: Sequence[Mapping[str, Any]],
        now: float,
        uid: str = "",
    ) -> int:
        """Record a request; one with the ``uid`` of a request already recorded (from the
        spool, after it reached the database too) is that one: its id is returned. A
        uid already naming another request (kind, nodes, jobs) is DuplicateRequest."""
        values = (kind, json.dumps(list(nodes)), json.dumps([dict(j) for j in jobs]), now)
        with self.tx() as db:
            if not uid or self.outdated:  # an older schema has no uid until the daemon upgrades
                cur = db.execute(
                    "INSERT INTO requests (kind, nodes, jobs, created_at) VALUES (?, ?, ?, ?)",
                    values,
                )
                return int(cur.lastrowid or 0)
            db.execute(
                "INSERT INTO requests (kind, nodes, jobs, created_at, uid) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (uid) WHERE uid IS NOT NULL DO NOTHING",
                (*values, uid),
            )
            row = db.execute(
                "SELECT id, kind, nodes, jobs FROM requests WHERE uid = ?", (uid,)
            ).fetchone()
            if (row["kind"], row["nodes"], row["jobs"]) != values[:3]:
                raise DuplicateRequest(f"request uid {uid} already names request {row['id']}")
            return int(row["id"])

    def pending_requests(self) -> list[Request]:
        return [
            Request(
                r["id"],
                r["kind"],
                tuple(json.loads(r["nodes"])),
                json.loads(r["jobs"]),
                r["created_at"],
            )
            # in the order the hooks made them: a spooled request drained late keeps its place
            for r in self._read(
                "SELECT * FROM requests WHERE done_at IS NULL ORDER BY created_at, id"
            )
        ]

    def finish_request(self, request_id: int, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE requests SET done_at = ? WHERE id = ?", (now, request_id))

    # -- stages (the stage-in hook writes, the daemon works them) ---------------
    def add_stage(self, rec: StageRecord) -> StageRecord:
        """Record a job's stage-in; a job that has one already keeps it (Slurm runs its
        stage-in again after a slurmctld restart), unless it failed: then it starts over
        as ``rec``. Returns what is recorded."""
        self._require_current()
        o = rec.owner
        row = (o.job_id, o.user, o.uid, o.gid, o.account, o.qos, ",".join(o.partitions),
               int(rec.burst_only), json.dumps(rec.stages), rec.state, rec.message,
               json.dumps(rec.datasets), rec.created_at, rec.updated_at)  # fmt: skip
        with self.tx() as db:
            db.execute(
                "INSERT INTO stages VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (job_id) DO UPDATE SET user = excluded.user, uid = excluded.uid,"
                " gid = excluded.gid, account = excluded.account, qos = excluded.qos,"
                " partitions = excluded.partitions, burst_only = excluded.burst_only,"
                " stages = excluded.stages, state = excluded.state, message = '',"
                " datasets = '[]', updated_at = excluded.updated_at"
                " WHERE stages.state = 'failed'",
                row,
            )
            got = db.execute("SELECT * FROM stages WHERE job_id = ?", (rec.job_id,)).fetchone()
        return _stage(got)

    def stage(self, job_id: int) -> StageRecord | None:
        rows = self._read("SELECT * FROM stages WHERE job_id = ?", (int(job_id),))
        return _stage(rows[0]) if rows else None

    def stages(self, states: Sequence[str] = ()) -> list[StageRecord]:
        if not states:
            return [_stage(r) for r in self._read("SELECT * FROM stages ORDER BY job_id")]
        marks = ", ".join("?" for _ in states)
        return [
            _stage(r)
            for r in self._read(
                f"SELECT * FROM stages WHERE state IN ({marks}) ORDER BY job_id",  # noqa: S608
                list(states),
            )
        ]

    def update_stage(
        self, job_id: int, now: float, *, expect: Sequence[str] = (), **changes: Any
    ) -> bool:
        """Change a stage's ``state``, ``message`` or ``datasets``; with ``expect``, only
        from one of those states (False: it was not in one)."""
        cols = {k: (json.dumps(v) if k == "datasets" else v) for k, v in changes.items()}
        unknown = set(cols) - {"state", "message", "datasets"}
        if unknown:
            raise ValueError(f"not a stage field: {sorted(unknown)}")
        return self._update_row("stages", "job_id = ?", [int(job_id)], now, expect, cols)

    def _update_row(
        self, table: str, key: str, key_args: list[Any], now: float, expect: Sequence[str],
        cols: Mapping[str, Any],
    ) -> bool:  # fmt: skip
        """Set ``cols`` (checked names) and updated_at of the row of ``table`` where
        ``key``; with ``expect``, only from one of those states. True if it changed."""
        sets = ", ".join(f"{k} = ?" for k in cols)
        where = " AND state IN (" + ", ".join("?" for _ in expect) + ")" if expect else ""
        with self.tx() as db:
            cur = db.execute(
                f"UPDATE {table} SET {sets}, updated_at = ? WHERE {key}{where}",  # noqa: S608
                [*cols.values(), now, *key_args, *expect],
            )
            return cur.rowcount == 1

    # -- outputs (the stage-in hook records them, the daemon syncs and seals them) ----
    def add_outputs(self, recs: Sequence[OutputRecord]) -> None:
        """Record a job's stage-outs; those recorded already stay as they are (Slurm runs
        stage-in again after a slurmctld restart, and a requeued job keeps its syncs)."""
        with self.tx() as db:
            db.executemany(
                "INSERT INTO outputs (job_id, name, home, sync, state, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, name) DO NOTHING",
                [(r.job_id, r.name, r.home, r.sync, r.state, r.updated_at) for r in recs],
            )

    def outputs(self, job_id: int | None = None, states: Sequence[str] = ()) -> list[OutputRecord]:
        where: list[str] = []
        args: list[object] = []
        if job_id is not None:
            where.append("job_id = ?")
            args.append(int(job_id))
        if states:
            where.append("state IN (" + ", ".join("?" for _ in states) + ")")
            args.extend(states)
        cond = " WHERE " + " AND ".join(where) if where else ""  # our words, values bound
        rows = self._read(f"SELECT * FROM outputs{cond} ORDER BY job_id, name", args)  # noqa: S608
        return [OutputRecord(**{k: r[k] for k in r.keys()}) for r in rows]  # noqa: SIM118

    def update_output(
        self, job_id: int, name: str, now: float, *, expect: Sequence[str] = (), **changes: Any
    ) -> bool:
        """Change a stage-out's fields (not its job, name or home); with ``expect``, only
        from one of those states (False: it was not in one)."""
        unknown = set(changes) - _OUTPUT_FIELDS
        if unknown:
            raise ValueError(f"not an output field: {sorted(unknown)}")
        return self._update_row(
            "outputs", "job_id = ? AND name = ?", [int(job_id), name], now, expect, changes
        )

    def forget_stages(self, before: float) -> int:
        """Drop the records of stages last changed before ``before`` (and the pulls of
        jobs with no stage left); how many."""
        with self.tx() as db:
            db.execute(
                "DELETE FROM outputs WHERE updated_at < ? AND state IN (?, ?)",
                (before, OutputState.SEALED, OutputState.LOST),
            )
            gone = int(db.execute("DELETE FROM stages WHERE updated_at < ?", (before,)).rowcount)
            self._forget_pulls(db)
            return gone

    # -- nodes ----------------------------------------------------------------
    def _require_current(self) -> None:
        if self.outdated:
            raise StoreError(
                f"state database {self.path} has an older release's schema; the daemon "
                "upgrades it when it starts: restart slurm-burst (systemctl restart slurm-burst)"
            )

    def node(self, name: str) -> NodeRecord | None:
        self._require_current()
        rows = self._read(f"{NODE_SELECT} WHERE name = ?", (name,))
        return _record(rows[0]) if rows else None

    def nodes(self) -> list[NodeRecord]:
        self._require_current()
        return [_record(r) for r in self._read(f"{NODE_SELECT} ORDER BY name")]

    def nodes_named(self, names: Sequence[str]) -> dict[str, NodeRecord]:
        """The records of ``names`` that exist (a prolog's nodes), in a few queries."""
        self._require_current()
        out: dict[str, NodeRecord] = {}
        unique = sorted(set(names))
        for start in range(0, len(unique), 500):  # well under SQLite's bound-variable limit
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._read(f"{NODE_SELECT} WHERE name IN ({marks})", chunk):
                rec = _record(row)
                out[rec.name] = rec
        return out

    def transition(
        self, name: str, new: NodeState, now: float, group: str = "", **changes: Any
    ) -> NodeRecord:
        """Move ``name`` to ``new`` (checked against the state machine) and set ``changes``.

        A node seen for the first time is created in ``group`` (want down unless
        ``changes`` says otherwise).
        """
        bad = set(changes) - NODE_FIELDS
        if bad:
            raise ValueError(f"unknown node fields {sorted(bad)}")
        self._require_current()
        with self.tx() as db:
            rows = list(db.execute(f"{NODE_SELECT} WHERE name = ?", (name,)))
            old = _record(rows[0]) if rows else None
            check_transition(old.state if old else None, new)
            if old is None:
                db.execute(
                    "INSERT INTO nodes (name, node_group, state, want, state_since) "
                    "VALUES (?,?,?,?,?)",
                    (name, group, str(new), str(changes.pop("want", Want.DOWN)), now),
                )
            values = {**changes, "state": new}
            if old is None or old.state != new:
                values["state_since"] = now
            sets, args = _sets(values)
            update = f"UPDATE nodes SET {sets} WHERE name = ?{NODE_RETURNING}"  # noqa: S608 - column names are checked above
            row = db.execute(update, (*args, name)).fetchone()
            db.execute(
                "INSERT INTO events (at, node, event, detail) VALUES (?, ?, ?, ?)",
                (now, name, f"node.{new}", changes.get("error", "")),
            )
        return _record(row)

    def update(self, name: str, **changes: Any) -> None:
        """Set fields of ``name`` without a state change (want, ip, host keys...)."""
        bad = set(changes) - NODE_FIELDS
        if bad or "state" in changes:
            wrong = sorted(bad | ({"state"} & set(changes)))
            raise ValueError(f"update cannot set {wrong}")  # noqa: S608 - not SQL
        if not changes:
            return
        self._require_current()
        sets, args = _sets(changes)
        with self.tx() as db:
            db.execute(f"UPDATE nodes SET {sets} WHERE name = ?", (*args, name))  # noqa: S608 - column names are checked above

    def event(self, now: float, event: str, node: str = "", detail: str = "") -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO events (at, node, event, detail) VALUES (?, ?, ?, ?)",
                (now, node, event, detail),
            )

    def events(self, since_id: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        return [
            dict(r)
            for r in self._read(
                "SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?", (since_id, limit)
            )
        ]

    # -- mesh address pool ----------------------------------------------------
    def allocate_address(self, node: str, subnet: str, now: float) -> str:
        """The node's mesh address: its existing one, or the lowest free host address.

        The hub holds the subnet's first host address. The primary key and the
        UNIQUE node column make a duplicate impossible even across processes.
        """
        net = ipaddress.ip_network(subnet)
        with self.tx() as db:
            row = list(db.execute("SELECT address FROM mesh_addresses WHERE node = ?", (node,)))
            if row:
                return str(row[0]["address"])
            used = {r["address"] for r in db.execute("SELECT address FROM mesh_addresses")}
            hosts = net.hosts()
            next(hosts)  # the hub's
            for host in hosts:
                if str(host) not in used:
                    db.execute(
                        "INSERT INTO mesh_addresses VALUES (?, ?, ?)", (str(host), node, now)
                    )
                    return str(host)
        raise PoolExhausted(f"mesh subnet {subnet} has no free address left")

    def allocate_addresses(self, nodes: Sequence[str], subnet: str, now: float) -> dict[str, str]:
        """:meth:`allocate_address` for many nodes: one transaction and one pass over
        the pool (a 1,000-node resume: milliseconds, not a second)."""
        net = ipaddress.ip_network(subnet)
        out: dict[str, str] = {}
        with self.tx() as db:
            have = {r["node"]: r["address"] for r in db.execute("SELECT * FROM mesh_addresses")}
            used = set(have.values())
            hosts = net.hosts()
            next(hosts)  # the hub's
            for node in nodes:
                if node in have:
                    out[node] = str(have[node])
                    continue
                host = next((h for h in hosts if str(h) not in used), None)
                if host is None:
                    break  # the pool is full: the rest get none
                db.execute("INSERT INTO mesh_addresses VALUES (?, ?, ?)", (str(host), node, now))
                out[node] = have[node] = str(host)
        return out

    def release_address(self, node: str) -> str | None:
        with self.tx() as db:
            row = list(db.execute("SELECT address FROM mesh_addresses WHERE node = ?", (node,)))
            db.execute("DELETE FROM mesh_addresses WHERE node = ?", (node,))
        return str(row[0]["address"]) if row else None

    def addresses(self) -> dict[str, str]:
        return {r["node"]: r["address"] for r in self._read("SELECT * FROM mesh_addresses")}
