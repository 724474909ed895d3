"""Durable local spool for ledger writes made while the database is unreachable.

Provisioning never waits for the ledger. A write that fails is kept as one
JSON file per write in ``ledger.spool_dir`` (written to a temporary name,
fsynced, renamed, directory fsynced: it survives a crash or power loss), and
replayed in order on the next pass. Writes are idempotent in the ledger (unique
per instance and event), so a replay after a crash between "inserted" and
"spool file removed" adds nothing. A write the database rejects for another
reason than being unreachable is retried a few times, then moved to
``rejected/`` with the error logged, so one bad record cannot block the rest.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from slurm_burst.core.usage import InstanceEvent, LedgerError, LedgerUnavailable
from slurm_burst.fileio import ensure_dir, write_durable
from slurm_burst.ports import Ledger

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5


class Spool:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        ensure_dir(self.dir, 0o700, what="ledger.spool_dir")
        self._lock = threading.Lock()
        self._seq = 0

    def put(self, kind: str, payload: dict[str, Any]) -> Path:
        with self._lock:
            self._seq += 1
            name = f"{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}-{kind}.json"
        body = json.dumps({"kind": kind, "payload": payload, "attempts": 0}).encode()
        return write_durable(self.dir, name, body, 0o600)

    def pending(self) -> list[Path]:
        return sorted(p for p in self.dir.glob("*.json") if not p.name.startswith("."))

    def __len__(self) -> int:
        return len(self.pending())


class SpoolingLedger:
    """The Ledger port: writes go to the database, or to the spool when it is away."""

    def __init__(self, ledger: Ledger, spool: Spool) -> None:
        self.ledger = ledger
        self.spool = spool
        self._replay_lock = threading.Lock()

    def instance_event(self, ev: InstanceEvent) -> None:
        if len(self.spool):  # keep order: nothing overtakes what is already waiting
            self._put(ev, "spool not empty")
            return
        try:
            self.ledger.instance_event(ev)
        except LedgerError as exc:
            self._put(ev, str(exc))

    def pending(self) -> int:
        """Writes waiting in the spool."""
        return len(self.spool)

    def _put(self, ev: InstanceEvent, why: str) -> None:
        self.spool.put("instance_event", dataclasses.asdict(ev))
        log.warning(
            "ledger.spooled kind=instance_event node=%s event=%s reason=%s",
            ev.node,
            ev.event,
            why,
        )

    def replay(self) -> int:
        """Write spooled records in order; stop at the first sign the database is away."""
        done = 0
        with self._replay_lock:
            for path in self.spool.pending():
                try:
                    item = json.loads(path.read_text())
                except (OSError, ValueError) as exc:
                    self._reject(path, f"unreadable spool file: {exc}")
                    continue
                try:
                    if item.get("kind") != "instance_event":
                        raise LedgerError(f"unknown spooled kind {item.get('kind')!r}")
                    self.ledger.instance_event(InstanceEvent(**item["payload"]))
                except LedgerUnavailable as exc:
                    log.info(
                        "ledger.replay.waiting pending=%d reason=%s", len(self.spool.pending()), exc
                    )
                    break
                except (LedgerError, TypeError) as exc:
                    item["attempts"] = int(item.get("attempts", 0)) + 1
                    if item["attempts"] >= MAX_ATTEMPTS:
                        self._reject(path, str(exc))
                    else:
                        path.write_text(json.dumps(item))
                        log.warning("ledger.replay.retry file=%s error=%s", path.name, exc)
                        break
                    continue
                path.unlink()
                done += 1
        if done:
            log.info("ledger.replayed count=%d pending=%d", done, len(self.spool.pending()))
        return done

    def _reject(self, path: Path, why: str) -> None:
        rejected = self.spool.dir / "rejected"
        rejected.mkdir(mode=0o700, exist_ok=True)
        os.replace(path, rejected / path.name)
        log.error("ledger.replay.rejected file=%s error=%s", path.name, why)
