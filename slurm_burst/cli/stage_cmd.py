"""``slurm-burst stage``: datasets in object storage, ahead of the jobs that will use them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from slurm_burst.cli.common import (
    FiniteRange,
    Progress,
    SlurmName,
    Whole,
    app,
    emit,
    json_option,
    ts,
)
from slurm_burst.core.errors import BurstError

if TYPE_CHECKING:
    from slurm_burst.services.staging import Stager
    from slurm_burst.services.transfers import StorageBook

_store_option = click.option(
    "--store", default="", metavar="NAME", help="A store of [stores] (default: staging.store)."
)
_account_option = click.option(
    "--account",
    "-A",
    type=SlurmName("account"),
    required=True,
    help="Slurm account whose namespace holds the dataset (its jobs will use it).",
)


@click.group("stage")
def group() -> None:
    """Datasets staged to object storage for burst jobs (#BB_LUA stage_in).

    A dataset is stored once per account, content-addressed: a file already stored,
    by this dataset or another of the account's, is not sent again, and an unchanged
    tree costs two requests. Data under staging.onprem_only_paths, marked with
    staging.marker, or of an on-prem-only account or QOS, is refused before a byte is
    read."""


@group.command("push")
@click.argument("src")
@_account_option
@click.option(
    "--qos",
    type=SlurmName("QOS"),
    default="",
    help="The QOS of the jobs that will use it (its rules).",
)
@click.option(
    "--as-user",
    metavar="USER",
    help="Read the data as USER (required as root: only what USER may read leaves).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Only check that SRC may leave (resolved, the site's rules, markers): read and "
    "send nothing.",
)
@click.option(
    "--ledger/--no-ledger",
    "record",
    default=True,
    hidden=True,  # the daemon's child pushes say --no-ledger: the daemon records them
    help="Record the push in the ledger's transfers.",
)
@_store_option
@json_option
@click.pass_context
def push(
    ctx: click.Context, src: str, account: str, qos: str, as_user: str | None, check: bool,
    record: bool, store: str, as_json: bool,
) -> None:  # fmt: skip
    """Stage SRC (an absolute directory or file) now, before any job asks for it.

    Progress goes to stderr; the result (files, bytes, what was sent, requests) to
    stdout; with --json an error too, as {"ok": false, "code", "message"}. Exit 0
    staged, 1 the store failed, 2 refused (bad path, sensitive data, a special file in
    the tree), 3 no store configured or reachable credentials."""
    import os

    progress = Progress(enabled=not check and (not as_json or sys.stderr.isatty()))

    def work(st: Stager) -> dict[str, object]:
        return st.check(src, account, qos) if check else st.push(src, account, qos).as_dict()

    if os.geteuid() == 0 and not as_user:
        _refuse("as root, say whose data this is: --as-user USER (it is read as USER)", as_json)
    st, out = _as_user(ctx, store, progress, as_user, as_json, work)
    progress.done()
    if record and not check:
        _record_push(app(ctx).config, st.store.name, out, account, as_user)
    if check:
        emit(out, as_json, columns=["SRC", "RESOLVED", "FILES", "BYTES"],
             rows=lambda r: [[r["src"], r["real_src"], r["files"], r["bytes"]]],
             title="may leave the site")  # fmt: skip
        return
    emit(
        out,
        as_json,
        columns=["SRC", "MANIFEST", "FILES", "BYTES", "SENT OBJECTS", "SENT BYTES", "SECONDS"],
        rows=lambda r: [_push_row(r)],
        title="unchanged: nothing sent" if out["unchanged"] else None,
    )


@group.command("status")
@click.argument("src", required=False)
@_account_option
@_store_option
@json_option
@click.pass_context
def status(ctx: click.Context, src: str | None, account: str, store: str, as_json: bool) -> None:
    """The account's staged datasets (or SRC's): newest version, files, bytes, when."""
    from slurm_burst.core.staging import check_src
    from slurm_burst.wiring.storage import stager

    if src is not None:
        check_src(src)
    found = stager(app(ctx).config, store).status(account, src)
    out = [
        {"src": p.src, "manifest": p.manifest, "files": p.files, "bytes": p.bytes, "at": p.at}
        for p in found
    ]
    emit(
        {"account": account, "datasets": out},
        as_json,
        columns=["SRC", "MANIFEST", "FILES", "BYTES", "STAGED"],
        rows=lambda d: [
            [r["src"], r["manifest"][:16], r["files"], r["bytes"], ts(r["at"])]
            for r in d["datasets"]
        ],
        title=f"datasets of account {account}",
    )


@group.command("gc")
@click.option(
    "--keep-days",
    type=FiniteRange(1, 36500),
    default=None,
    metavar="DAYS",
    help="Keep versions pushed within DAYS (default: staging.keep_days).",
)
@click.option(
    "--grace-hours",
    type=FiniteRange(1, 24 * 365),
    default=24.0,
    show_default=True,
    help="Never remove a manifest or object written within this many hours (a push in "
    "flight writes objects before the manifest that names them).",
)
@click.option(
    "--dry-run", is_flag=True, help="Say what would go and what would be booked; change nothing."
)
@click.option(
    "--no-book", is_flag=True, help="Do not book the store's storage in the ledger this run."
)
@_store_option
@json_option
@click.pass_context
def gc(
    ctx: click.Context, keep_days: float | None, grace_hours: float, dry_run: bool,
    no_book: bool, store: str, as_json: bool,
) -> None:  # fmt: skip
    """Remove what no dataset needs from the store: versions pushed more than
    --keep-days ago that no job the daemon knows of holds (its state database, read
    only), then manifests and objects nothing kept names. Every account's namespace;
    keys under the store's prefix that are not staging's are never touched.

    Then book in the ledger what each namespace held since the last run: its GB-months
    at the store's storage_per_gb_month, charged to the account (a namespace never
    booked counts each key from when it was written). A ledger that cannot be read
    books nothing this run; the next run books the whole period.

    Exit 0 when done (problems, such as a manifest that cannot be read, are listed:
    that namespace keeps all its objects)."""
    from slurm_burst.wiring.storage import stager

    cfg = app(ctx).config
    name = store or cfg.staging.store
    live = _live_manifests(cfg)
    book = None if no_book else _storage_book(cfg, name)
    booked = None
    if book is not None:
        try:
            booked = book.booked()
        except (BurstError, OSError) as exc:
            _not_booked(exc)
    progress = Progress(enabled=not as_json or sys.stderr.isatty(), counts=True)
    report = stager(cfg, store, progress).gc(
        keep_days if keep_days is not None else cfg.staging.keep_days,
        live, grace_hours * 3600, dry_run, booked,
    )  # fmt: skip
    progress.done()
    charges = [] if book is None or booked is None else book.charges(report.held, report.at)
    out = report.as_dict()
    out["storage"] = [c.as_dict() for c in charges]
    if charges and not dry_run:
        try:
            book.book(charges)  # type: ignore[union-attr]
        except (BurstError, OSError) as exc:
            out["storage"] = []
            _not_booked(exc)
    emit(
        out,
        as_json,
        columns=["NAMESPACE", "POINTERS", "MANIFESTS", "OBJECTS", "BYTES FREED", "OBJECTS KEPT",
                 "BYTES KEPT"],
        rows=lambda d: [
            [r["namespace"], r["pointers"], r["manifests"], r["objects"], r["bytes_freed"],
             r["objects_kept"], r["bytes_kept"]]
            for r in [*d["namespaces"], {"namespace": "total", **d["total"]}]
        ],
        title=("would remove (dry run)" if dry_run else "removed")
        + f": {out['keys']} keys listed",
    )  # fmt: skip
    if not as_json and out["storage"]:
        emit(
            out["storage"],
            False,
            columns=["NAMESPACE", "ACCOUNT", "SINCE", "KEYS", "BYTES", "GB-MONTHS", "COST $"],
            rows=lambda rs: [
                [r["namespace"], r["account"] or "-", ts(r["start"]) if r["start"] else "written",
                 r["keys"], r["bytes"], f"{r['gb_months']:.6f}", f"{r['cost']:.6f}"]
                for r in rs
            ],
            title="storage " + ("that would be booked (dry run)" if dry_run else "booked"),
        )  # fmt: skip
    for problem in out["problems"]:
        click.echo(f"slurm-burst: {problem}", err=True)


def _not_booked(exc: Exception) -> None:
    click.echo(f"slurm-burst: warning: storage not booked this run: {exc}", err=True)


def _storage_book(cfg: Any, store: str) -> StorageBook | None:
    """The store's storage book on the ledger (None, said, where there is no ledger)."""
    from slurm_burst.wiring.ledger import storage_book

    if store not in cfg.stores:
        return None  # the stager says what is wrong with the store
    try:
        return storage_book(cfg, store)
    except (BurstError, OSError, KeyError) as exc:
        _not_booked(exc)
        return None


def _live_manifests(cfg: Any) -> dict[str, set[str]]:
    """The versions the daemon's jobs hold, by namespace (its state database, read only;
    without one there are none, and that is said)."""
    from slurm_burst.core.staging import StagingError, namespace
    from slurm_burst.wiring.light import node_store

    try:
        db = node_store(cfg, create=False)
    except (BurstError, OSError) as exc:
        click.echo(f"slurm-burst: warning: no state database ({exc}): only age keeps a "
                   "version", err=True)  # fmt: skip
        return {}
    try:
        live: dict[str, set[str]] = {}
        for rec in db.stages():
            try:
                ns = namespace(rec.owner.account)
            except StagingError:
                continue
            for d in rec.datasets:
                if isinstance(d.get("manifest"), str):
                    live.setdefault(ns, set()).add(d["manifest"])
            for out in db.outputs(rec.job_id):  # a stage-out's versions: resumed from
                if out.manifest:
                    live.setdefault(ns, set()).add(out.manifest)
        return live
    finally:
        db.close()


@group.command("jobs")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["requested", "checking", "deferred", "pushing", "staged", "kept_home",
                       "failed"]),
    help="Only stages in this state (repeatable).",
)  # fmt: skip
@json_option
@click.pass_context
def jobs(ctx: click.Context, states: tuple[str, ...], as_json: bool) -> None:
    """Jobs' stage-ins as the daemon keeps them: whose, what, where each is, and why one
    failed or stayed home (records are kept a week). Reads the state database only."""
    from slurm_burst.wiring.light import node_store

    store = node_store(app(ctx).config, create=False)
    try:
        recs = store.stages(list(states))
    finally:
        store.close()
    out = [
        {"job_id": r.job_id, "user": r.owner.user, "account": r.owner.account,
         "qos": r.owner.qos, "partitions": ",".join(r.owner.partitions),
         "burst_only": r.burst_only, "state": r.state,
         "message": r.message, "stages": r.stages, "datasets": r.datasets,
         "bytes": sum(int(d.get("bytes", 0)) for d in r.datasets),
         "bytes_sent": sum(int(d.get("bytes_sent", 0)) for d in r.datasets),
         "created_at": r.created_at, "updated_at": r.updated_at}
        for r in recs
    ]  # fmt: skip
    emit(
        {"stages": out},
        as_json,
        columns=["JOB", "USER", "ACCOUNT", "STATE", "STAGES", "BYTES", "SENT", "SINCE", "WHY"],
        rows=lambda d: [_stage_row(r) for r in d["stages"]],
        title="stage-ins",
    )


@group.command("outputs")
@click.option("--job", "job_id", type=Whole(1, 2**32 - 1), help="Only this job's.")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["waiting", "synced", "ended", "partial", "sealed", "lost"]),
    help="Only outputs in this state (repeatable).",
)
@json_option
@click.pass_context
def outputs(ctx: click.Context, job_id: int | None, states: tuple[str, ...], as_json: bool) -> None:
    """Jobs' stage-outs (#BB_LUA stage_out) as the daemon keeps them: where each goes,
    the last version synced, and whether it came home (sealed) or what was lost.
    Reads the state database only."""
    from slurm_burst.wiring.light import node_store

    store = node_store(app(ctx).config, create=False)
    try:
        recs = store.outputs(job_id, list(states))
    finally:
        store.close()
    out = [
        {"job_id": r.job_id, "name": r.name, "home": r.home, "sync": r.sync, "state": r.state,
         "node": r.node, "manifest": r.manifest, "files": r.files, "bytes": r.bytes,
         "synced_at": r.synced_at, "message": r.message, "updated_at": r.updated_at}
        for r in recs
    ]  # fmt: skip
    emit(
        {"outputs": out},
        as_json,
        columns=["JOB", "NAME", "HOME", "STATE", "NODE", "FILES", "BYTES", "SYNCED", "WHY"],
        rows=lambda d: [
            [r["job_id"], r["name"], r["home"], r["state"], r["node"] or "-", r["files"],
             r["bytes"], ts(r["synced_at"]) if r["synced_at"] else "-", r["message"][:60]]
            for r in d["outputs"]
        ],
        title="stage-outs",
    )  # fmt: skip


@group.command("promote")
@click.argument("manifest")
@click.argument("home")
@_account_option
@click.option(
    "--as-user",
    metavar="USER",
    help="Write as USER, the job's (required as root: the files are theirs).",
)
@_store_option
@json_option
@click.pass_context
def promote(
    ctx: click.Context, manifest: str, home: str, account: str, as_user: str | None, store: str,
    as_json: bool,
) -> None:  # fmt: skip
    """Bring the stored version MANIFEST of a job's output home to HOME (what the daemon
    does when the job ends; by hand, to bring back an older or a lost version: see
    `stage outputs`). Every file is fetched beside HOME and its SHA-256 checked, then
    the whole replaces HOME at once. One wrong file and nothing is replaced. Exit 0
    done, 1 the store failed or a file came back wrong (StageOutCorrupt), 2 a bad
    argument, 3 no store."""
    import os
    import re

    from slurm_burst.core.errors import BurstError
    from slurm_burst.core.staging import check_home

    if not re.fullmatch(r"[0-9a-f]{64}", manifest):
        _refuse(f"manifest {manifest[:80]!r}: a version id (64 hex digits)", as_json)
    try:
        check_home(home, "HOME")
    except BurstError as exc:
        _said(exc, as_json)
    if os.geteuid() == 0 and not as_user:
        _refuse("as root, say whose outputs these are: --as-user USER", as_json)
    progress = Progress(enabled=not as_json or sys.stderr.isatty())
    _, out = _as_user(ctx, store, progress, as_user, as_json,
                      lambda st: st.promote(account, manifest, home))  # fmt: skip
    progress.done()
    emit(out, as_json, columns=["HOME", "MANIFEST", "FILES", "BYTES", "ATOMIC", "SECONDS"],
         rows=lambda r: [[r["home"], r["manifest"][:16], r["files"], r["bytes"], r["atomic"],
                          r["seconds"]]])  # fmt: skip


def _refuse(message: str, as_json: bool) -> NoReturn:
    """A bad argument: raised as BadInput (exit 2), or said as JSON with --json."""
    from slurm_burst.core.errors import BadInput

    _said(BadInput(message), as_json)


def _said(exc: Any, as_json: bool) -> NoReturn:
    if not as_json:
        raise exc
    said = {"ok": False, "code": exc.code, "message": str(exc)}
    if getattr(exc, "bad", None):  # a version that came back wrong: which files
        said["bad"] = list(exc.bad)
    emit(said, True)
    sys.exit(exc.exit_code)


def _as_user(
    ctx: click.Context, store: str, progress: Progress, as_user: str | None, as_json: bool,
    work: Callable[[Stager], dict[str, object]],
) -> tuple[Stager, dict[str, object]]:  # fmt: skip
    """``work`` on the stager of ``store`` (its keys read here, as root), run as
    ``as_user`` if given (adapters/asuser.py); a BurstError said as JSON with --json."""
    from slurm_burst.core.errors import BurstError
    from slurm_burst.wiring.storage import run_as, stager

    try:
        st = stager(app(ctx).config, store, progress)
        return st, (run_as(as_user, lambda: work(st)) if as_user else work(st))
    except BurstError as exc:
        _said(exc, as_json)


def _stage_row(r: dict[str, Any]) -> list[object]:
    return [r["job_id"], r["user"], r["account"], r["state"], len(r["stages"]), r["bytes"],
            r["bytes_sent"], ts(r["updated_at"]), r["message"][:60]]  # fmt: skip


def _record_push(
    cfg: Any, store: str, out: dict[str, object], account: str, as_user: str | None
) -> None:
    """An admin's push in the ledger's transfers (job 0), through the daemon's spool if
    the database is away; a ledger that cannot take it is said, the push stands."""
    import getpass

    from slurm_burst.core.errors import BurstError
    from slurm_burst.wiring.ledger import daemon_ledger
    from slurm_burst.wiring.light import clock
    from slurm_burst.wiring.storage import transfer_book

    try:
        user = as_user or getpass.getuser()
        transfer_book(cfg, store, clock(), daemon_ledger(cfg)).pushed(
            out, account=account, user=user
        )
    except (BurstError, OSError, KeyError) as exc:  # staged all the same: said, not fatal
        click.echo(f"slurm-burst: warning: push not recorded in the ledger: {exc}", err=True)


def _push_row(r: dict[str, object]) -> list[object]:
    sent = f"{r['objects_sent']}/{r['objects']}"
    return [r["src"], str(r["manifest"])[:16], r["files"], r["bytes"], sent, r["bytes_sent"],
            r["seconds"]]  # fmt: skip
