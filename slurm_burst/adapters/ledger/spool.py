"""Durable local spool for ledger writes made while the database is unreachable.

Provisioning never waits for the ledger. A write that fails is kept as one
JSON file per write in ``ledger.spool_dir`` (written to a temporary name,
fsynced, renamed, directory fsynced: it survives a crash or power loss), and
replayed in order on the next pass. Writes are idempotent in the ledger (unique
per instance and event, or per transfer key), so a replay after a crash between "inserted" and
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
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from slurm_burst.core.jsonread import read_json
from slurm_burst.core.usage import InstanceEvent, LedgerError, LedgerUnavailable, Transfer
from slurm_burst.fileio import ensure_dir, write_durable
from slurm_burst.ports import Ledger

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5

# what a spool file's kind holds, and how the ledger takes it
_KINDS: dict[str, tuple[type[Any], Callable[[Ledger, Any], None]]] = {
    "instance_event": (InstanceEvent, lambda led, r: led.instance_event(r)),
    "transfer": (Transfer, lambda led, r: led.transfer(r)),
}


def _what(record: InstanceEvent | Transfer) -> str:
    """A spooled record, for the log."""
    if isinstance(record, InstanceEvent):
        return f"node={record.node} event={record.event}"
    return f"job={record.job_id} direction={record.direction}"


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
        self.instance_events([ev])

    def instance_events(self, evs: Sequence[InstanceEvent]) -> None:
        """One write for the lot (a launch's batch) while the database is up and nothing
        waits; else each to the spool, in order."""
        if evs:
            self._write("instance_event", evs, partial(self.ledger.instance_events, evs))

    def transfer(self, t: Transfer) -> None:
        self._write("transfer", [t], partial(self.ledger.transfer, t))

    def pending(self) -> int:
        """Writes waiting in the spool."""
        return len(self.spool)

    def _write(
        self, kind: str, records: Sequence[InstanceEvent | Transfer], write: Callable[[], None]
    ) -> None:
        """``write`` the records to the database (one transaction), or put each in the
        spool, in order."""
        why = "spool not empty"  # keep order: nothing overtakes what is already waiting
        if not len(self.spool):
            try:
                write()
                return
            except LedgerError as exc:
                why = str(exc)
        for record in records:
            self.spool.put(kind, dataclasses.asdict(record))
            log.warning("ledger.spooled kind=%s %s reason=%s", kind, _what(record), why)

    def replay(self) -> int:
        """Write spooled records in order; stop at the first sign the database is away."""
        done = 0
        with self._replay_lock:
            for path in self.spool.pending():
                try:
                    item = read_json(path.read_bytes(), f"ledger spool file {path.name}")
                except (OSError, ValueError) as exc:
                    self._reject(path, f"unreadable spool file: {exc}")
                    continue
                try:
                    kind = _KINDS.get(str(item.get("kind")))
                    if kind is None:
                        raise LedgerError(f"unknown spooled kind {item.get('kind')!r}")
                    kind[1](self.ledger, kind[0](**item["payload"]))
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
