"""Stage pushes (and stage-out promotions) for the daemon, each in a child
``slurm-burst stage push --as-user USER`` (``stage promote --as-user USER``).

A child process rather than a fork of the daemon: the daemon has threads, and a fork
keeps whatever locks they held. The child is a fresh interpreter that reads the store's
keys as root, then forks once more into the user (``adapters/asuser.py``). Its answer
is one JSON object on stdout, a result or ``{"ok": false, "code", "message"}``.
"""

from __future__ import annotations

import sys
from typing import Any

from slurm_burst.adapters.proc import CommandError, run
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.staging import CorruptOutput, StorageError

PUSH_TIMEOUT = 86400.0  # Slurm's StageInTimeout: no push outlives what Slurm waits
PROMOTE_TIMEOUT = 86400.0


class CliPusher:
    def __init__(self, config_path: str, python: str = sys.executable) -> None:
        self.config_path = config_path
        self.python = python

    def push(self, user: str, src: str, account: str, qos: str, *, check: bool) -> dict[str, Any]:
        argv = [
            self.python, "-m", "slurm_burst", "--config", self.config_path, "stage", "push",
            src, "--account", account, "--as-user", user, "--json", "--no-ledger",
            *(["--qos", qos] if qos else []), *(["--check"] if check else []),
        ]  # fmt: skip
        return self._child(argv, f"stage push of {src}", PUSH_TIMEOUT)

    def promote(self, user: str, account: str, manifest: str, home: str) -> dict[str, Any]:
        argv = [
            self.python, "-m", "slurm_burst", "--config", self.config_path, "stage", "promote",
            manifest, home, "--account", account, "--as-user", user, "--json",
        ]  # fmt: skip
        return self._child(argv, f"stage promote to {home}", PROMOTE_TIMEOUT)

    def _child(self, argv: list[str], what: str, timeout: float) -> dict[str, Any]:
        try:
            res = run(argv, timeout=timeout, check=False)
        except CommandError as exc:
            raise StorageError(f"{what} could not run: {exc.reason}") from exc
        try:
            out = read_json(res.stdout, f"{what}'s answer") if res.stdout.strip() else None
        except ValueError:
            out = None
        if res.returncode == 0 and isinstance(out, dict):
            return out
        if isinstance(out, dict) and out.get("ok") is False:
            message, code = str(out.get("message", ""))[:900], str(out.get("code", ""))
            failed = CorruptOutput.said(code, message, out.get("bad")) or StorageError(
                message, code
            )
            failed.exit_code = res.returncode
            raise failed
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StorageError(f"{what} exited {res.returncode}: {tail[0][:500]}")
