"""Azure's instance metadata service for the Azure emulator's VMs, served where Azure
serves it: at 169.254.169.254:80 *inside* each VM's network namespace
(:class:`~slurm_burst_lab.ec2imds.Imds` does the serving), so the VM that asks is the one
answered.

As Microsoft documents it ("Azure Instance Metadata Service: Scheduled Events", read
2026-11): every request names ``Metadata: true`` (else 400) and none may carry
``X-Forwarded-For``; ``GET /metadata/scheduledevents?api-version=2020-07-01`` answers
``{"DocumentIncarnation": n, "Events": [...]}``, each event with ``EventId``,
``EventType`` (``Freeze``, ``Reboot``, ``Redeploy``, ``Preempt``, ``Terminate``),
``ResourceType`` ``VirtualMachine``, ``Resources`` (the VMs' names), ``EventStatus``
(``Scheduled``, then ``Started``), ``NotBefore`` (RFC 1123; empty once started),
``Description``, ``EventSource`` and ``DurationInSeconds``; the incarnation grows with
every change. ``POST`` of ``{"StartRequests": [{"EventId": ...}]}`` acknowledges events:
an acknowledged event starts now. ``GET /metadata/instance/compute/name`` (``format=text``)
is the VM's name.

A test schedules an event (:meth:`AzureImds.schedule`); when it starts (at its
``NotBefore`` or once acknowledged) ``on_start`` is called with it (the emulator
deletes a Preempted VM, as ``evictionPolicy = Delete`` says).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qs, urlsplit

from slurm_burst_lab.ec2imds import Imds

log = logging.getLogger(__name__)

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
EVENTS_API = "2020-07-01"
BODY_MOST = 1 << 16


class AzureImds(Imds):
    """Each VM's Scheduled Events and name, by the VM's id (``vmId``)."""

    def __init__(self, on_start: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        super().__init__()
        self.names: dict[str, str] = {}  # vmId -> VM name
        self.events: dict[str, list[dict[str, Any]]] = {}  # vmId -> its events
        self.incarnation: dict[str, int] = {}
        self.acked: dict[str, list[str]] = {}  # vmId -> event ids acknowledged, in order
        self.on_start = on_start
        self._cond = threading.Condition()

    def add(self, vm_id: str, name: str) -> None:
        with self._cond:
            self.names[vm_id] = name
            self.events.setdefault(vm_id, [])
            self.incarnation.setdefault(vm_id, 1)

    def schedule(
        self, vm_id: str, kind: str, seconds: float, resources: list[str] | None = None
    ) -> dict[str, Any]:
        """Schedule an event of ``kind`` in the VM's document, to start in ``seconds``,
        naming the VM (or ``resources``: Azure shows a VM the events of the others in its
        availability set or placement group too)."""
        if kind not in EVENT_TYPES:
            raise ValueError(f"event type {kind!r}: one of {', '.join(EVENT_TYPES)}")
        with self._cond:
            if vm_id not in self.names:
                raise ValueError(f"no VM {vm_id!r} is served")
            start = time.time() + max(0.0, seconds)
            event = {
                "EventId": str(uuid.uuid4()).upper(),
                "EventType": kind,
                "ResourceType": "VirtualMachine",
                "Resources": list(resources or [self.names[vm_id]]),
                "EventStatus": "Scheduled",
                "NotBefore": formatdate(start, usegmt=True),
                "Description": f"The virtual machine is scheduled for {kind.lower()}.",
                "EventSource": "Platform",
                "DurationInSeconds": -1 if kind in ("Preempt", "Terminate") else 10,
                "_start": start,
            }
            self.events[vm_id].append(event)
            self.incarnation[vm_id] += 1
        timer = threading.Timer(max(0.0, seconds), self._start, (vm_id, event["EventId"]))
        timer.daemon = True
        timer.start()
        return _public(event)

    def document(self, vm_id: str) -> dict[str, Any] | None:
        with self._cond:
            if vm_id not in self.names:
                return None
            return {
                "DocumentIncarnation": self.incarnation[vm_id],
                "Events": [_public(e) for e in self.events[vm_id]],
            }

    def acknowledge(self, vm_id: str, ids: list[str]) -> None:
        with self._cond:
            known = {e["EventId"] for e in self.events.get(vm_id, [])}
            for event_id in ids:
                if event_id in known:
                    self.acked.setdefault(vm_id, []).append(event_id)
        for event_id in ids:  # started apart: the start may stop this very server
            if event_id in known:
                timer = threading.Timer(0.0, self._start, (vm_id, event_id))
                timer.daemon = True
                timer.start()

    def _start(self, vm_id: str, event_id: str) -> None:
        with self._cond:
            event = next((e for e in self.events.get(vm_id, []) if e["EventId"] == event_id), None)
            if event is None or event["EventStatus"] == "Started":
                return
            event["EventStatus"] = "Started"
            event["NotBefore"] = ""
            self.incarnation[vm_id] += 1
        log.info("azureimds.event_started vm=%s type=%s", vm_id, event["EventType"])
        if self.on_start is not None:
            try:
                self.on_start(vm_id, _public(event))
            except Exception:  # a timer thread: say it, never kill the emulator
                log.exception("azureimds.on_start_failed vm=%s", vm_id)

    def _stopped(self, instance_id: str) -> None:
        with self._cond:
            self.names.pop(instance_id, None)
            self.events.pop(instance_id, None)


def _public(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if not k.startswith("_")}


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "Microsoft-IIS/10.0"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("azureimds.request %s", format % args)

    def _refused(self) -> bool:
        if self.headers.get("Metadata", "").lower() != "true":
            self._say(400, {"error": "Bad request. Required metadata header not specified"})
            return True
        if self.headers.get("X-Forwarded-For"):
            self._say(400, {"error": "Bad request. Proxied requests are not served"})
            return True
        return False

    def do_GET(self) -> None:
        if self._refused():
            return
        imds: AzureImds = self.server.imds  # type: ignore[attr-defined]
        vm_id: str = self.server.instance_id  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if not q.get("api-version"):
            self._say(400, {"error": "Bad request. api-version was not specified"})
            return
        if parts.path == "/metadata/scheduledevents":
            doc = imds.document(vm_id)
            if doc is None:
                self._say(404, {"error": "Not found"})
                return
            self._say(200, doc)
            return
        if parts.path == "/metadata/instance/compute/name":
            name = imds.names.get(vm_id, "")
            if q.get("format") == "text":
                self._say_text(name)
            else:
                self._say(200, name)
            return
        self._say(404, {"error": "Not found"})

    def do_POST(self) -> None:
        if self._refused():
            return
        imds: AzureImds = self.server.imds  # type: ignore[attr-defined]
        vm_id: str = self.server.instance_id  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if parts.path != "/metadata/scheduledevents" or not 0 < length <= BODY_MOST:
            self._say(400, {"error": "Bad request"})
            return
        try:
            body = json.loads(self.rfile.read(length))
            ids = [str(r["EventId"]) for r in body["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            self._say(400, {"error": "Bad request. StartRequests: [{EventId}]"})
            return
        imds.acknowledge(vm_id, ids)
        self._say(200, {})

    def _say(self, status: int, doc: Any) -> None:
        self._send(status, "application/json; charset=utf-8", json.dumps(doc).encode())

    def _say_text(self, text: str) -> None:
        self._send(200, "text/plain; charset=utf-8", text.encode())

    def _send(self, status: int, kind: str, data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


AzureImds.handler = _Handler
