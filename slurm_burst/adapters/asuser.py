"""Work done as another user: a forked child that takes the user's uid, gid and groups,
runs one function and hands its JSON-able result (or its error) back through a pipe.

Staging reads a dataset as the user whose data it is. What needs root (the store's keys,
read from a 0600 file) is loaded first, by the parent; the child can then open only what
that user can, so a symlink or a path into someone else's files fails as it would for
them. The parent never changes its own identity.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from collections.abc import Callable
from typing import Any

from slurm_burst.core.errors import EXIT_PRECONDITION, BadInput, BurstError
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.staging import CorruptOutput

LIMIT = 64 * 1024 * 1024  # bytes of an answer


class AsUserError(BurstError):
    """The child could not become the user, or died without an answer."""

    code = "AsUser"
    exit_code = EXIT_PRECONDITION


def user_ids(name: str) -> tuple[int, int, list[int]]:
    """uid, gid and every group of the user ``name`` (BadInput if there is none)."""
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise BadInput(f"no user {name!r} on this host") from None
    return pw.pw_uid, pw.pw_gid, os.getgrouplist(pw.pw_name, pw.pw_gid)


def run_as(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` run as user ``name``; a BurstError it raises is raised here, with its code,
    message and exit code."""
    uid, gid, groups = user_ids(name)
    if os.geteuid() != 0 and uid != os.geteuid():
        raise AsUserError(f"only root reads as another user (not {name})")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, it ends here (os._exit in finally)
        code = 70
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups(groups)
                os.setgid(gid)
                os.setuid(uid)
            try:
                out: dict[str, Any] = {"ok": fn()}
                code = 0
            except BurstError as exc:
                bad = exc.bad if isinstance(exc, CorruptOutput) else None
                out, code = {"error": [exc.code, str(exc), exc.exit_code, bad]}, 1
            with os.fdopen(write, "wb") as pipe:
                pipe.write(json.dumps(out, default=str).encode())
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        body = pipe.read(LIMIT + 1)
    os.waitpid(pid, 0)
    try:
        answer = read_json(body, f"the work as {name}", max_bytes=LIMIT)
    except ValueError:
        answer = {}
    # the child ran as the user, who may have changed what it says: read it as input
    said = answer if isinstance(answer, dict) else {}
    if isinstance(said.get("ok"), dict):
        return dict(said["ok"])
    error = said.get("error")
    if isinstance(error, list) and len(error) == 4 and type(error[2]) is int:
        code, message, exit_code, bad = error
        failed = CorruptOutput.said(str(code), str(message)[:2000], bad) or BurstError(
            str(message)[:2000], str(code)[:64]
        )
        failed.exit_code = exit_code if exit_code in (1, 2, 3) else 1
        raise failed
    raise AsUserError(f"the work as {name} ended without an answer (a defect: see its stderr)")
