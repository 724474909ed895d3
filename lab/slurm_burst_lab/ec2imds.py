"""Instance metadata for the EC2 emulator's VMs, served where EC2 serves it: at
169.254.169.254:80 *inside* each instance's network namespace (IMDSv2: a session token
from ``PUT /latest/api/token``, then ``GET`` with it), so the instance that asks is the
one answered, and nothing of the host's own network changes.

Each instance's server is a socket made in its namespace (a thread enters it with
setns(2), which moves only that thread; the socket stays there after the thread comes
back). Served: ``instance-id``, and ``spot/instance-action``: 404 until a test raises
an interruption notice (:meth:`Imds.interrupt`), then EC2's JSON,
``{"action": "terminate", "time": "2026-11-27T15:04:05Z"}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.server
import json
import logging
import os
import secrets
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ADDRESS = "169.254.169.254"
CLONE_NEWNET = 0x40000000
TOKEN_TTL_MAX = 21600


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class Imds:
    """Each instance's metadata server, in its network namespace; ``handler`` answers
    (EC2's here; GCE's metadata server: :mod:`slurm_burst_lab.gcemeta`)."""

    handler: type[http.server.BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[str, http.server.ThreadingHTTPServer] = {}
        self.notices: dict[str, dict[str, str]] = {}

    def serve(self, instance_id: str, netns: Path, wait: float = 60.0) -> None:
        """Serve ``instance_id``'s metadata in ``netns`` once it exists (in the background:
        the VM's launcher makes its namespace after the launch is answered)."""
        threading.Thread(target=self._serve, args=(instance_id, netns, wait),
                         name=f"imds-{instance_id}", daemon=True).start()  # fmt: skip

    def _serve(self, instance_id: str, netns: Path, wait: float) -> None:
        deadline = time.monotonic() + wait
        while not netns.exists():
            if time.monotonic() > deadline:
                log.warning("imds.no_namespace instance=%s netns=%s", instance_id, netns)
                return
            time.sleep(0.1)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        theirs = os.open(netns, os.O_RDONLY)
        try:
            _setns(theirs)
            try:  # a child forked from this thread starts in the instance's namespace too
                subprocess.run(["ip", "address", "replace", f"{ADDRESS}/32", "dev", "lo"],
                               check=True, capture_output=True, timeout=10)  # fmt: skip
                subprocess.run(["ip", "link", "set", "lo", "up"], check=True,
                               capture_output=True, timeout=10)  # fmt: skip
                server = _Server((ADDRESS, 80), self.handler)
            finally:
                _setns(home)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("imds.not_served instance=%s error=%s", instance_id, exc)
            return
        finally:
            os.close(theirs)
            os.close(home)
        self._run(instance_id, server)

    def serve_here(self, instance_id: str, port: int = 0) -> int:
        """Serve ``instance_id``'s metadata on 127.0.0.1 (a test without a VM); the port."""
        server = _Server(("127.0.0.1", port), self.handler)
        threading.Thread(target=self._run, args=(instance_id, server),
                         name=f"imds-{instance_id}", daemon=True).start()  # fmt: skip
        return int(server.server_port)

    def _run(self, instance_id: str, server: http.server.ThreadingHTTPServer) -> None:
        server.imds, server.instance_id = self, instance_id  # type: ignore[attr-defined]
        server.tokens = set()  # type: ignore[attr-defined]
        with self._lock:
            self._servers[instance_id] = server
        log.info("imds.serving instance=%s", instance_id)
        server.serve_forever()

    def interrupt(self, instance_id: str, seconds: float) -> dict[str, str]:
        """Raise a spot interruption notice on ``instance_id``: reclaimed in ``seconds``."""
        when = datetime.now(UTC) + timedelta(seconds=seconds)
        notice = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        with self._lock:
            self.notices[instance_id] = notice
        return notice

    def stop(self, instance_id: str) -> None:
        with self._lock:
            server = self._servers.pop(instance_id, None)
            self.notices.pop(instance_id, None)
        self._stopped(instance_id)
        if server is not None:
            server.shutdown()
            server.server_close()

    def _stopped(self, instance_id: str) -> None:
        """What a subclass lets go of with an instance's server."""

    def notice(self, instance_id: str) -> dict[str, str] | None:
        with self._lock:
            return self.notices.get(instance_id)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "EC2ws"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("imds.request %s", format % args)

    def do_PUT(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if (
            self.path != "/latest/api/token"
            or not (ttl.isascii() and ttl.isdigit())
            or not 0 < int(ttl) <= TOKEN_TTL_MAX
        ):
            self._say(400, "text/plain", b"")
            return
        token = secrets.token_urlsafe(32)
        self.server.tokens.add(token)  # type: ignore[attr-defined]
        self._say(200, "text/plain", token.encode())

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token", "") not in self.server.tokens:  # type: ignore[attr-defined]
            self._say(401, "text/plain", b"")
            return
        iid = self.server.instance_id  # type: ignore[attr-defined]
        if self.path == "/latest/meta-data/instance-id":
            self._say(200, "text/plain", iid.encode())
            return
        if self.path == "/latest/meta-data/spot/instance-action":
            notice = self.server.imds.notice(iid)  # type: ignore[attr-defined]
            if notice is not None:
                self._say(200, "application/json", json.dumps(notice).encode())
                return
        self._say(404, "text/plain", b"")

    def _say(self, status: int, kind: str, body: bytes) -> None:
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


Imds.handler = _Handler
