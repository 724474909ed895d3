"""What the daemon's own HTTP servers share (the mesh store, the node API): up or not,
where they serve, a close that stops their thread and frees the port, and the bounds
that keep one caller (a cloud node, less trusted than the controller) from stalling a
service every node needs.

The bounds, per server (:class:`Limits`):

* **Connections.** At most ``connections`` open at once in all, and ``per_caller`` from
  one address (a caller is its mesh address: WireGuard has checked it against the
  node's key). One past either is closed as soon as it is accepted, before a thread or
  a byte is spent on it; the total is the server's descriptor budget, well under the
  unit's ``LimitNOFILE``.
* **Deadlines, whole.** A connection has ``header_seconds`` to send its request line
  and headers (however slowly the bytes come), ``idle_seconds`` between keep-alive
  requests, and then the request's own deadline for its body and its answer
  (``request_seconds``, or what the server grants a large body: its size at a minimum
  rate). A watchdog thread shuts down whatever passes its deadline, so a caller
  trickling a byte every few seconds holds nothing for long; a socket timeout per read
  stays as a second line.
* **Slots.** At most ``slots`` requests are worked on at once, and ``slots_per_caller``
  for one caller, taken only once the request's headers (and, where the server reads
  one first, its small body) are in: a caller that stalls holds a connection, never a
  slot, and one that holds its few slots leaves the rest to the others. Beyond:
  503, at once.

What each caller holds is counted (``held``, ``peak``): the attack tests read them.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    connections: int = 256
    per_caller: int = 16
    slots: int = 64
    slots_per_caller: int = 8
    header_seconds: float = 10.0
    idle_seconds: float = 5.0
    request_seconds: float = 30.0
    read_seconds: float = 10.0  # each read, under the deadlines


class Served:
    """A server the daemon starts while it leads (``ports.ServedStore``); ``listen`` is
    where it asked to serve, ``_httpd`` the server once started."""

    listen: tuple[str, int]
    _httpd: GuardedServer | None = None

    @property
    def up(self) -> bool:
        return self._httpd is not None

    @property
    def address(self) -> tuple[str, int]:
        """Where it serves (the port bound, where ``listen`` asked for any)."""
        if self._httpd is None:
            return self.listen
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def guard(self) -> Guard | None:
        return self._httpd.guard if self._httpd is not None else None

    def close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            httpd.guard.stop()


class Guard:
    """The connections, deadlines and slots of one server (see the module's text)."""

    def __init__(self, limits: Limits, name: str) -> None:
        self.limits = limits
        self.name = name
        self._lock = threading.Lock()
        self._open: dict[int, tuple[socket.socket, str]] = {}  # id(sock) -> (sock, caller)
        self._deadline: dict[int, float] = {}
        self._conns: Counter[str] = Counter()
        self._slots: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()  # the most slots each caller held at once
        self.refused = 0  # connections closed at once, over a budget
        self.expired = 0  # connections shut down past their deadline
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def start(self) -> None:
        """The watchdog, once the server listens (a server that failed to bind leaves
        no thread behind)."""
        if self._watch is None:
            self._watch = threading.Thread(target=self._watchdog, name=f"{self.name}-watchdog",
                                           daemon=True)  # fmt: skip
            self._watch.start()

    # -- connections ---------------------------------------------------------------

    def admit(self, sock: socket.socket, caller: str) -> bool:
        """Whether a new connection from ``caller`` is within the budgets (it is then
        counted, with the header deadline, until :meth:`release`)."""
        with self._lock:
            if len(self._open) >= self.limits.connections or (
                self._conns[caller] >= self.limits.per_caller
            ):
                self.refused += 1
                return False
            self._open[id(sock)] = (sock, caller)
            self._conns[caller] += 1
            self._deadline[id(sock)] = time.monotonic() + self.limits.header_seconds
            return True

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            held = self._open.pop(id(sock), None)
            self._deadline.pop(id(sock), None)
            if held is not None:
                self._conns[held[1]] -= 1
                if not self._conns[held[1]]:
                    del self._conns[held[1]]

    def expect(self, sock: socket.socket, seconds: float) -> None:
        """``sock``'s next deadline: ``seconds`` from now, for all it does until then."""
        with self._lock:
            if id(sock) in self._open:
                self._deadline[id(sock)] = time.monotonic() + seconds

    def connections(self, caller: str | None = None) -> int:
        with self._lock:
            return len(self._open) if caller is None else self._conns[caller]

    # -- slots -------------------------------------------------------------------------

    @contextlib.contextmanager
    def slot(self, caller: str) -> Iterator[bool]:
        """A slot for a request of ``caller`` (True), or none within the limits (False:
        the server answers 503)."""
        with self._lock:
            total = sum(self._slots.values())
            ok = total < self.limits.slots and self._slots[caller] < self.limits.slots_per_caller
            if ok:
                self._slots[caller] += 1
                self.peak[caller] = max(self.peak[caller], self._slots[caller])
        try:
            yield ok
        finally:
            if ok:
                with self._lock:
                    self._slots[caller] -= 1
                    if not self._slots[caller]:
                        del self._slots[caller]

    def held(self, caller: str) -> int:
        with self._lock:
            return self._slots[caller]

    # -- the watchdog ------------------------------------------------------------------

    def _watchdog(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                late = [self._open[k][0] for k, at in self._deadline.items() if at <= now]
                for sock in late:
                    self._deadline.pop(id(sock), None)  # shut down once
            for sock in late:
                self.expired += 1
                with contextlib.suppress(OSError):  # it ended meanwhile
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stop.set()


class GuardedServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server whose connections a :class:`Guard` admits and watches."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: Any, guard: Guard, *,
                 bind_and_activate: bool = True) -> None:  # fmt: skip
        self.guard = guard
        super().__init__(address, handler, bind_and_activate)

    def server_activate(self) -> None:
        super().server_activate()
        self.guard.start()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.guard.admit(request, str(client_address[0]))

    def shutdown_request(self, request: Any) -> None:
        self.guard.release(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed past the handler's own answers: logged with its
        traceback, never printed; a connection the watchdog shut down is no error."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | ValueError) and not isinstance(exc, FileNotFoundError):
            log.debug("%s.connection_ended client=%s error=%s", self.guard.name,
                      client_address[0], exc)  # fmt: skip
            return
        log.error("%s.request_failed client=%s", self.guard.name, client_address[0],
                  exc_info=True)  # fmt: skip


class GuardedHandler(http.server.BaseHTTPRequestHandler):
    """A handler under its server's guard: per-read timeouts, whole deadlines for the
    headers and between requests, and :meth:`slot` for the work."""

    server: GuardedServer
    _requests = 0

    @property
    def caller(self) -> str:
        return str(self.client_address[0])

    def setup(self) -> None:
        self.request.settimeout(self.server.guard.limits.read_seconds)
        super().setup()

    def handle_one_request(self) -> None:
        limits = self.server.guard.limits
        if self._requests:  # keep-alive: a while to start the next, then its headers
            self.server.guard.expect(self.request, limits.idle_seconds + limits.header_seconds)
        self._requests += 1
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:  # the headers are in: the request's own deadline from here
            self.server.guard.expect(self.request, self.server.guard.limits.request_seconds)
        return ok

    def extend(self, seconds: float) -> None:
        """This request's deadline, ``seconds`` from now (a large body's transfer)."""
        self.server.guard.expect(self.request, seconds)

    def slot(self) -> contextlib.AbstractContextManager[bool]:
        return self.server.guard.slot(self.caller)
