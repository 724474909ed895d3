"""The one way this code base runs programs: argument lists, a timeout, typed errors.

Never ``shell=True``: node names, reasons and cloud error text are data, and a
quote in an error message must not change the command that carries it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_burst.core.errors import BurstError

log = logging.getLogger(__name__)


class CommandError(BurstError):
    """A program failed, timed out or is missing; keeps its argv, exit status and stderr."""

    code = "CommandFailed"

    def __init__(
        self, argv: Sequence[str], returncode: int | None, stderr: str, reason: str
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.reason = reason
        detail = f": {self.stderr}" if self.stderr else ""
        super().__init__(f"{argv[0]} {reason}{detail}")


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run(
    argv: Sequence[str],
    *,
    timeout: float = 30.0,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
) -> Result:
    """Run ``argv`` and return its output; raise :class:`CommandError` when it fails."""
    if not argv or any(not isinstance(a, str) for a in argv):
        raise TypeError(f"argv must be a non-empty list of str, got {argv!r}")
    full_env = None if env is None else {**os.environ, **env}
    started = time.monotonic()
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            input=input_text,
            check=False,
        )
    except FileNotFoundError as exc:
        raise CommandError(argv, None, "", "is not installed") from exc
    except OSError as exc:  # not executable, no memory to fork, too many open files
        raise CommandError(argv, None, "", f"cannot be run: {exc.strerror or exc}") from exc
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise CommandError(argv, None, err, f"timed out after {timeout:g} s") from exc
    seconds = time.monotonic() - started
    log.debug("proc.run argv0=%s rc=%d seconds=%.3f", argv[0], proc.returncode, seconds)
    if check and proc.returncode != 0:
        raise CommandError(
            argv,
            proc.returncode,
            proc.stderr or proc.stdout,
            f"exited with status {proc.returncode}",
        )
    return Result(tuple(argv), proc.returncode, proc.stdout, proc.stderr, seconds)


def spawn_detached(
    argv: Sequence[str],
    logfile: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> tuple[int, int]:
    """Start ``argv`` in a session of its own (it outlives us), output appended to ``logfile``.

    Returns (pid, kernel start time). Runs as ``user`` (and its group) when given.
    """
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
            cwd="/",
            env=None if env is None else {**os.environ, **env},
            user=user,
            group=user,
            extra_groups=[] if user else None,
        )
    start = pid_start_time(proc.pid)
    if start is None:
        raise CommandError(argv, proc.poll(), "", f"exited at once; see {logfile}")
    return proc.pid, start


def pid_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if it is gone.

    Recorded next to every pid we keep, so that a recycled pid is never signalled.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(pid: int | None, start_time: int | None) -> bool:
    """True if ``pid`` runs and is the same process that started at ``start_time``."""
    return bool(pid) and start_time is not None and pid_start_time(pid) == start_time  # type: ignore[arg-type]


@functools.cache
def _malloc_trim() -> object | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


def release_free_memory() -> None:
    """Give the heap's free pages back to the system.

    A long-running daemon whose threads come and go (a paramiko transport thread per
    SSH session) frees memory into glibc's per-thread arenas, which keep it: resident
    memory then climbs with the number of sessions while the live heap stays flat.
    ``malloc_trim(0)`` returns the free pages of every arena (a few ms).
    """
    fn = _malloc_trim()
    if fn is not None:
        fn(0)  # type: ignore[operator]
