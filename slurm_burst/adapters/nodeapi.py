"""The node API's HTTP server: the hub's mesh address, the hub interface only.

``GET /v1/peers?endpoint=ADDRESS:PORT`` answers the calling node's direct peers as JSON
(``services.nodeapi.NodeApi.peers``, passed in); ``POST /v1/notice`` takes the node's
interruption notice (``NodeApi.notice``), a JSON body of at most 4 KiB. The caller is
the TCP peer address: the socket is bound to the hub interface (``SO_BINDTODEVICE``),
so every connection came through a WireGuard tunnel, whose source address WireGuard
has checked against the peer's key. Requests are small and bounded: a URL of at most
1 KiB, a sized body of at most 4 KiB read whole before the request takes a slot, and
the connection, deadline and slot bounds of ``adapters.served`` (:data:`LIMITS`), so
that one node cannot stall the API for the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from slurm_burst.adapters.served import Guard, GuardedHandler, GuardedServer, Limits, Served
from slurm_burst.core.mesh import Refused

# the service's answer to GET /v1/peers: (caller's address, its endpoint) -> JSON body
Answer = Callable[[str, str], dict[str, Any]]
# ... and to POST /v1/notice: (caller's address, the request's body) -> JSON body
Told = Callable[[str, bytes], dict[str, Any]]
MAX_BODY = 4096
MAX_URL = 1024
# a node asks every few seconds, one request at a time: a few connections and slots each
LIMITS = Limits(connections=512, per_caller=8, slots=64, slots_per_caller=4,
                header_seconds=5.0, idle_seconds=5.0, request_seconds=10.0,
                read_seconds=5.0)  # fmt: skip

log = logging.getLogger(__name__)


class NodeApiServer(Served):
    """Serves ``peers`` at ``listen`` (host, port), on ``device`` only where given."""

    def __init__(
        self, peers: Answer, listen: tuple[str, int], device: str = "", *,
        notice: Told | None = None, limits: Limits = LIMITS,
    ) -> None:  # fmt: skip
        self.peers = peers
        self.notice = notice
        self.listen = listen
        self.device = device
        self.limits = limits
        self._httpd: GuardedServer | None = None

    def start(self) -> None:
        """Bind and serve in a thread (OSError while the address or device is not here)."""
        if self._httpd is not None:
            return
        guard = Guard(self.limits, "node_api")
        httpd = GuardedServer(self.listen, _Handler, guard, bind_and_activate=False)
        try:
            if self.device:
                httpd.socket.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE,
                                        self.device.encode())  # fmt: skip
            httpd.server_bind()
            httpd.server_activate()
        except OSError:
            httpd.server_close()
            raise
        httpd.owner = self  # type: ignore[attr-defined]
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, name="node-api", daemon=True).start()
        log.info("node_api.serving listen=%s:%d device=%s", *self.address, self.device or "-")


class _Handler(GuardedHandler):
    server_version = "slurm-burst-node-api"
    sys_version = ""

    @property
    def owner(self) -> NodeApiServer:
        return self.server.owner  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("node_api.request %s", format % args)

    def do_GET(self) -> None:
        self._serve(self._peers)

    def do_POST(self) -> None:
        try:  # the whole (small) body first: a caller that trickles it holds no slot
            body = self._body()
        except Refused as exc:
            self._answer(exc.status, {"error": str(exc)})
            return
        except (OSError, ValueError):  # cut off, or past its deadline: nothing to answer
            self.close_connection = True
            return
        self._serve(lambda: self._notice(body))

    def _serve(self, handle: Callable[[], dict[str, Any]]) -> None:
        """One request within the caller's and the server's slots; a refusal answered
        with its status."""
        status, said = 503, {"error": "busy"}
        with self.slot() as ok:
            if ok:
                try:
                    status, said = 200, handle()
                except Refused as exc:
                    status, said = exc.status, {"error": str(exc)}
        # answered once the slot is free again: a caller that asks again as soon as it
        # has the answer (a node agent's next poll) never finds its last request still
        # holding a slot, however late this thread runs on a loaded controller
        self._answer(status, said)

    def _peers(self) -> dict[str, Any]:
        url = urlsplit(self.path[: MAX_URL + 1])
        if len(self.path) > MAX_URL or url.path != "/v1/peers":
            raise Refused(404, "no such resource")
        endpoint = parse_qs(url.query).get("endpoint", [""])[0]
        return self.owner.peers(self.client_address[0], endpoint)

    def _body(self) -> bytes:
        if self.path != "/v1/notice" or self.owner.notice is None:
            raise Refused(404, "no such resource")
        size = self.headers.get("Content-Length", "")
        if not (size.isascii() and size.isdigit()) or int(size) > MAX_BODY:
            raise Refused(413, f"a body of at most {MAX_BODY} bytes, sized")
        body = self.rfile.read(int(size))
        if len(body) != int(size):
            raise ValueError("the body was cut off")
        return body

    def _notice(self, body: bytes) -> dict[str, Any]:
        told = self.owner.notice
        assert told is not None  # _body checked
        return told(self.client_address[0], body)

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        with contextlib.suppress(OSError):  # the node went away: nothing to tell it
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
