"""Google's metadata server for the GCE emulator's VMs, served where Compute serves it: at
169.254.169.254:80 (``metadata.google.internal``) *inside* each instance's network
namespace (:class:`~slurm_burst_lab.ec2imds.Imds` does the serving), so the instance that
asks is the one answered.

As Google documents it: every request names ``Metadata-Flavor: Google`` (else 403) and
every answer carries it back with an ``ETag`` of the value; ``?wait_for_change=true``
holds the answer until the value differs from ``last_etag`` (or from the value when
asked, with none), or ``timeout_sec`` has passed. Served under
``/computeMetadata/v1/instance/``: ``id``, ``name``, ``hostname``, ``zone``,
``preempted`` (``FALSE`` until :meth:`GceMetadata.preempt`, then ``TRUE``) and
``maintenance-event`` (``NONE``, or what :meth:`GceMetadata.maintenance` sets).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import logging
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

from slurm_burst_lab.ec2imds import Imds

log = logging.getLogger(__name__)

PREFIX = "/computeMetadata/v1/instance/"
WAIT_MAX = 3600.0  # the most one wait_for_change is held (Google's own limit is longer)
EVENTS = ("NONE", "MIGRATE_ON_HOST_MAINTENANCE", "TERMINATE_ON_HOST_MAINTENANCE")


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class GceMetadata(Imds):
    """Each GCE instance's metadata, by instance id; a change wakes the waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, dict[str, str]] = {}
        self.changed = threading.Condition()
        self.held: Counter[str] = Counter()  # waits held now, by instance
        self.asked: Counter[str] = Counter()  # waits asked for so far, by instance

    def add(self, instance_id: str, name: str, zone: str) -> None:
        """What instance ``instance_id`` will be told about itself (before serving it)."""
        with self.changed:
            self.values[instance_id] = {
                "id": instance_id,
                "name": name,
                "hostname": f"{name}.c.burst-lab.internal",
                "zone": zone,
                "preempted": "FALSE",
                "maintenance-event": "NONE",
            }

    def preempt(self, instance_id: str) -> None:
        self._set(instance_id, "preempted", "TRUE")

    def maintenance(self, instance_id: str, event: str) -> None:
        if event not in EVENTS:
            raise ValueError(f"maintenance event {event!r}: one of {', '.join(EVENTS)}")
        self._set(instance_id, "maintenance-event", event)

    def _set(self, instance_id: str, key: str, value: str) -> None:
        with self.changed:
            if instance_id not in self.values:
                raise ValueError(f"no instance {instance_id!r} is served")
            self.values[instance_id][key] = value
            self.changed.notify_all()

    def value(self, instance_id: str, key: str) -> str | None:
        with self.changed:
            return self.values.get(instance_id, {}).get(key)

    def wait(self, instance_id: str, key: str, seen: str, timeout: float) -> str | None:
        """The value once its ETag is not ``seen``, or after ``timeout`` s; None if the
        instance is gone."""
        deadline = time.monotonic() + timeout
        with self.changed:
            self.asked[instance_id] += 1
            self.held[instance_id] += 1
            try:
                while True:
                    now = self.values.get(instance_id, {}).get(key)
                    left = deadline - time.monotonic()
                    if now is None or etag(now) != seen or left <= 0:
                        return now
                    self.changed.wait(left)
            finally:
                self.held[instance_id] -= 1

    def waiting(self, instance_id: str) -> int:
        """How many waits on ``instance_id``'s values are held now."""
        with self.changed:
            return self.held[instance_id]

    def _stopped(self, instance_id: str) -> None:
        with self.changed:
            self.values.pop(instance_id, None)
            self.changed.notify_all()


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "Metadata Server for VM"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("gcemeta.request %s", format % args)

    def do_GET(self) -> None:
        meta: GceMetadata = self.server.imds  # type: ignore[attr-defined]
        iid: str = self.server.instance_id  # type: ignore[attr-defined]
        if self.headers.get("Metadata-Flavor") != "Google":
            self._say(403, "Missing required header: Metadata-Flavor\n")
            return
        parts = urlsplit(self.path)
        key = parts.path.removeprefix(PREFIX) if parts.path.startswith(PREFIX) else ""
        current = meta.value(iid, key) if key else None
        if current is None:
            self._say(404, "Not found\n")
            return
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if q.get("wait_for_change", "").lower() == "true":
            try:
                timeout = min(WAIT_MAX, max(1.0, float(q.get("timeout_sec") or WAIT_MAX)))
            except ValueError:
                self._say(400, "timeout_sec: a number of seconds\n")
                return
            current = meta.wait(iid, key, q.get("last_etag") or etag(current), timeout)
            if current is None:
                self._say(503, "The instance is gone\n")
                return
        self._say(200, current, etag(current))

    def _say(self, status: int, body: str, tag: str = "") -> None:
        data = body.encode()
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            if tag:
                self.send_header("ETag", tag)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


GceMetadata.handler = _Handler
