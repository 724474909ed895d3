"""What Slurm's ResumeProgram, SuspendProgram and ResumeFailProgram do: record and hand off.

A hook runs inside slurmctld's power-save thread (as SlurmUser). It must return
fast whatever the cloud is doing, so it only:

1. expands and checks the hostlist against the configured node groups (names we
   do not manage are reported and skipped; the rest proceed);
2. for a resume, reads ``SLURM_RESUME_FILE`` at once (it vanishes with slurmctld)
   for the jobs behind the request, falling back to the argument;
3. checks the daemon's heartbeat: if it is stale, nobody would act on the
   request, so the nodes are set DOWN with a reason that says so (Slurm requeues
   their jobs) and the hook exits non-zero;
4. writes the request to the state database (durable before we return) and
   wakes the daemon through its datagram socket (best effort: the daemon also
   polls the database).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import socket
import stat
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm_burst.config import Config
from slurm_burst.core.errors import BurstError
from slurm_burst.core.hostlist import HostlistError, compress, expand_unique
from slurm_burst.core.nodestate import reason
from slurm_burst.core.records import StoreError
from slurm_burst.core.resumefile import ResumeFileError, ResumeJob, parse_resume_file
from slurm_burst.core.slurmsyntax import visible
from slurm_burst.fileio import FileRefused, ensure_dir, file_error, open_append, read_regular
from slurm_burst.ports import NodeStore, RequestSpool, Scheduler

log = logging.getLogger("slurm_burst.hooks")

KINDS = ("resume", "suspend", "resume-fail")
# A resume file of 8 MiB describes some 80,000 jobs; anything larger is not Slurm's.
RESUME_FILE_MAX = 8 * 1024 * 1024

# Exit codes. Slurm only logs a power-saving program's exit status ("program exit status
# of N"), so they are for the admin reading slurmctld's log: each says what happened to
# the request and to the nodes (docs/operations.md, "Hook exit codes").
EXIT_OK = 0
"""Recorded in the state database; the daemon is running."""
EXIT_FAILED = 1
"""Not recorded anywhere, and the nodes could not be set DOWN either: see the system log."""
EXIT_BAD_INPUT = 2
"""A malformed hostlist, a bad config, or no node of ours: nothing recorded."""
EXIT_SPOOLED = 4
"""The state database could not take the request: recorded in daemon.spool_dir."""
EXIT_DAEMON_DOWN = 5
"""Resume refused: the daemon's heartbeat is stale; the nodes were set DOWN (DaemonDown)."""
EXIT_RECORDED_STALE = 6
"""Suspend or resume-fail recorded, but the daemon's heartbeat is stale: done when it returns."""
EXIT_NOT_RECORDED = 7
"""Resume recorded nowhere (database and spool failed): nodes set DOWN (RequestNotRecorded)."""

HOOK_EXIT_CODES = {
    EXIT_OK: "recorded; the daemon acts on it",
    EXIT_FAILED: "not recorded, and the nodes could not be set DOWN (see the system log)",
    EXIT_BAD_INPUT: "bad hostlist or config, or no node of ours; nothing recorded",
    EXIT_SPOOLED: "the state database could not take it: recorded in daemon.spool_dir",
    EXIT_DAEMON_DOWN: "resume refused, the daemon is not running: nodes set DOWN (DaemonDown)",
    EXIT_RECORDED_STALE: "suspend/resume-fail recorded; the daemon is not running",
    EXIT_NOT_RECORDED: "resume recorded nowhere: nodes set DOWN (RequestNotRecorded)",
}


@dataclass(frozen=True)
class HookResult:
    code: int
    accepted: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    message: str = ""


def run_hook(
    kind: str,
    hostlist: str,
    cfg: Config,
    store: NodeStore | None,
    scheduler: Callable[[], Scheduler],
    now: float,
    env: Mapping[str, str] | None = None,
    *,
    spool: RequestSpool | None = None,
    store_error: str = "",
) -> HookResult:
    """Record ``kind`` of ``hostlist``. ``store`` is None when the state database could
    not be opened (``store_error`` says why): the request then goes to ``spool``."""
    env = os.environ if env is None else env
    if kind not in KINDS:
        raise ValueError(f"unknown hook {kind!r}")
    try:
        names = expand_unique(hostlist, max_names=cfg.slurm.hostlist_max_names)
    except HostlistError as exc:
        log.error("hook.%s.bad_hostlist error=%s", kind, visible(str(exc))[:300])
        return HookResult(EXIT_BAD_INPUT, message=f"bad hostlist: {visible(str(exc))[:300]}")
    jobs: list[ResumeJob] = []
    if kind == "resume":
        jobs = _resume_jobs(env.get("SLURM_RESUME_FILE"), names, cfg)
    accepted = tuple(n for n in names if cfg.group_of(n) is not None)
    unknown = tuple(n for n in names if cfg.group_of(n) is None)
    if unknown:
        log.warning(
            "hook.%s.unknown_nodes count=%d hostlist=%s (not in any node group; skipped)",
            kind,
            len(unknown),
            visible(compress(unknown))[:300],
        )
    if not accepted:
        return HookResult(EXIT_BAD_INPUT, (), unknown, "no node of the request is ours")

    age, db_error = heartbeat_age(store, now, store_error)
    stale = db_error == "" and (age is None or age > cfg.daemon.heartbeat_stale)
    said = "never ran" if age is None else f"heartbeat {age:.0f} s old"
    if stale and kind == "resume":
        why = reason("DaemonDown", f"slurm-burst daemon not running ({said}); resume refused")
        marked = _mark_down(scheduler, accepted, why)
        log.error(
            "hook.resume.daemon_stale count=%d hostlist=%s %s; %s",
            len(accepted),
            compress(accepted),
            said,
            "nodes set DOWN" if marked else "nodes could NOT be set DOWN",
        )
        if marked:
            return HookResult(EXIT_DAEMON_DOWN, accepted, unknown, f"daemon {said}; nodes set DOWN")
        return HookResult(
            EXIT_FAILED, accepted, unknown, f"daemon {said}; resume refused, nodes NOT set DOWN"
        )

    # Teardown requests are recorded even when the daemon is down: whenever it
    # comes back, releasing what the nodes held is always right.
    uid = uuid.uuid4().hex
    job_rows = [asdict(j) for j in jobs]
    where, request_id = "database", 0
    if store is not None:
        try:
            request_id = store.add_request(kind, accepted, job_rows, now, uid=uid)
            db_error = ""  # a heartbeat unread, but the request is in: it is where it belongs
        except (StoreError, OSError) as exc:
            db_error = str(exc)[:300]
    if db_error or store is None:
        where = _spool(spool, uid, kind, list(accepted), job_rows, now, db_error)
    if where:
        wake(cfg.daemon.socket)
        log.log(
            logging.INFO if where == "database" else logging.ERROR,
            "hook.%s.recorded where=%s request=%s count=%d hostlist=%s jobs=%s%s",
            kind,
            where,
            request_id or uid,
            len(accepted),
            compress(accepted),
            ",".join(str(j.job_id) for j in jobs),
            f" (state database: {db_error})" if db_error else "",
        )
    if where == "spool":
        return HookResult(EXIT_SPOOLED, accepted, unknown, f"state database: {db_error}; spooled")
    if where and stale:
        log.error("hook.%s.daemon_stale %s; recorded for when it returns", kind, said)
        return HookResult(EXIT_RECORDED_STALE, accepted, unknown, f"daemon {said}; recorded")
    if where:
        return HookResult(EXIT_OK, accepted, unknown)
    return _not_recorded(kind, accepted, unknown, scheduler, db_error)


def heartbeat_age(
    store: NodeStore | None, now: float, store_error: str = ""
) -> tuple[float | None, str]:
    """(seconds since the daemon's heartbeat or None if it never ran, '') or, when the
    state database cannot be read, (None, why): then nobody can tell the daemon's state."""
    if store is None:
        return None, store_error or "not opened"
    try:
        beat = store.heartbeat()
    except (StoreError, OSError) as exc:
        return None, str(exc)[:300]
    return (None if beat is None else now - float(beat["at"])), ""


def _spool(
    spool: RequestSpool | None,
    uid: str,
    kind: str,
    nodes: list[str],
    jobs: list[dict[str, Any]],
    now: float,
    db_error: str,
) -> str:
    """'spool' when the request is now durable in the spool, '' when not even there."""
    if spool is None:
        return ""
    try:
        spool.put(uid, kind, nodes, jobs, now)
    except OSError as exc:
        log.error(
            "hook.%s.spool_failed count=%d hostlist=%s error=%s (state database: %s)",
            kind,
            len(nodes),
            compress(nodes),
            file_error(exc),
            db_error,
        )
        return ""
    return "spool"


def _not_recorded(
    kind: str,
    accepted: tuple[str, ...],
    unknown: tuple[str, ...],
    scheduler: Callable[[], Scheduler],
    db_error: str,
) -> HookResult:
    """Neither the database nor the spool took the request. A resume's nodes are set
    DOWN, so Slurm requeues their jobs now rather than after ResumeTimeout (the daemon
    returns them to service once it can write again). A lost suspend or resume-fail
    needs nothing: the reconcile loop tears down a node Slurm shows powered down."""
    if kind != "resume":
        log.error(
            "hook.%s.not_recorded count=%d hostlist=%s cause=%s (the reconcile loop releases "
            "nodes Slurm shows powered down)",
            kind,
            len(accepted),
            compress(accepted),
            db_error,
        )
        return HookResult(EXIT_FAILED, accepted, unknown, f"not recorded: {db_error}")
    why = reason("RequestNotRecorded", f"resume not recorded: state database {db_error}")
    marked = _mark_down(scheduler, accepted, why)
    log.error(
        "hook.resume.not_recorded count=%d hostlist=%s cause=%s; %s",
        len(accepted),
        compress(accepted),
        db_error,
        "nodes set DOWN" if marked else "nodes could NOT be set DOWN",
    )
    if marked:
        return HookResult(
            EXIT_NOT_RECORDED, accepted, unknown, f"not recorded ({db_error}); nodes set DOWN"
        )
    return HookResult(
        EXIT_FAILED, accepted, unknown, f"not recorded ({db_error}); nodes NOT set DOWN"
    )


def _mark_down(scheduler: Callable[[], Scheduler], names: tuple[str, ...], why: str) -> bool:
    try:
        scheduler().update_nodes(names, state="down", reason=why)  # short timeout
    except BurstError as exc:  # whatever Slurm says, the hook must still exit with a code
        log.error("hook.mark_down_failed error=%s", visible(str(exc))[:300])
        return False
    return True


def _resume_jobs(path: str | None, names: list[str], cfg: Config) -> list[ResumeJob]:
    """The jobs behind the resume, from ``SLURM_RESUME_FILE``; [] when it is unusable.

    The request is recorded whatever the file holds: the argument is Slurm's own list
    of nodes, the file only adds which jobs wait for them. On disagreement the argument
    wins and only the jobs whose nodes are all in it are kept.
    """
    if not path:
        return []
    cap = cfg.slurm.hostlist_max_names
    try:
        info = parse_resume_file(read_resume_file(path))
        file_names = set(expand_unique(info.all_nodes, max_names=cap))
        wanted = set(names)
        jobs = [j for j in info.jobs if set(expand_unique(j.nodes, max_names=cap)) <= wanted]
    except (OSError, ResumeFileError, HostlistError) as exc:
        log.warning(
            "hook.resume.resume_file_unusable path=%s error=%s (using the argument)",
            path,
            str(exc)[:300],
        )
        return []
    if file_names != wanted or len(jobs) != len(info.jobs):
        log.warning(
            "hook.resume.resume_file_mismatch file=%s argument=%s jobs_kept=%d of %d "
            "(the argument wins)",
            compress(sorted(file_names))[:300],
            compress(names)[:300],
            len(jobs),
            len(info.jobs),
        )
    return jobs


def read_resume_file(path: str, limit: int = RESUME_FILE_MAX) -> str:
    """The file's text, if it is a regular UTF-8 file of at most ``limit`` bytes: opened
    non-blocking, so a FIFO or a device is refused at once instead of hanging
    slurmctld's power-save thread; a huge file is neither read nor stored."""
    try:
        return read_regular(path, limit).decode("utf-8")
    except FileRefused as exc:
        raise ResumeFileError(str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise ResumeFileError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from exc


def wake(path: str) -> bool:
    """Nudge the daemon; False when nobody listens (it will see the request on its next poll)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(b"wake", path)
        return True
    except OSError:
        return False


class _SysLog(logging.handlers.SysLogHandler):
    """The system log, best effort: a system log that goes away while a hook runs costs
    its lines there (the hook log has them), never a "Logging error" on stderr."""

    def handleError(self, record: logging.LogRecord) -> None:
        return


def setup_hook_logging(path: str, group: int | None = None, syslog: str = "") -> str:
    """Hooks log to a file of their own: Slurm throws their stdout/stderr away. It is
    0660 in SlurmUser's ``group``: a hook run by hand as root must not lock SlurmUser out.
    Its directory and the file are made so, or checked and left as they are
    (:mod:`slurm_burst.fileio`: never through a symlink, never a device). Returns why
    the file could not be used ('' when it is): the hook then logs to stderr.

    Errors also go to the system log at ``syslog`` (journald's or syslogd's socket),
    where an admin looks when Slurm's log shows a hook's exit status: a request the hook
    could not record, nodes it set DOWN, a hook log it could not open."""
    why = ""
    try:
        ensure_dir(Path(path).parent, 0o770, group, "the hook log's directory")
        stream = os.fdopen(open_append(path, 0o660, group), "a", encoding="utf-8")
        handler: logging.Handler = logging.StreamHandler(stream)
    except OSError as exc:
        why = f"hook log: {file_error(exc)}"
        handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    for h in root.handlers:  # a person running a hook by hand sees warnings, not the log
        h.setLevel(logging.WARNING)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if syslog:
        try:
            if not stat.S_ISSOCK(os.stat(syslog).st_mode):
                return why
            sys_handler = _SysLog(syslog, facility=logging.handlers.SysLogHandler.LOG_DAEMON)
        except OSError:  # no system log here (a container): the hook log must do
            return why
        sys_handler.ident = "slurm-burst-hook: "
        sys_handler.setLevel(logging.ERROR)
        sys_handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(sys_handler)
        if why:
            logging.getLogger(__name__).error("hook.log_unusable %s", why)
    return why
