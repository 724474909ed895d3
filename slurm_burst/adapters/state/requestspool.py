"""Where a hook puts a request the state database cannot take, and the daemon finds it.

The state database lives in ``daemon.state_dir`` (``/var/lib``); when its disk is full,
or another process holds its write lock past ``daemon.hook_db_timeout``, a hook writes
the request here instead: ``daemon.spool_dir``, by default ``/run/slurm-burst/spool``, a
tmpfs that does not share /var's failure. SlurmUser's hooks write (the directory is
0770 in SlurmUser's group), the daemon drains: each file is added to the database under
its request's ``uid`` (the database keeps one request per uid, so a request that
reached both is acted on once) and then removed.

Each file is one request as JSON, written under a temporary name nobody can have
planted, fsynced, renamed into place, and its directory fsynced: once ``put`` returns,
the request survives a crash of either side. Files are read without following links,
only if regular and at most :data:`MAX_FILE` bytes, and only from a writer the daemon
trusts (``slurm_burst.trusted``: root, the daemon's user or SlurmUser owns the file and
every directory above it, and nobody else can change them; checked on the opened
descriptor). One that cannot be read as a request, or comes from another writer, or
reuses the uid of another request, is moved aside to ``rejected/`` with a log line
saying why, never acted on. A uid is a token of ``[A-Za-z0-9_-]``: it names the file
and is logged, so it can hold no path or line separator.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from slurm_burst.core.jsonread import BadJson, read_json
from slurm_burst.core.records import Spooled
from slurm_burst.core.slurmsyntax import is_node_name
from slurm_burst.fileio import ensure_dir, write_durable
from slurm_burst.trusted import Writers, read_trusted

log = logging.getLogger(__name__)

KINDS = ("resume", "suspend", "resume-fail")
MAX_FILE = 32 * 1024 * 1024  # 65,536 node names and their jobs take ~5 MB
MAX_NODES = 1_000_000
MAX_PENDING = 10_000  # files read per drain; the rest wait for the next
UID = re.compile(r"[A-Za-z0-9_-]{8,64}", re.ASCII)


class RequestSpool:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        group: int | None = None,
        writers: Writers | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.group = group
        # who may have written a request: root and us, SlurmUser where the wiring says
        self.writers = writers or Writers.us()

    def put(
        self, uid: str, kind: str, nodes: list[str], jobs: list[dict[str, Any]], now: float
    ) -> Path:
        """Write the request durably (0640 in SlurmUser's group); OSError if it cannot be."""
        if not UID.fullmatch(uid):
            raise ValueError(f"a request uid is 8 to 64 of A-Za-z0-9_- ({uid[:70]!r})")
        ensure_dir(self.dir, 0o2770, self.group, "daemon.spool_dir")
        body = json.dumps(
            {"uid": uid, "kind": kind, "nodes": nodes, "jobs": jobs, "created_at": now}
        ).encode()
        name = f"{time.time_ns():020d}-{uid}.request"
        return write_durable(self.dir, name, body, 0o640)

    def pending(self) -> list[Spooled]:
        """The requests waiting, oldest first (at most :data:`MAX_PENDING`); a file that
        is no request is moved to ``rejected/``. [] when there is no spool directory."""
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".request"))
        except FileNotFoundError:
            return []
        out = []
        for name in names[:MAX_PENDING]:
            path = self.dir / name
            try:
                out.append(self._read(path))
            except FileNotFoundError:
                continue  # drained by another reader meanwhile
            except (OSError, ValueError) as exc:
                self._reject(path, str(exc))
        return out

    def remove(self, item: Spooled) -> None:
        Path(item.path).unlink(missing_ok=True)

    def reject(self, item: Spooled, why: str) -> None:
        self._reject(Path(item.path), why)

    def _read(self, path: Path) -> Spooled:
        return decode(path, read_trusted(path, self.writers, MAX_FILE))

    def _reject(self, path: Path, why: str) -> None:
        rejected = self.dir / "rejected"
        try:
            ensure_dir(rejected, 0o700, what="the spool's rejected/")
            if stat.S_ISLNK(os.lstat(path).st_mode):
                path.unlink()  # a planted link is removed, never kept or followed
            else:
                os.replace(path, rejected / path.name)
        except OSError as exc:
            log.error("spool.reject_failed file=%s error=%s", path.name, exc)
        log.error("spool.rejected file=%s error=%s", path.name, why[:300])


def decode(path: Path, data: bytes) -> Spooled:
    """A spooled request from its file's bytes; ValueError says what is wrong."""
    try:
        doc = read_json(data, "not a spooled request", max_bytes=MAX_FILE)
    except BadJson as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ValueError("not a spooled request: not a JSON object")
    uid, kind, nodes, jobs, at = (
        doc.get(k) for k in ("uid", "kind", "nodes", "jobs", "created_at")
    )
    if not isinstance(uid, str) or not UID.fullmatch(uid):
        raise ValueError("no request uid (8 to 64 of A-Za-z0-9_-)")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    if not isinstance(nodes, list) or not 0 < len(nodes) <= MAX_NODES:
        raise ValueError("no node list")
    if not all(isinstance(n, str) and is_node_name(n) for n in nodes):
        raise ValueError("a node name is not one")
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise ValueError("jobs is not a list of objects")
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 < at < 2**33:
        raise ValueError("no creation time")
    return Spooled(str(path), uid, kind, tuple(nodes), jobs, float(at))
