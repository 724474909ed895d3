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
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from slurm_burst.config import Config
from slurm_burst.core.hostlist import HostlistError, compress, expand_unique
from slurm_burst.core.nodestate import reason
from slurm_burst.core.resumefile import ResumeFileError, ResumeJob, parse_resume_file
from slurm_burst.fileio import FileRefused, ensure_mode, read_regular, share
from slurm_burst.ports import NodeStore, Scheduler

log = logging.getLogger("slurm_burst.hooks")

KINDS = ("resume", "suspend", "resume-fail")
# A resume file of 8 MiB describes some 80,000 jobs; anything larger is not Slurm's.
RESUME_FILE_MAX = 8 * 1024 * 1024
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


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
    store: NodeStore,
    scheduler: Callable[[], Scheduler],
    now: float,
    env: Mapping[str, str] | None = None,
) -> HookResult:
    env = os.environ if env is None else env
    if kind not in KINDS:
        raise ValueError(f"unknown hook {kind!r}")
    try:
        names = expand_unique(hostlist, max_names=cfg.slurm.hostlist_max_names)
    except HostlistError as exc:
        log.error("hook.%s.bad_hostlist error=%s", kind, exc)  # the error quotes the list
        return HookResult(EXIT_BAD_INPUT, message=f"bad hostlist: {exc}")
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
            compress(unknown),
        )
    if not accepted:
        return HookResult(EXIT_BAD_INPUT, (), unknown, "no node of the request is ours")

    beat = store.heartbeat()
    age = None if beat is None else now - float(beat["at"])
    stale = age is None or age > cfg.daemon.heartbeat_stale
    said = "never ran" if age is None else f"heartbeat {age:.0f} s old"
    if stale and kind == "resume":
        why = reason("DaemonDown", f"slurm-burst daemon not running ({said}); resume refused")
        try:
            scheduler().update_nodes(accepted, state="down", reason=why)  # short timeout
        except Exception as exc:
            log.error("hook.resume.mark_down_failed error=%s", exc)
        log.error(
            "hook.resume.daemon_stale count=%d hostlist=%s %s",
            len(accepted),
            compress(accepted),
            said,
        )
        return HookResult(EXIT_FAILED, accepted, unknown, f"daemon {said}; nodes set DOWN")

    # Teardown requests are recorded even when the daemon is down: whenever it
    # comes back, releasing what the nodes held is always right.
    request_id = store.add_request(kind, accepted, [asdict(j) for j in jobs], now)
    wake(cfg.daemon.socket)
    log.info(
        "hook.%s.recorded request=%d count=%d hostlist=%s jobs=%s",
        kind,
        request_id,
        len(accepted),
        compress(accepted),
        ",".join(str(j.job_id) for j in jobs),
    )
    if stale:
        log.error("hook.%s.daemon_stale %s; recorded for when it returns", kind, said)
        return HookResult(EXIT_FAILED, accepted, unknown, f"daemon {said}; request recorded")
    return HookResult(EXIT_OK, accepted, unknown)


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


def setup_hook_logging(path: str, group: int | None = None) -> None:
    """Hooks log to a file of their own: Slurm throws their stdout/stderr away. It is
    0660 in SlurmUser's ``group``: a hook run by hand as root must not lock SlurmUser out."""
    try:
        parent = Path(path).parent
        if not parent.exists():  # made here: SlurmUser's group must be able to enter it
            parent.mkdir(parents=True, exist_ok=True)
            share(parent, 0o770, group)
        ensure_mode(path, 0o660, group)
        handler: logging.Handler = logging.FileHandler(path)
    except OSError:
        handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    for h in root.handlers:  # a person running a hook by hand sees warnings, not the log
        h.setLevel(logging.WARNING)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
